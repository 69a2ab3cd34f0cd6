package remote

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/internal/transport"
	"github.com/zeze-go/mq/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var secret = []byte("9c1f4e7a2b8d3f60e5a1c7b4d2f8e0a36b9c5d1e7f3a0b2c")

// patience bounds every wait for something that must happen.
const patience = 20 * time.Second

// newTransport listens on 127.0.0.1:0 as node id.
func newTransport(t testing.TB, id string, frame int) *transport.Transport {
	t.Helper()
	return listen(t, transport.Config{NodeID: id, MaxFrameBytes: frame, InsecurePlaintext: true})
}

// listen starts a transport of cfg on 127.0.0.1:0 with the test secret;
// Cleanup closes it.
func listen(t testing.TB, cfg transport.Config) *transport.Transport {
	t.Helper()
	cfg.Bind, cfg.Secret = "127.0.0.1:0", secret
	tr, err := transport.Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tr.Close(); err != nil {
			t.Errorf("transport Close: %v", err)
		}
	})
	return tr
}

// node is a server node and a client node, connected.
type node struct {
	t      testing.TB
	srvTr  *transport.Transport
	cliTr  *transport.Transport
	scfg   ServerConfig
	mu     sync.Mutex
	srv    *Server // guarded by mu
	setup  func(*Server)
	client *Client
	dials  int // guarded by mu
	frame  int
}

// newNode starts a server (handlers registered by setup) on its own
// transport, and a client of it on another. Cleanup closes both.
func newNode(t testing.TB, scfg ServerConfig, ccfg ClientConfig, setup func(*Server)) *node {
	t.Helper()
	n := &node{t: t, scfg: scfg, setup: setup, frame: scfg.MaxFrameBytes}
	n.srvTr = newTransport(t, "server", scfg.MaxFrameBytes)
	n.cliTr = newTransport(t, "client", scfg.MaxFrameBytes)
	n.start()
	n.client = NewClient(func(ctx context.Context) (*transport.Conn, error) {
		n.mu.Lock()
		n.dials++
		n.mu.Unlock()
		c, err := n.cliTr.Dial(ctx, n.srvTr.Addr().String(), transport.ProtoRPC)
		if err != nil {
			return nil, err
		}
		if c.PeerID() != "server" {
			c.Close()
			return nil, fmt.Errorf("peer %q", c.PeerID())
		}
		return c, nil
	}, ccfg)
	t.Cleanup(func() {
		n.client.Close()
		n.stop()
	})
	return n
}

// start starts the server on the server transport's RPC listener.
func (n *node) start() {
	n.t.Helper()
	l, err := n.srvTr.Listener(transport.ProtoRPC)
	if err != nil {
		n.t.Fatal(err)
	}
	s := NewServer(l, n.scfg)
	if n.setup != nil {
		n.setup(s)
	}
	n.mu.Lock()
	n.srv = s
	n.mu.Unlock()
}

// running is the number of requests the server's handlers run.
func (n *node) running() int {
	n.mu.Lock()
	s := n.srv
	n.mu.Unlock()
	s.mu.RLock()
	defer s.mu.RUnlock()
	total := 0
	for sc := range s.conns {
		sc.mu.Lock()
		total += len(sc.running)
		sc.mu.Unlock()
	}
	return total
}

// stop closes the server (and with it its listener).
func (n *node) stop() {
	n.mu.Lock()
	s := n.srv
	n.mu.Unlock()
	s.Close()
}

// dial returns a raw authenticated connection to the server.
func (n *node) dial() *transport.Conn {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	c, err := n.cliTr.Dial(ctx, n.srvTr.Addr().String(), transport.ProtoRPC)
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { c.Close() })
	return c
}

// served is a store partition served by a node, reached by a remote
// Partition: what the conformance suite tests.
type served struct {
	*Partition
	n  *node
	sp *store.Partition
}

// Close closes the remote handle, then the client and the server, then the
// store, so that the suite can open the data again.
func (s *served) Close() error {
	err := s.Partition.Close()
	s.n.client.Close()
	s.n.stop()
	if serr := s.sp.Close(); err == nil {
		err = serr
	}
	return err
}

// serve opens the store in dir and serves it as partition 0 of "t", as
// wrap makes it (nil: as it is).
func serve(t testing.TB, dir string, wrap func(*store.Partition) partition.Partition, pcfg PartitionConfig) *served {
	t.Helper()
	sp, err := store.Open(filepath.Join(dir, "0.db"), store.Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	var pp partition.Partition = sp
	if wrap != nil {
		pp = wrap(sp)
	}
	n := newNode(t, ServerConfig{}, ClientConfig{}, func(s *Server) {
		ServePartitions(s, func(topic string, index int) (partition.Partition, error) {
			if topic != "t" || index != 0 {
				return nil, fmt.Errorf("%w: %s/%d", errNoPartition, topic, index)
			}
			return pp, nil
		}, nil)
	})
	return &served{Partition: NewPartition(n.client, "t", 0, pcfg), n: n, sp: sp}
}

var errNoPartition = errors.New("test: no such partition")

func init() { RegisterError(FirstUserCode, errNoPartition) }

// ctxT is a context that ends with patience.
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond until it holds, failing t after patience.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not after %v", what, patience)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
