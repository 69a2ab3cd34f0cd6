package txn

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq/internal/partition/fake"
	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/store"
)

// oneTopic is a node's topic table of one partition, stamping commands as
// the node's partitions do.
type oneTopic struct{ p *fake.Partition }

func (o oneTopic) Topics() map[string]int                   { return map[string]int{"t": 1} }
func (o oneTopic) Partition(string, int) (Partition, error) { return o, nil }
func (o oneTopic) HalfTxs(fn func(store.HalfTx) bool) error { return o.p.HalfTxs(fn) }
func (o oneTopic) Decision(txid string) (store.Decision, error) {
	return o.p.Decision(txid)
}
func (o oneTopic) Apply(ctx context.Context, cmd *store.Command) (store.Result, error) {
	if cmd.Now == 0 {
		cmd.Now = time.Now().UnixNano()
	}
	return o.p.Apply(ctx, cmd)
}

type wallClock struct{}

func (wallClock) Now() time.Time                         { return time.Now() }
func (wallClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// TestSweep_Owner: nodes sharing a host store's tables publish only their
// own transactions' markers (and those without an owner); a standalone node
// publishes every one.
func TestSweep_Owner(t *testing.T) {
	ctx := context.Background()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "host.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	host, err := localtx.NewBolt(db, localtx.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Committed transactions whose publication never happened (a crash
	// after the host's commit), one per owner.
	write := func(txid string, marker []byte) {
		t.Helper()
		err := host.Run(ctx, func(ctx context.Context) error {
			tx, _ := localtx.FromContext(ctx)
			if err := tx.Put(localtx.MarkerBucket, []byte(txid), marker); err != nil {
				return err
			}
			row := encodeOutboxRow(Ref{Topic: "t"}, &store.Message{ID: txid, Body: []byte(txid)})
			return tx.Put(localtx.OutboxBucket, localtx.OutboxKey(txid, 0), row)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	write("tx-a", encodeMarker("a", nil))
	write("tx-b", encodeMarker("b", nil))
	write("tx-any", []byte("ZMQM\x02\x00")) // version 2: no owner

	published := func(p *fake.Partition) map[string]bool {
		t.Helper()
		out := map[string]bool{}
		msgs, err := p.Fetch(ctx, 0, 100, 1<<20, nil)
		if err != nil && p.Stats().Next > 0 {
			t.Fatal(err)
		}
		for _, m := range msgs {
			out[m.ID] = true
		}
		return out
	}
	sweepAs := func(id string) map[string]bool {
		t.Helper()
		p := fake.New()
		n := New(Config{NodeID: id, CheckAfter: time.Second, MaxChecks: 3, Stores: []localtx.Store{host},
			Topics: oneTopic{p}, Prune: NewPruneGuard(), Clock: wallClock{},
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Context: ctx})
		n.sweep(ctx)
		if p.Stats().Next == 0 {
			return map[string]bool{}
		}
		return published(p)
	}
	for _, tc := range []struct {
		node string
		want []string
	}{
		{"a", []string{"tx-a", "tx-any"}},
		{"b", []string{"tx-b", "tx-any"}},
		{"c", []string{"tx-any"}},
		{"", []string{"tx-a", "tx-any", "tx-b"}}, // standalone: its stores are its own
	} {
		t.Run("node="+tc.node, func(t *testing.T) {
			got := sweepAs(tc.node)
			if len(got) != len(tc.want) {
				t.Fatalf("node %q published %v, want %v", tc.node, got, tc.want)
			}
			for _, id := range tc.want {
				if !got[id] {
					t.Fatalf("node %q published %v, want %v", tc.node, got, tc.want)
				}
			}
		})
	}
}
