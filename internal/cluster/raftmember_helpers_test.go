//lint:file-ignore SA1019 raft v1.7.3 still sends the deprecated Leader and Candidate, and the codec handle raft uses, which these tests forge

package cluster

import (
	"context"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/hashicorp/yamux"

	"github.com/zeze-go/mq/internal/metastate"
	"github.com/zeze-go/mq/internal/transport"
)

// forger is a raft.StreamLayer that dials, as its own transport's node
// (which holds the cluster secret), streams of the metadata group to the
// node at addr: raft's NetworkTransport over it sends forged requests.
type forger struct {
	tr   *transport.Transport
	addr string
	done chan struct{}

	mu   sync.Mutex
	sess *yamux.Session // guarded by mu
}

// forgeMeta returns a NetworkTransport that sends, as node id, requests of
// the metadata group to the node at addr; Cleanup closes it.
func forgeMeta(t testing.TB, id, addr string) *raft.NetworkTransport {
	t.Helper()
	tr, err := transport.Listen(transport.Config{NodeID: id, Bind: "127.0.0.1:0", Secret: testSecret, InsecurePlaintext: true})
	if err != nil {
		t.Fatal(err)
	}
	f := &forger{tr: tr, addr: addr, done: make(chan struct{})}
	nt := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: f, MaxPool: 1, Timeout: 5 * time.Second,
		Logger: hclog.NewNullLogger()})
	t.Cleanup(func() {
		nt.Close()
		tr.Close()
	})
	return nt
}

func (f *forger) Dial(_ raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sess == nil || f.sess.IsClosed() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		c, err := f.tr.Dial(ctx, f.addr, transport.ProtoRaft)
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
	if _, err := st.Write(append([]byte{byte(len(metaGroup))}, metaGroup...)); err != nil { // the stream header
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

func (f *forger) Addr() net.Addr { return f.tr.Addr() }

// raftStat is r's statistic name as a number.
func raftStat(t testing.TB, r *raft.Raft, name string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(r.Stats()[name], 10, 64)
	if err != nil {
		t.Fatalf("raft stat %s: %v", name, err)
	}
	return v
}

// forgedSetACL is an AppendEntries, in the name of node as, that would
// append and commit at m's next index, in its term, a SetACL giving as
// every right on every topic.
func forgedSetACL(t testing.TB, m *Meta, as string) *raft.AppendEntriesRequest {
	t.Helper()
	cmd, err := metastate.EncodeCommand(metastate.SetACL{Rules: []metastate.Rule{{Identity: as, Topic: "*",
		Rights: metastate.RightAdmin | metastate.RightProduce | metastate.RightConsume}}})
	if err != nil {
		t.Fatal(err)
	}
	last, lastTerm, term := m.raft.LastIndex(), raftStat(t, m.raft, "last_log_term"), raftStat(t, m.raft, "term")
	return &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(as), Addr: []byte(as)},
		Term:      term, Leader: []byte(as), PrevLogEntry: last, PrevLogTerm: lastTerm, LeaderCommitIndex: last + 1,
		Entries: []*raft.Log{{Index: last + 1, Term: term, Type: raft.LogCommand, Data: cmd}},
	}
}
