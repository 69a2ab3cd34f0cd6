package store_test

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq/store"
)

// TestPartition_ReadRacingTrimNotCorrupt: ErrCorrupt only for damaged
// bytes: a read racing a trim on an intact file never reports one. This
// broke when a reader took its snapshot (state with the old Low) and then
// began its bbolt read transaction: a trim's gen committed into the file
// in between made Read find the head deleted and report "offset N missing
// from the log" as ErrCorrupt.
func TestPartition_ReadRacingTrimNotCorrupt(t *testing.T) {
	for _, mode := range []string{"NoWAL", "WAL"} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			var opts store.Options
			if mode == "WAL" {
				w, err := store.OpenWAL(filepath.Join(dir, "wal"), store.WALOptions{})
				if err != nil {
					t.Fatal(err)
				}
				defer w.Close()
				opts = store.Options{WAL: w, Stream: "s", MaterializeAfter: time.Nanosecond}
			}
			p, err := store.Open(filepath.Join(dir, "0.db"), opts)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			ctx := context.Background()
			stop := make(chan struct{})
			var bad atomic.Value
			var reads atomic.Int64
			var wg sync.WaitGroup
			for range 6 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						_, err := p.Read(0, 100, 0, nil)
						if err == nil {
							_, err = p.SeekTime(t0 + 5)
						}
						reads.Add(1)
						if err != nil {
							bad.CompareAndSwap(nil, err)
						}
					}
				}()
			}
			deadline := time.Now().Add(4 * time.Second)
			i := 0
			for time.Now().Before(deadline) && bad.Load() == nil {
				i++
				m := msg(fmt.Sprint(i))
				if _, err := p.Apply(ctx, &store.Command{Op: store.OpAppend, Now: t0 + int64(i), Msgs: []store.Message{m}}); err != nil {
					t.Fatal(err)
				}
				if _, err := p.Apply(ctx, &store.Command{Op: store.OpTrim, Now: t0 + int64(i), MaxBytes: 1}); err != nil {
					t.Fatal(err)
				}
			}
			close(stop)
			wg.Wait()
			if err, _ := bad.Load().(error); err != nil {
				t.Fatalf("after %d trims and %d reads of an intact file: %v", i, reads.Load(), err)
			}
			t.Logf("%d trims, %d reads, no spurious error", i, reads.Load())
		})
	}
}

// TestPartition_TrimConsumedEdges: the consumed trim keeps every record
// some group has not committed past, whatever the groups do (a reset below
// Low, a broadcast instance, a group past Next, a delete, Limit), and two
// partitions given the same commands hold identical files; Stats.Bytes is
// the log's size.
func TestPartition_TrimConsumedEdges(t *testing.T) {
	dir := t.TempDir()
	paths := []string{filepath.Join(dir, "a.db"), filepath.Join(dir, "b.db")}
	var parts []*store.Partition
	for _, path := range paths {
		p, err := store.Open(path, store.Options{Replicated: true})
		if err != nil {
			t.Fatal(err)
		}
		parts = append(parts, p)
	}
	idx := uint64(0)
	run := func(cmds ...*store.Command) []store.Result {
		t.Helper()
		idx++
		var out []store.Result
		for n, p := range parts {
			var cs []*store.Command
			for _, c := range cmds {
				cc := *c
				cs = append(cs, &cc)
			}
			res := applyLogged(t, p, idx, cs...)
			if n == 0 {
				out = res
			} else if !reflect.DeepEqual(res, out) {
				t.Fatalf("entry %d: results differ: %+v and %+v", idx, out, res)
			}
		}
		return out
	}
	trim := func(limit int) store.Result {
		t.Helper()
		return run(&store.Command{Op: store.OpTrim, Now: t0 + 1, Consumed: true, Limit: limit})[0]
	}
	var names []string
	for i := range 20 {
		names = append(names, fmt.Sprint(i))
	}
	run(appendCmd(names...)) // 0..19
	run(&store.Command{Op: store.OpCommitOffset, Now: t0, Group: "g", Offset: 12},
		&store.Command{Op: store.OpCommitOffset, Now: t0, Group: "b@node1", Offset: 8})
	if r := trim(3); r.Count != 3 || !r.More {
		t.Fatalf("trim with limit 3: %+v", r)
	}
	if r := trim(0); r.Count != 5 || r.More {
		t.Fatalf("trim to the broadcast instance's 8: %+v", r)
	}
	// A reset back below Low: nothing more goes, and the group reads from Low.
	run(&store.Command{Op: store.OpResetOffset, Now: t0, Group: "g", Offset: 2})
	if r := trim(0); r.Count != 0 {
		t.Fatalf("trim after a reset below Low deleted %d", r.Count)
	}
	// The instance leaves; g goes past the end.
	run(&store.Command{Op: store.OpDeleteGroup, Now: t0, Group: "b@node1"})
	if r := trim(0); r.Count != 0 {
		t.Fatalf("trim with g at 2, below Low 8, deleted %d", r.Count)
	}
	st := parts[0].Stats()
	g, _, _ := parts[0].Group("g")
	run(&store.Command{Op: store.OpCommitOffset, Now: t0, Group: "g", Offset: 15, Generation: g.Generation})
	if r := trim(0); r.Count != 7 || parts[0].Stats().Low != 15 {
		t.Fatalf("trim to 15 from %d: %+v, Stats %+v", st.Low, r, parts[0].Stats())
	}
	// A group that never consumed arrives at StartFirst: it holds the rest.
	run(&store.Command{Op: store.OpClaim, Now: t0, Group: "late", Start: store.StartFirst})
	run(&store.Command{Op: store.OpCommitOffset, Now: t0, Group: "g", Offset: 20, Generation: g.Generation})
	if r := trim(0); r.Count != 0 {
		t.Fatalf("trim with a group claimed at the head deleted %d", r.Count)
	}
	for _, p := range parts {
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for n, path := range paths {
		d := dumpBolt(t, path)
		if got, want := logBytes(d), func() int64 {
			p := openReplicated(t, path)
			defer p.Close()
			return p.Stats().Bytes
		}(); got != want {
			t.Fatalf("partition %d: Stats.Bytes %d, the log's records take %d", n, want, got)
		}
	}
	a, b := dumpBolt(t, paths[0]), dumpBolt(t, paths[1])
	delete(a["meta"], "id")
	delete(b["meta"], "id")
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two partitions given the same commands hold different files")
	}
}

// TestPartition_TrimConsumedKeepsDedup: with the consumed trim, a
// producer's retry within the dedup window is still found after every
// group consumed the message: a consumed record waits for the dedup
// window. This broke when the trim deleted the dedup entries of the
// records it deleted: a retry 5 s after the send stored a second copy and
// the group got it twice.
func TestPartition_TrimConsumedKeepsDedup(t *testing.T) {
	p := openReplicated(t, filepath.Join(t.TempDir(), "0.db"))
	const window = int64(120 * sec)
	acks := applyLogged(t, p, 1, &store.Command{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("a")}})[0].Acks
	applyLogged(t, p, 2, &store.Command{Op: store.OpCommitOffset, Now: t0 + sec, Group: "g", Offset: 1})
	// The upkeep's trim, one second later, with the default dedup window.
	res := applyLogged(t, p, 3, &store.Command{Op: store.OpTrim, Now: t0 + 2*sec, Consumed: true, DedupTTL: window, Limit: 10_000})
	if res[0].Count != 0 {
		t.Fatalf("the consumed trim deleted %d records still in the dedup window", res[0].Count)
	}
	// The producer, whose ack got lost, retries 5 s after its first send.
	again := applyLogged(t, p, 4, &store.Command{Op: store.OpAppend, Now: t0 + 5*sec, Msgs: []store.Message{msg("a")}})[0].Acks
	if !again[0].Duplicate || again[0].Offset != acks[0].Offset {
		bodies, offs := readAll(t, p)
		t.Fatalf("a retry 5 s after the send (dedup window 120 s): ack %+v, want a duplicate at %d; the log now holds %v at %v, "+
			"and group g (at offset 1) is delivered the message again", again[0], acks[0].Offset, bodies, offs)
	}
	// Once out of the window it goes.
	res = applyLogged(t, p, 5, &store.Command{Op: store.OpTrim, Now: t0 + window + sec, Consumed: true, DedupTTL: window, Limit: 10_000})
	if res[0].Count != 1 || p.Stats().Low != 1 {
		t.Fatalf("the consumed trim after the window: %+v, Stats %+v; want 1 deleted", res[0], p.Stats())
	}
}

// TestPartition_TrimConsumedDamagedGroup: a damaged group record keeps
// every record (its group may need all), while the good records are
// readable.
func TestPartition_TrimConsumedDamagedGroup(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.db")
	p, err := store.Open(path, store.Options{Replicated: true})
	if err != nil {
		t.Fatal(err)
	}
	applyLogged(t, p, 1, appendCmd("a", "b", "c", "d"))
	applyLogged(t, p, 2, &store.Command{Op: store.OpCommitOffset, Now: t0, Group: "g1", Offset: 3},
		&store.Command{Op: store.OpCommitOffset, Now: t0, Group: "g2", Offset: 4})
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	updateBolt(t, path, func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("groups"))
		v := bytes.Clone(b.Get([]byte("g2")))
		v[len(v)-1] ^= 0x55
		return b.Put([]byte("g2"), v)
	})
	p = openReplicated(t, path)
	res := applyLogged(t, p, 3, &store.Command{Op: store.OpTrim, Now: t0 + 1, Consumed: true})
	if res[0].Count != 0 || p.Stats().Low != 0 {
		t.Fatalf("consumed trim with a damaged group record: %+v, Stats %+v", res[0], p.Stats())
	}
}
