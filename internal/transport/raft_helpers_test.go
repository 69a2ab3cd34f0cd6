//lint:file-ignore SA1019 raft v1.7.3 still sends the deprecated Leader and Candidate, and the codec handle raft uses, which these tests forge

package transport

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"
	"github.com/hashicorp/yamux"
)

// anyone is a LayerConfig.Member that takes every authenticated peer.
func anyone(string) bool { return true }

// only is a LayerConfig.Member that takes the nodes ids.
func only(ids ...string) func(string) bool {
	return func(peer string) bool {
		for _, id := range ids {
			if id == peer {
				return true
			}
		}
		return false
	}
}

// header is the RPCHeader raft v1.7.3 sends from node id over a RaftMux.
func header(id string) raft.RPCHeader {
	return raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(id), Addr: []byte(id)}
}

// encodeRPC is a raft request as raft's NetworkTransport writes it: its
// type byte, then the request in msgpack; snapshot follows an
// InstallSnapshot.
func encodeRPC(t testing.TB, typ byte, req any, snapshot []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	b.WriteByte(typ)
	enc := codec.NewEncoder(&b, &codec.MsgpackHandle{BasicHandle: codec.BasicHandle{TimeNotBuiltin: true}})
	if err := enc.Encode(req); err != nil {
		t.Fatal(err)
	}
	b.Write(snapshot)
	return b.Bytes()
}

// validRPCs are a request of each type from node id, as raft sends them.
func validRPCs(t testing.TB, id string) [][]byte {
	t.Helper()
	snap := []byte("the snapshot's bytes")
	return [][]byte{
		encodeRPC(t, 0, &raft.AppendEntriesRequest{RPCHeader: header(id), Term: 3, Leader: []byte(id), PrevLogEntry: 9, PrevLogTerm: 2,
			Entries: []*raft.Log{
				{Index: 10, Term: 3, Type: raft.LogCommand, Data: []byte("data"), AppendedAt: time.Unix(1700000000, 5)},
				{Index: 11, Term: 3, Type: raft.LogCommand, Data: bytes.Repeat([]byte("x"), 70000), Extensions: []byte{1}},
			}, LeaderCommitIndex: 9}, nil),
		encodeRPC(t, 0, &raft.AppendEntriesRequest{RPCHeader: header(id), Term: 3, Leader: []byte(id)}, nil), // a heartbeat
		encodeRPC(t, 1, &raft.RequestVoteRequest{RPCHeader: header(id), Term: 4, Candidate: []byte(id), LastLogIndex: 11, LastLogTerm: 3}, nil),
		encodeRPC(t, 2, &raft.InstallSnapshotRequest{RPCHeader: header(id), SnapshotVersion: 1, Term: 4, Leader: []byte(id),
			LastLogIndex: 11, LastLogTerm: 3, Configuration: []byte("config"), ConfigurationIndex: 1, Size: int64(len(snap))}, snap),
		encodeRPC(t, 3, &raft.TimeoutNowRequest{RPCHeader: header(id)}, nil),
		encodeRPC(t, 4, &raft.RequestPreVoteRequest{RPCHeader: header(id), Term: 5, LastLogIndex: 11, LastLogTerm: 3}, nil),
	}
}

// sender is who a request says sent it.
type sender struct{ id, addr, leader, candidate string }

// is reports whether every field of s names node id, Leader and
// Candidate being optional.
func (s sender) is(id string) bool {
	return s.id == id && s.addr == id && (s.leader == "" || s.leader == id) && (s.candidate == "" || s.candidate == id)
}

// decodeRPCs decodes b as raft's NetworkTransport does, request after
// request, and returns the senders of those it decoded whole.
func decodeRPCs(b []byte) []sender {
	r := bufio.NewReader(bytes.NewReader(b))
	dec := codec.NewDecoder(r, &codec.MsgpackHandle{})
	var out []sender
	for {
		typ, err := r.ReadByte()
		if err != nil {
			return out
		}
		var s sender
		switch typ {
		case 0:
			var req raft.AppendEntriesRequest
			err = dec.Decode(&req)
			s = sender{string(req.ID), string(req.Addr), string(req.Leader), ""}
		case 1:
			var req raft.RequestVoteRequest
			err = dec.Decode(&req)
			s = sender{string(req.ID), string(req.Addr), "", string(req.Candidate)}
		case 2:
			var req raft.InstallSnapshotRequest
			err = dec.Decode(&req)
			s = sender{string(req.ID), string(req.Addr), string(req.Leader), ""}
			if err == nil {
				_, err = io.Copy(io.Discard, io.LimitReader(r, req.Size))
			}
		case 3:
			var req raft.TimeoutNowRequest
			err = dec.Decode(&req)
			s = sender{string(req.ID), string(req.Addr), "", ""}
		case 4:
			var req raft.RequestPreVoteRequest
			err = dec.Decode(&req)
			s = sender{string(req.ID), string(req.Addr), "", ""}
		default:
			err = errors.New("unknown type")
		}
		if err != nil {
			return out
		}
		out = append(out, s)
	}
}

// forger is a raft.StreamLayer that dials, as its own transport's node
// (authenticated: it holds the cluster's secret), to the node at addr,
// streams of group: raft's NetworkTransport over it sends the requests a
// test forges, as any holder of the secret or of a CA certificate could.
type forger struct {
	tr    *Transport
	addr  string
	group string
	done  chan struct{}

	mu   sync.Mutex
	sess *yamux.Session // guarded by mu
}

var _ raft.StreamLayer = (*forger)(nil)

// forge returns a NetworkTransport that sends, as node id, requests of
// group to n; Cleanup closes it.
func forge(t testing.TB, id string, n *node, group string) *raft.NetworkTransport {
	t.Helper()
	f := &forger{tr: listen(t, Config{NodeID: id}), addr: n.t.Addr().String(), group: group, done: make(chan struct{})}
	nt := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: f, MaxPool: 1, Timeout: 5 * time.Second,
		Logger: hclog.NewNullLogger()})
	t.Cleanup(func() { nt.Close() })
	return nt
}

func (f *forger) Dial(_ raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sess == nil || f.sess.IsClosed() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		c, err := f.tr.Dial(ctx, f.addr, ProtoRaft)
		if err != nil {
			return nil, err
		}
		cfg := yamux.DefaultConfig()
		cfg.LogOutput = io.Discard
		if f.sess, err = yamux.Client(c, cfg); err != nil {
			return nil, err
		}
	}
	st, err := f.sess.Open()
	if err != nil {
		return nil, err
	}
	if _, err := st.Write(appendStreamHeader(nil, f.group)); err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}

func (f *forger) Accept() (net.Conn, error) {
	<-f.done
	return nil, net.ErrClosed
}

func (f *forger) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.done:
	default:
		close(f.done)
	}
	if f.sess != nil {
		f.sess.Close()
	}
	return nil
}

func (f *forger) Addr() net.Addr { return nodeAddr(f.tr.NodeID()) }

// has reports whether f applied cmd.
func (f *countFSM) has(cmd string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.seen[cmd]
	return ok
}

// raftStat is r's statistic name as a number.
func raftStat(t testing.TB, r *raft.Raft, name string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(r.Stats()[name], 10, 64)
	if err != nil {
		t.Fatalf("raft stat %s: %v", name, err)
	}
	return v
}

// forgedAppend is an AppendEntries that would append and commit cmd on
// follower m at its next index, in its current term, sent as node as.
func forgedAppend(t testing.TB, m *member, as, cmd string) *raft.AppendEntriesRequest {
	t.Helper()
	last, lastTerm, term := m.r.LastIndex(), raftStat(t, m.r, "last_log_term"), raftStat(t, m.r, "term")
	return &raft.AppendEntriesRequest{RPCHeader: header(as), Term: term, Leader: []byte(as),
		PrevLogEntry: last, PrevLogTerm: lastTerm, LeaderCommitIndex: last + 1,
		Entries: []*raft.Log{{Index: last + 1, Term: term, Type: raft.LogCommand, Data: []byte(cmd)}}}
}
