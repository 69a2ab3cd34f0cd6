package delivery

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/partition/fake"
	"github.com/zeze-go/mq/store"
)

// stamped is a fake partition behind a proposer that stamps Now, as the
// node's partitions are.
type stamped struct{ *fake.Partition }

func (s stamped) Apply(ctx context.Context, cmd *store.Command) (store.Result, error) {
	cmd.Now = time.Now().UnixNano()
	return s.Partition.Apply(ctx, cmd)
}

// table is a topic table of fake partitions, shared by the engines of a
// test as the nodes of a cluster would share them.
type table struct {
	mu     sync.Mutex
	topics map[string][]Partition
}

func (t *table) add(name string, n int) []*fake.Partition {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*fake.Partition
	var parts []Partition
	for range n {
		p := fake.New()
		out = append(out, p)
		parts = append(parts, stamped{p})
	}
	t.topics[name] = parts
	return out
}

func (t *table) Partitions(topic string) ([]Partition, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	parts, ok := t.topics[topic]
	if !ok {
		return nil, fmt.Errorf("no topic %s", topic)
	}
	return parts, nil
}

func (t *table) EnsureSystem(_ context.Context, name string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.topics[name]; !ok {
		t.topics[name] = []Partition{stamped{fake.New()}}
	}
	return nil
}

func newTable() *table { return &table{topics: map[string][]Partition{}} }

type sysClock struct{}

func (sysClock) Now() time.Time { return time.Now() }

func (sysClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

func newEngine(t *testing.T, tb *table) *Engine { return newEngineWith(t, tb, nil) }

func newEngineWith(t *testing.T, tb *table, coord Coordinator) *Engine {
	e := New(tb, sysClock{}, slog.New(slog.NewTextHandler(io.Discard, nil)), coord)
	t.Cleanup(e.Close)
	return e
}

func testConfig() Config {
	return Config{Ladder: []time.Duration{time.Millisecond}, MaxReconsume: 3, Batch: 16, BatchBytes: 1 << 20}
}

func send(t *testing.T, p *fake.Partition, from, n int) {
	t.Helper()
	cmd := store.Command{Op: store.OpAppend, Now: time.Now().UnixNano()}
	for i := from; i < from+n; i++ {
		cmd.Msgs = append(cmd.Msgs, store.Message{ID: strconv.Itoa(i), Body: []byte(strconv.Itoa(i))})
	}
	if _, err := p.Apply(context.Background(), &cmd); err != nil {
		t.Fatal(err)
	}
}

// log records what each consumer was handed, in order.
type log struct {
	mu  sync.Mutex
	got map[string][]uint64
	all chan uint64
}

func (l *log) handler(name string, gate <-chan struct{}) Handler {
	return func(ctx context.Context, d *Delivery) error {
		if gate != nil {
			select {
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		l.mu.Lock()
		l.got[name] = append(l.got[name], d.Offset)
		l.mu.Unlock()
		l.all <- d.Offset
		return nil
	}
}

func (l *log) of(name string) []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]uint64(nil), l.got[name]...)
}

// waitFor reads offsets from l.all until every offset in [from, to) was
// seen.
func (l *log) waitFor(t *testing.T, from, to uint64) {
	t.Helper()
	seen := map[uint64]bool{}
	deadline := time.After(10 * time.Second)
	for uint64(len(seen)) < to-from {
		select {
		case off := <-l.all:
			if off >= from && off < to {
				seen[off] = true
			}
		case <-deadline:
			t.Fatalf("only %d of the offsets [%d, %d) delivered", len(seen), from, to)
		}
	}
}

func newLog() *log { return &log{got: map[string][]uint64{}, all: make(chan uint64, 1<<16)} }

func committed(t *testing.T, p *fake.Partition, group string) store.GroupState {
	t.Helper()
	gs, _, err := p.Group(group)
	if err != nil {
		t.Fatal(err)
	}
	return gs
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// leased is the Local coordinator with a lease, as a cluster's is: it
// gives every consumer of the node every partition (one consumer), so two
// nodes with it disagree, as a node cut from the metadata group and the new
// owner do.
type leased struct {
	Local
	lease time.Duration
}

func (l leased) Lease() time.Duration { return l.lease }

// sendTagged appends n messages; those whose index is in tagged carry tag T.
func sendTagged(t *testing.T, p interface {
	Apply(context.Context, *store.Command) (store.Result, error)
}, n int, tagged map[int]bool) {
	t.Helper()
	cmd := store.Command{Op: store.OpAppend, Now: time.Now().UnixNano()}
	for i := 0; i < n; i++ {
		m := store.Message{ID: "tagged-" + strconv.Itoa(i), Key: "k", Body: []byte(strconv.Itoa(i))}
		if tagged[i] {
			m.Tags = []string{"T"}
		}
		cmd.Msgs = append(cmd.Msgs, m)
	}
	if _, err := p.Apply(context.Background(), &cmd); err != nil {
		t.Fatal(err)
	}
}
