package storetest_test

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/zeze-go/mq/store"
	"github.com/zeze-go/mq/store/storetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// openStore opens the partition file in dir, with a write-ahead log of its
// own when wal is set.
func openStore(t *testing.T, dir string, wal bool) storetest.Partition {
	t.Helper()
	if !wal {
		p, err := store.Open(filepath.Join(dir, "0.db"), store.Options{})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		return p
	}
	w, err := store.OpenWAL(filepath.Join(dir, "wal"), store.WALOptions{SegmentSize: 1 << 20})
	if err != nil {
		t.Fatalf("OpenWAL: %v", err)
	}
	p, err := store.Open(filepath.Join(dir, "0.db"), store.Options{WAL: w, Stream: "p"})
	if err != nil {
		w.Close()
		t.Fatalf("Open: %v", err)
	}
	if err := w.FinishRecovery(); err != nil {
		p.Close()
		w.Close()
		t.Fatalf("FinishRecovery: %v", err)
	}
	return walPartition{p, w}
}

// walPartition closes its WAL after the partition, so that the data can be
// opened again.
type walPartition struct {
	*store.Partition
	wal *store.WAL
}

func (p walPartition) Close() error {
	err := p.Partition.Close()
	if werr := p.wal.Close(); err == nil {
		err = werr
	}
	return err
}

func TestRun_Store(t *testing.T) {
	t.Run("File", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) storetest.Partition { return openStore(t, t.TempDir(), false) })
	})
	t.Run("WAL", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) storetest.Partition { return openStore(t, t.TempDir(), true) })
	})
}

func TestRunDurable_Store(t *testing.T) {
	t.Run("File", func(t *testing.T) {
		storetest.RunDurable(t, func(t *testing.T, dir string) storetest.Partition { return openStore(t, dir, false) })
	})
	t.Run("WAL", func(t *testing.T) {
		storetest.RunDurable(t, func(t *testing.T, dir string) storetest.Partition { return openStore(t, dir, true) })
	})
}

// replicatedPartition applies each command as the only one of a raft entry
// of its own, as raftqueue's FSM does.
type replicatedPartition struct {
	*store.Partition
	index atomic.Uint64
}

func (p *replicatedPartition) Apply(ctx context.Context, cmd *store.Command) (store.Result, error) {
	at := []store.Position{{Index: p.index.Add(1), Cmds: 1}}
	res, errs, err := p.ApplyLogged(ctx, []*store.Command{cmd}, at)
	if err != nil {
		return store.Result{}, err
	}
	return res[0], errs[0]
}

func openReplicated(t *testing.T, dir string) storetest.Partition {
	t.Helper()
	p, err := store.Open(filepath.Join(dir, "0.db"), store.Options{Replicated: true})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	r := &replicatedPartition{Partition: p}
	r.index.Store(p.Position().Index)
	return r
}

func TestRun_Replicated(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Partition { return openReplicated(t, t.TempDir()) })
}

func TestRunDurable_Replicated(t *testing.T) {
	storetest.RunDurable(t, openReplicated)
}
