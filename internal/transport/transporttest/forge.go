// Package transporttest sends raft requests to a node as any holder of a
// cluster identity could, for tests of what the node refuses. Only tests
// import it.
package transporttest

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/hashicorp/yamux"
)

// Forge returns a raft NetworkTransport whose requests go, as streams of
// raft group group, to the node that dial reaches: dial opens a ProtoRaft
// connection as some identity, the forger runs a yamux client session over
// it (dialed again once closed) and starts each stream with the group's
// stream header, as a RaftMux does. local is the transport's LocalAddr.
// Cleanup closes it.
func Forge(t testing.TB, dial func(context.Context) (net.Conn, error), group string, local net.Addr) *raft.NetworkTransport {
	t.Helper()
	f := &forger{dial: dial, group: group, local: local, done: make(chan struct{})}
	nt := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: f, MaxPool: 1, Timeout: 5 * time.Second,
		Logger: hclog.NewNullLogger()})
	t.Cleanup(func() { nt.Close() })
	return nt
}

// forger is the raft.StreamLayer of Forge.
type forger struct {
	dial  func(context.Context) (net.Conn, error)
	group string
	local net.Addr
	done  chan struct{}

	mu   sync.Mutex
	sess *yamux.Session // guarded by mu
}

var _ raft.StreamLayer = (*forger)(nil)

func (f *forger) Dial(_ raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sess == nil || f.sess.IsClosed() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		c, err := f.dial(ctx)
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
	// The raft stream header: [uvarint n][group id, n bytes].
	if _, err := st.Write(append(binary.AppendUvarint(nil, uint64(len(f.group))), f.group...)); err != nil {
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

func (f *forger) Addr() net.Addr { return f.local }
