package replica

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/remote"
	"github.com/zeze-go/mq/internal/transport"
	"github.com/zeze-go/mq/raftqueue"
	"github.com/zeze-go/mq/store"
)

// TestPairs_Attach: the partitions of a chunk share one Pair (one replica
// opened once, one record: an Update through any of them is seen by all);
// the replica closes with the last partition's Close, and a partition
// closed twice releases once; the pair's own partition numbers route each
// partition to its own file.
func TestPairs_Attach(t *testing.T) {
	dir := t.TempDir()
	var ps Pairs
	var opened atomic.Int32
	cfg := PairConfig{Topic: "d", First: 4, Self: "a",
		Open: func() (*raftqueue.Pair, error) {
			opened.Add(1)
			return raftqueue.OpenPair(raftqueue.PairConfig{Dir: dir, Partitions: 2})
		},
		SetInSync:  func(context.Context, PairRecord, []string) error { return nil },
		RenewEpoch: func(context.Context, PairRecord) error { return nil }}
	rec := PairRecord{Replicas: []string{"a"}, Epoch: 1, Version: 1, InSync: []string{"a"}, Alone: true}
	var parts []*Partition
	for i := range 2 {
		p := ps.Attach(cfg, rec)
		parts = append(parts, NewDoubleWrite(DoubleWriteConfig{Config: Config{Topic: "d", Index: 4 + i, First: 4, Self: "a"}}, p))
	}
	if parts[0].Pair() != parts[1].Pair() || opened.Load() != 1 {
		t.Fatalf("two partitions of a chunk: pairs %p %p, replica opened %d times", parts[0].Pair(), parts[1].Pair(), opened.Load())
	}
	other := ps.Attach(PairConfig{Topic: "d", First: 6, Self: "b"}, PairRecord{Replicas: []string{"a"}})
	if other == parts[0].Pair() {
		t.Fatal("another chunk shares the pair")
	}
	if err := other.release(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i, d := range parts {
		cmd := &store.Command{Op: store.OpAppend, Msgs: []store.Message{{ID: "m" + string(rune('0'+i)), Body: []byte{byte(i)}}}}
		if _, err := d.Apply(ctx, cmd); err != nil {
			t.Fatalf("partition %d: %v", 4+i, err)
		}
	}
	for i := range 2 {
		sp, err := parts[0].Pair().Replica().Partition(i)
		if err != nil {
			t.Fatal(err)
		}
		if st := sp.Stats(); st.Next != 1 {
			t.Fatalf("pair partition %d holds next offset %d, want 1", i, st.Next)
		}
	}
	// A new record through the chunk's pair reaches both partitions.
	parts[1].Pair().Update(PairRecord{Replicas: []string{"b", "a"}, Epoch: 2, Version: 2, InSync: []string{"b"}})
	if l, _ := parts[0].Pair().leader(); l != "b" {
		t.Fatalf("partition 4 sees leader %q after the Update, want b", l)
	}
	if err := parts[0].Close(); err != nil {
		t.Fatal(err)
	}
	if err := parts[0].Close(); err != nil {
		t.Fatal(err)
	}
	if parts[1].Pair().Replica() == nil {
		t.Fatal("the replica closed while partition 5 still holds the pair")
	}
	if err := parts[1].Close(); err != nil {
		t.Fatal(err)
	}
	if parts[1].Pair().Replica() != nil {
		t.Fatal("the replica is open after its last partition closed")
	}
	if _, err := parts[1].Apply(ctx, &store.Command{Op: store.OpAppend, Msgs: []store.Message{{ID: "x"}}}); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Apply after Close: %v, want store.ErrClosed", err)
	}
	// A new Attach after the last release opens the replica again.
	p := ps.Attach(cfg, rec)
	defer p.release()
	if p == parts[0].Pair() || opened.Load() != 2 {
		t.Fatalf("Attach after the last release: same pair %v, opened %d", p == parts[0].Pair(), opened.Load())
	}
}

// failingLog is a log whose writes fail while fail is set.
type failingLog struct {
	raft.LogStore
	fail *atomic.Bool
}

func (l failingLog) StoreLogs(logs []*raft.Log) error {
	if l.fail.Load() {
		return errors.New("test: input/output error")
	}
	return l.LogStore.StoreLogs(logs)
}

func (l failingLog) StoreLog(e *raft.Log) error { return l.StoreLogs([]*raft.Log{e}) }

// TestPair_HandOff: a leader whose replica failed (its log's write) has
// the metadata promote its follower, in sync and up, with the version of
// the record it read; with the follower out of sync, or its node down, it
// does not (the follower may lack acked entries, or could not serve).
func TestPair_HandOff(t *testing.T) {
	for _, tc := range []struct {
		name   string
		rec    PairRecord
		handed bool
	}{
		{"InSync", PairRecord{Replicas: []string{"a", "b"}, Epoch: 1, Version: 3, InSync: []string{"a", "b"}, FollowerUp: true}, true},
		{"OutOfSync", PairRecord{Replicas: []string{"a", "b"}, Epoch: 1, Version: 3, InSync: []string{"a"}, FollowerUp: true, Alone: true}, false},
		{"FollowerDown", PairRecord{Replicas: []string{"a", "b"}, Epoch: 1, Version: 3, InSync: []string{"a", "b"}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fail atomic.Bool
			handed := make(chan PairRecord, 10)
			unreachable := remote.NewClient(func(context.Context) (*transport.Conn, error) { return nil, errors.New("test: unreachable") }, remote.ClientConfig{})
			defer unreachable.Close()
			var ps Pairs
			dir := t.TempDir()
			p := ps.Attach(PairConfig{Topic: "d", Self: "a",
				Peer: func(string) (*remote.Client, error) { return unreachable, nil },
				Open: func() (*raftqueue.Pair, error) {
					w, err := store.OpenWAL(filepath.Join(dir, "wal"), store.WALOptions{})
					if err != nil {
						return nil, err
					}
					t.Cleanup(func() { w.Close() })
					l, err := raftqueue.OpenWALLog(w, "dw")
					if err == nil {
						err = w.FinishRecovery()
					}
					if err != nil {
						return nil, err
					}
					return raftqueue.OpenPair(raftqueue.PairConfig{Dir: dir, Log: failingLog{l, &fail}})
				},
				SetInSync:  func(context.Context, PairRecord, []string) error { return nil },
				RenewEpoch: func(context.Context, PairRecord) error { return nil },
				HandOff: func(_ context.Context, rec PairRecord) error {
					handed <- rec
					return nil
				}}, tc.rec)
			d := NewDoubleWrite(DoubleWriteConfig{Config: Config{Topic: "d", Index: 0, Self: "a"}}, p)
			defer d.Close()
			fail.Store(true)
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			if _, err := d.Apply(ctx, &store.Command{Op: store.OpAppend, Msgs: []store.Message{{ID: "x", Body: []byte("x")}}}); err == nil {
				t.Fatal("a send acked while the leader's write fails")
			}
			select {
			case rec := <-handed:
				if !tc.handed || rec.Version != tc.rec.Version {
					t.Fatalf("handed off with record %+v (want a hand-off: %v)", rec, tc.handed)
				}
			case <-time.After(time.Second):
				if tc.handed {
					t.Fatal("no hand-off within a second of the leader's failure")
				}
			}
		})
	}
}
