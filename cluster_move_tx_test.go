package mq_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/localtx/txtest"
)

// TestCluster_MoveSingleCarriesTransactions: half messages prepared on s/0 before it moves
// are published once by a commit after the move, and those of a
// transaction that never committed are never published.
func TestCluster_MoveSingleCarriesTransactions(t *testing.T) {
	host := txtest.Open(t, "bolt", filepath.Join(t.TempDir(), "host"))
	c := newCluster(t, 3, withSession(3*time.Second), withTopic("s", 1, mq.Options{}), withNodeOptions(func(id string) []mq.Option {
		opts := []mq.Option{mq.WithTxCheckAfter(time.Second)}
		if id == "n3" {
			opts = append(opts, mq.WithLocalTx(host.Store))
		}
		return opts
	}))
	n3 := c.nodes["n3"]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	from, _ := singleOwner(n3, "s", 0)
	if from == "n3" { // the host's node prepares; the partition moves between two others
		if err := n3.MoveReplica(ctx, "s", 0, "n3", "n1"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Minute, "s/0 on n1", func() bool {
			o, m := singleOwner(n3, "s", 0)
			return o == "n1" && m == ""
		})
		from = "n1"
	}
	to := othersThan(c, from, "n3")[0]
	p, err := n3.NewProducer("s")
	if err != nil {
		t.Fatal(err)
	}
	const rolledBack = "0123456789abcdef-77"
	if err := p.PrepareMessage(localtx.WithTx(ctx, &fakeTx{id: rolledBack}), msgs("rp", 3)...); err != nil {
		t.Fatal(err)
	}
	err = host.Run(ctx, func(ctx context.Context) error {
		real, _ := localtx.FromContext(ctx)
		fctx := localtx.WithTx(ctx, &fakeTx{id: real.ID(), put: real.Put})
		if err := p.PrepareMessage(fctx, msgs("cp", 3)...); err != nil {
			return err
		}
		if err := n3.MoveReplica(ctx, "s", 0, from, to); err != nil {
			return err
		}
		deadline := time.Now().Add(time.Minute)
		for {
			if o, m := singleOwner(n3, "s", 0); o == to && m == "" {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("move not done")
			}
			time.Sleep(10 * time.Millisecond)
		}
		return p.CommitMessage(fctx, msgs("cc", 2)...)
	})
	if err != nil {
		t.Fatal(err)
	}
	col := collect(t, n3, "s", "g")
	waitSeen(t, col, "cp-0", "cp-1", "cp-2", "cc-0", "cc-1")
	time.Sleep(4 * time.Second) // the check-back of the uncommitted one
	for _, id := range []string{"rp-0", "rp-1", "rp-2"} {
		if n := col.count(id); n != 0 {
			t.Errorf("%s of an uncommitted transaction delivered %d times", id, n)
		}
	}
	checkStoredOnce(t, c, "s", 1, []string{"cp-0", "cp-1", "cp-2", "cc-0", "cc-1"})
	seen := readAll(ctx, t, n3, "s", 1)
	for _, id := range []string{"rp-0", "rp-1", "rp-2"} {
		if seen[id] != 0 {
			t.Errorf("%s stored %d times", id, seen[id])
		}
	}
}
