//lint:file-ignore SA1019 raft v1.7.3 still sends the deprecated Leader and Candidate, and the codec handle raft uses, which these tests forge

package transport

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/go-msgpack/v2/codec"
	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/transport/transporttest"
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

// forge returns a NetworkTransport that sends, as node id (authenticated:
// its transport holds the cluster's secret), requests of group to n, as any
// holder of the secret or of a CA certificate could; Cleanup closes it.
func forge(t testing.TB, id string, n *node, group string) *raft.NetworkTransport {
	t.Helper()
	tr, addr := listen(t, Config{NodeID: id}), n.t.Addr().String()
	return transporttest.Forge(t, func(ctx context.Context) (net.Conn, error) { return tr.Dial(ctx, addr, ProtoRaft) },
		group, nodeAddr(id))
}

// has reports whether f applied cmd.
func (f *countFSM) has(cmd string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.seen[cmd]
	return ok
}

// raftStat is r's statistic name as a number.
var raftStat = transporttest.RaftStat

// forgedAppend is an AppendEntries that would append and commit cmd on
// follower m at its next index, in its current term, sent as node as.
func forgedAppend(t testing.TB, m *member, as, cmd string) *raft.AppendEntriesRequest {
	t.Helper()
	return transporttest.NextAppend(t, m.r, as, []byte(cmd))
}
