package cluster

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/remote"
	"github.com/zeze-go/mq/internal/transport"
	"github.com/zeze-go/mq/store"
)

// outsider is an identity that knows the cluster secret but is no node of
// the cluster: in InsecurePlaintext mode it claims any id. Its port serves
// the RPC protocol, so that a dial-back to it succeeds, but answers no op.
type outsider struct {
	tr  *transport.Transport
	ln  net.Listener
	wg  sync.WaitGroup
	cli map[string]*remote.Client // by address
}

// newOutsider listens on 127.0.0.1 as id; everything is closed when the
// test ends.
func newOutsider(t testing.TB, id string) *outsider {
	t.Helper()
	return outsiderOn(t, transport.Config{NodeID: id, InsecurePlaintext: true})
}

// outsiderOn is an outsider on a transport of cfg, listening on 127.0.0.1
// with the cluster secret.
func outsiderOn(t testing.TB, cfg transport.Config) *outsider {
	t.Helper()
	cfg.Bind, cfg.Secret, cfg.Logger = "127.0.0.1:0", testSecret, discardLogger()
	tr, err := transport.Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	o := &outsider{tr: tr, cli: map[string]*remote.Client{}}
	if o.ln, err = tr.Listener(transport.ProtoRPC); err != nil {
		t.Fatal(err)
	}
	o.wg.Go(func() {
		for {
			c, err := o.ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	})
	t.Cleanup(func() {
		for _, c := range o.cli {
			c.Close()
		}
		o.ln.Close()
		tr.Close()
		o.wg.Wait()
	})
	return o
}

// Addr is where the outsider listens.
func (o *outsider) Addr() string { return o.tr.Addr().String() }

// call calls op at the node listening at addr.
func (o *outsider) call(addr string, op uint16, req []byte) ([]byte, error) {
	c, ok := o.cli[addr]
	if !ok {
		c = remote.NewClient(func(ctx context.Context) (*transport.Conn, error) {
			return o.tr.Dial(ctx, addr, transport.ProtoRPC)
		}, remote.ClientConfig{})
		o.cli[addr] = c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.Call(ctx, op, req)
}

// logBuffer is a logger's output, safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// count returns how many lines hold every one of parts.
func (l *logBuffer) count(parts ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for line := range strings.SplitSeq(l.b.String(), "\n") {
		all := line != ""
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			n++
		}
	}
	return n
}

// startLogged starts agent id of a, as agents.start does, logging to a
// buffer it returns, and answering check-backs with checkTx.
func (a *agents) startLogged(id string, checkTx func(context.Context, string, []PartRef) (store.Decision, error), seeds ...string) (*Agent, *logBuffer) {
	a.t.Helper()
	logs := &logBuffer{}
	dir := filepath.Join(a.t.TempDir(), id)
	a.dirs[id] = dir
	ag, err := OpenAgent(AgentConfig{ID: id, Dir: dir, Bind: "127.0.0.1:0", Seeds: seeds, Bootstrap: len(seeds) == 0, Secret: testSecret, InsecurePlaintext: true,
		SessionTimeout: time.Second, HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: agentElection,
		LeaderLeaseTimeout: 100 * time.Millisecond, Partitions: noPartitions, CheckTx: checkTx,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		a.t.Fatalf("open agent %s: %v", id, err)
	}
	a.all[id] = ag
	a.t.Cleanup(func() { ag.Close() })
	return ag, logs
}
