package store_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq/store"
)

// Fenced group offsets: OpClaim and OpResetOffset hand out generations from
// one partition-wide counter, and OpCommitOffset is applied only with the
// group's current generation.

// claim applies OpClaim of group from start (at offset off for StartAt).
func claim(t testing.TB, p *store.Partition, group string, start store.Start, off uint64) store.Result {
	t.Helper()
	return apply(t, p, &store.Command{Op: store.OpClaim, Group: group, Start: start, Offset: off})
}

// commit applies OpCommitOffset and returns its result and error.
func commit(p *store.Partition, group string, gen, off uint64) (store.Result, error) {
	return p.Apply(context.Background(), &store.Command{Op: store.OpCommitOffset, Now: t0, Group: group, Generation: gen, Offset: off})
}

// group returns the record of name, failing the test when there is none.
func group(t testing.TB, p *store.Partition, name string) store.GroupState {
	t.Helper()
	g, ok, err := p.Group(name)
	if err != nil || !ok {
		t.Fatalf("Group(%s) = %+v, %v, %v", name, g, ok, err)
	}
	return g
}

// groupStates returns p's group records, failing the test on an error.
func groupStates(t testing.TB, p *store.Partition) map[string]store.GroupState {
	t.Helper()
	states, err := p.GroupStates()
	if err != nil {
		t.Fatal(err)
	}
	return states
}

func TestPartition_Claim(t *testing.T) {
	// fill appends n messages, one a second from t0, and trims those
	// stored before t0+trimmed seconds.
	fill := func(t *testing.T, p *store.Partition, n, trimmed int) {
		for i := range n {
			appendAt(t, p, t0+int64(i)*sec, msg(fmt.Sprint(i)))
		}
		if trimmed > 0 {
			apply(t, p, &store.Command{Op: store.OpTrim, Now: t0 + int64(trimmed)*sec, MaxAge: 1})
		}
	}
	tests := []struct {
		name           string
		n, trimmed     int
		start          store.Start
		want, wantNext uint64
	}{
		{"Empty/First", 0, 0, store.StartFirst, 0, 0},
		{"Empty/Last", 0, 0, store.StartLast, 0, 0},
		{"Empty/At", 0, 0, store.StartAt, 7, 0},
		{"Log/First", 3, 0, store.StartFirst, 0, 3},
		{"Log/Last", 3, 0, store.StartLast, 3, 3},
		{"Log/At", 3, 0, store.StartAt, 7, 3},
		{"Trimmed/First", 5, 2, store.StartFirst, 2, 5},
		{"Trimmed/Last", 5, 2, store.StartLast, 5, 5},
		{"Trimmed/At", 5, 2, store.StartAt, 7, 5},
		{"AllTrimmed/First", 4, 10, store.StartFirst, 4, 4},
		{"AllTrimmed/Last", 4, 10, store.StartLast, 4, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, _ := open(t)
			fill(t, p, tt.n, tt.trimmed)
			equal(t, "next", p.Stats().Next, tt.wantNext)
			res := apply(t, p, &store.Command{Op: store.OpClaim, Now: t0 + 100*sec, Group: "g", Start: tt.start, Offset: 7})
			equal(t, "claim", [3]any{res.Offset, res.Generation, res.Found}, [3]any{tt.want, uint64(1), false})
			equal(t, "record", group(t, p, "g"), store.GroupState{Offset: tt.want, Generation: 1, Updated: t0 + 100*sec})
		})
	}
	t.Run("Existing", func(t *testing.T) {
		// A group with a record keeps its offset, whatever Start says.
		p, _ := open(t)
		fill(t, p, 5, 0)
		if _, err := commit(p, "g", 0, 3); err != nil {
			t.Fatal(err)
		}
		for i, start := range []store.Start{store.StartFirst, store.StartLast, store.StartAt} {
			res := claim(t, p, "g", start, 9)
			equal(t, "claim", [3]any{res.Offset, res.Generation, res.Found}, [3]any{uint64(3), uint64(i + 1), true})
		}
	})
	t.Run("InBatch", func(t *testing.T) {
		// Start is computed when the claim is applied: after the appends
		// batched before it.
		p, _ := open(t)
		res, errs, err := p.ApplyBatch(context.Background(), []*store.Command{
			{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("a"), msg("b")}},
			{Op: store.OpClaim, Now: t0, Group: "last", Start: store.StartLast},
			{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("c")}},
			{Op: store.OpClaim, Now: t0, Group: "last2", Start: store.StartLast},
		})
		if err != nil || errors.Join(errs...) != nil {
			t.Fatal(err, errs)
		}
		equal(t, "offsets", [2]uint64{res[1].Offset, res[3].Offset}, [2]uint64{2, 3})
		equal(t, "generations", [2]uint64{res[1].Generation, res[3].Generation}, [2]uint64{1, 2})
	})
}

// TestPartition_CommitOffset_Stale: a commit with another generation than
// the group's is refused with ErrStaleGeneration naming both, and changes
// nothing at all.
func TestPartition_CommitOffset_Stale(t *testing.T) {
	p, _ := open(t)
	appendAt(t, p, t0, msg("a"), msg("b"))
	claim(t, p, "g", store.StartFirst, 0)
	claim(t, p, "g", store.StartFirst, 0) // generation 2
	if res, err := commit(p, "g", 2, 1); err != nil || res.Offset != 1 || res.Generation != 2 || !res.Found {
		t.Fatalf("commit with the current generation: %+v, %v", res, err)
	}
	before := dump(t, p)
	for _, gen := range []uint64{0, 1, 3, math.MaxUint64} {
		res, err := commit(p, "g", gen, 2)
		if !errors.Is(err, store.ErrStaleGeneration) {
			t.Fatalf("commit with generation %d: %v, want ErrStaleGeneration", gen, err)
		}
		if msg := err.Error(); !strings.Contains(msg, fmt.Sprintf("generation %d", gen)) || !strings.Contains(msg, "at 2") {
			t.Fatalf("error %q does not name generations %d and 2", msg, gen)
		}
		equal(t, "refused result", res, store.Result{Offset: 1, Generation: 2, Found: true})
	}
	equal(t, "state after refused commits", dump(t, p), before)
	equal(t, "record", group(t, p, "g"), store.GroupState{Offset: 1, Generation: 2, Updated: t0})
}

// TestPartition_ResetOffset: a reset fences the owner: its next commit
// fails, and the new generation's commits work.
func TestPartition_ResetOffset(t *testing.T) {
	p, _ := open(t)
	appendAt(t, p, t0, msg("a"), msg("b"), msg("c"))
	owner := claim(t, p, "g", store.StartFirst, 0).Generation
	if _, err := commit(p, "g", owner, 2); err != nil {
		t.Fatal(err)
	}
	res := apply(t, p, &store.Command{Op: store.OpResetOffset, Now: t0 + sec, Group: "g", Offset: 0})
	if res.Generation <= owner || res.Offset != 0 || !res.Found {
		t.Fatalf("reset: %+v, want offset 0 and a generation after %d", res, owner)
	}
	if _, err := commit(p, "g", owner, 3); !errors.Is(err, store.ErrStaleGeneration) {
		t.Fatalf("the fenced owner's commit: %v, want ErrStaleGeneration", err)
	}
	equal(t, "record after the fenced commit", group(t, p, "g"), store.GroupState{Offset: 0, Generation: res.Generation, Updated: t0 + sec, Reset: true})
	if _, err := commit(p, "g", res.Generation, 1); err != nil {
		t.Fatalf("commit with the reset's generation: %v", err)
	}
	// A reset of a group without a record creates it.
	res = apply(t, p, &store.Command{Op: store.OpResetOffset, Group: "new", Offset: 9})
	equal(t, "reset of a new group", res, store.Result{Offset: 9, Generation: owner + 2})
	equal(t, "new record", group(t, p, "new"), store.GroupState{Offset: 9, Generation: owner + 2, Updated: t0, Reset: true})
}

// TestPartition_DeleteGroup_Generations: after a delete, a claim's
// generation is above every one before it, and the old owner's commit
// is refused.
func TestPartition_DeleteGroup_Generations(t *testing.T) {
	p, _ := open(t)
	var gens []uint64
	gens = append(gens, claim(t, p, "a", store.StartAt, 1).Generation)
	gens = append(gens, claim(t, p, "b", store.StartAt, 1).Generation)
	gens = append(gens, apply(t, p, &store.Command{Op: store.OpResetOffset, Group: "a", Offset: 5}).Generation)
	old := gens[len(gens)-1]
	if res := apply(t, p, &store.Command{Op: store.OpDeleteGroup, Group: "a"}); !res.Found {
		t.Fatalf("delete of a group with a record: %+v", res)
	}
	if _, ok, _ := p.Group("a"); ok {
		t.Fatal("record after delete")
	}
	if _, err := commit(p, "a", old, 6); !errors.Is(err, store.ErrStaleGeneration) {
		t.Fatalf("the deleted owner's commit: %v, want ErrStaleGeneration", err)
	}
	res := claim(t, p, "a", store.StartAt, 0)
	for _, g := range gens {
		if res.Generation <= g {
			t.Fatalf("claim after delete: generation %d, not above %d (earlier: %v)", res.Generation, g, gens)
		}
	}
	if res.Found || res.Offset != 0 {
		t.Fatalf("claim after delete: %+v, want a new record at 0", res)
	}
	if _, err := commit(p, "a", old, 6); !errors.Is(err, store.ErrStaleGeneration) {
		t.Fatalf("the old owner's commit after the new claim: %v, want ErrStaleGeneration", err)
	}
	if res := apply(t, p, &store.Command{Op: store.OpDeleteGroup, Group: "never"}); res.Found {
		t.Fatalf("delete of a group without a record: %+v", res)
	}
}

// TestPartition_CommitOffset_Unfenced: until a claim, commits carry
// generation 0 and work as before generations; a claim then fences them.
func TestPartition_CommitOffset_Unfenced(t *testing.T) {
	p, _ := open(t)
	res, err := commit(p, "g", 0, 4)
	if err != nil || res.Found || res.Offset != 4 || res.Generation != 0 {
		t.Fatalf("first unfenced commit: %+v, %v", res, err)
	}
	if res, err := commit(p, "g", 0, 5); err != nil || !res.Found {
		t.Fatalf("second unfenced commit: %+v, %v", res, err)
	}
	if _, err := commit(p, "other", 1, 5); !errors.Is(err, store.ErrStaleGeneration) {
		t.Fatalf("commit with generation 1 to a group without a record: %v, want ErrStaleGeneration", err)
	}
	if _, ok, _ := p.Group("other"); ok {
		t.Fatal("a refused commit created a record")
	}
	gen := claim(t, p, "g", store.StartFirst, 0).Generation
	if _, err := commit(p, "g", 0, 6); !errors.Is(err, store.ErrStaleGeneration) {
		t.Fatalf("unfenced commit after a claim: %v, want ErrStaleGeneration", err)
	}
	equal(t, "record", group(t, p, "g"), store.GroupState{Offset: 5, Generation: gen, Updated: t0})
	offs, err := p.Groups()
	if err != nil {
		t.Fatal(err)
	}
	equal(t, "Groups", offs, map[string]uint64{"g": 5})
	equal(t, "GroupStates", groupStates(t, p), map[string]store.GroupState{"g": {Offset: 5, Generation: gen, Updated: t0}})
}

// TestPartition_Generations_Reopen: records and the counter survive a
// reopen (with ZEZE_STORE_WAL=1, a replay of the WAL too): the next claim
// continues the sequence.
func TestPartition_Generations_Reopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.db")
	p := openAt(t, path)
	claim(t, p, "a", store.StartAt, 1)
	claim(t, p, "b", store.StartAt, 2)
	apply(t, p, &store.Command{Op: store.OpResetOffset, Group: "b", Offset: 3})
	apply(t, p, &store.Command{Op: store.OpDeleteGroup, Group: "b"})
	want := groupStates(t, p)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	r := openAt(t, path)
	equal(t, "groups after reopen", groupStates(t, r), want)
	equal(t, "claim after reopen", claim(t, r, "b", store.StartAt, 0).Generation, uint64(4))
}

// TestWAL_ReplayGenerations: claims only in the WAL (the materializer
// stalled) come back with the counter after a crash.
func TestWAL_ReplayGenerations(t *testing.T) {
	dir := t.TempDir()
	n := mustWALNodeWith(t, dir, stalled)
	claim(t, n.p, "g", store.StartAt, 5)
	apply(t, n.p, &store.Command{Op: store.OpResetOffset, Group: "h", Offset: 1})
	if _, err := commit(n.p, "g", 1, 6); err != nil {
		t.Fatal(err)
	}
	want := groupStates(t, n.p)
	crash := t.TempDir()
	copyDir(t, dir, crash)
	r := mustWALNode(t, crash)
	equal(t, "groups after replay", groupStates(t, r.p), want)
	equal(t, "claim after replay", claim(t, r.p, "h", store.StartAt, 0).Generation, uint64(3))
}

// TestPartition_ApplyBatch_StaleCommit: a refused commit in a batch fails
// itself alone; the good commands around it, commits included, apply.
func TestPartition_ApplyBatch_StaleCommit(t *testing.T) {
	p, _ := open(t)
	gen := claim(t, p, "g", store.StartAt, 0).Generation
	cmds := []*store.Command{
		{Op: store.OpCommitOffset, Now: t0, Group: "g", Generation: gen, Offset: 1},
		{Op: store.OpAppend, Now: t0, Msgs: []store.Message{msg("a")}},
		{Op: store.OpCommitOffset, Now: t0, Group: "g", Generation: gen - 1, Offset: 99},   // stale
		{Op: store.OpClaim, Now: t0 + sec, Group: "g"},                                     // fences gen
		{Op: store.OpCommitOffset, Now: t0 + sec, Group: "g", Generation: gen, Offset: 98}, // stale now
		{Op: store.OpCommitOffset, Now: t0 + sec, Group: "g", Generation: gen + 1, Offset: 2},
		{Op: store.OpAppend, Now: t0 + sec, Msgs: []store.Message{msg("b")}},
	}
	res, errs, err := p.ApplyBatch(context.Background(), cmds)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		stale := i == 2 || i == 4
		if stale != errors.Is(e, store.ErrStaleGeneration) || !stale && e != nil {
			t.Fatalf("command %d (op %d): %v", i, cmds[i].Op, e)
		}
	}
	equal(t, "acks", [2]uint64{res[1].Acks[0].Offset, res[6].Acks[0].Offset}, [2]uint64{0, 1})
	equal(t, "record", group(t, p, "g"), store.GroupState{Offset: 2, Generation: gen + 1, Updated: t0 + sec})
}

// TestPartition_GroupEdgeInputs: group commands with inputs at the edges
// of their range.
func TestPartition_GroupEdgeInputs(t *testing.T) {
	t.Run("BadStart", func(t *testing.T) {
		p, _ := open(t)
		before := dump(t, p)
		for _, c := range []store.Command{
			{Op: store.OpClaim, Now: t0, Group: "g", Start: store.StartLast + 1},
			{Op: store.OpClaim, Now: t0, Group: "g", Start: 255},
			{Op: store.OpClaim, Now: t0},                                            // no group
			{Op: store.OpResetOffset, Now: t0},                                      // no group
			{Op: store.OpCommitOffset, Now: t0, Group: "g", Start: store.StartLast}, // Start is OpClaim's
			{Op: store.OpResetOffset, Now: t0, Group: "g", Start: store.StartFirst},
			{Op: store.OpResetOffset, Now: t0, Group: "g", Generation: 1}, // Generation is the owner's ops' and OpClaim's
			{Op: store.OpDeleteGroup, Now: t0, Group: "g", Generation: 1},
			{Op: store.OpAppend, Now: t0, Generation: math.MaxUint64},
		} {
			if _, err := p.Apply(context.Background(), &c); !errors.Is(err, store.ErrBadCommand) {
				t.Fatalf("%+v: %v, want ErrBadCommand", c, err)
			}
		}
		equal(t, "state after bad commands", dump(t, p), before)
	})
	t.Run("AtPastTheEnd", func(t *testing.T) {
		// Like a commit, a claim at an offset stores it as given; readers
		// compare it with the log.
		p, _ := open(t)
		appendAt(t, p, t0, msg("a"))
		res := claim(t, p, "g", store.StartAt, math.MaxUint64)
		equal(t, "claim", res, store.Result{Offset: math.MaxUint64, Generation: 1})
		if _, err := commit(p, "g", 1, math.MaxUint64-1); err != nil {
			t.Fatal(err)
		}
		equal(t, "record", group(t, p, "g").Offset, uint64(math.MaxUint64-1))
	})
	t.Run("GenerationZeroAndMax", func(t *testing.T) {
		p, _ := open(t)
		if _, err := commit(p, "g", math.MaxUint64, 1); !errors.Is(err, store.ErrStaleGeneration) {
			t.Fatalf("commit with generation MaxUint64 to a group without a record: %v", err)
		}
		if _, err := commit(p, "g", 0, 1); err != nil {
			t.Fatal(err)
		}
		if _, err := commit(p, "g", math.MaxUint64, 2); !errors.Is(err, store.ErrStaleGeneration) {
			t.Fatalf("commit with generation MaxUint64 to a group at 0: %v", err)
		}
		gen := claim(t, p, "g", store.StartAt, 0).Generation
		if _, err := commit(p, "g", 0, 3); !errors.Is(err, store.ErrStaleGeneration) {
			t.Fatalf("commit with generation 0 after a claim: %v", err)
		}
		equal(t, "record", group(t, p, "g"), store.GroupState{Offset: 1, Generation: gen, Updated: t0})
	})
	t.Run("DamagedRecord", func(t *testing.T) {
		// A damaged record fails the claims and commits that read it,
		// as ErrCorrupt of the command alone; a reset replaces it.
		p, path := open(t)
		claim(t, p, "g", store.StartAt, 4)
		appendAt(t, p, t0, msg("a"))
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		flipInBucket(t, path, "groups", []byte("g"), "ZG")
		r := openAt(t, path)
		if _, _, err := r.Group("g"); !errors.Is(err, store.ErrCorrupt) {
			t.Fatalf("Group of a damaged record: %v, want ErrCorrupt", err)
		}
		if _, err := commit(r, "g", 1, 5); !errors.Is(err, store.ErrCorrupt) {
			t.Fatalf("commit to a damaged record: %v, want ErrCorrupt", err)
		}
		if _, err := r.Apply(context.Background(), &store.Command{Op: store.OpClaim, Now: t0, Group: "g"}); !errors.Is(err, store.ErrCorrupt) {
			t.Fatalf("claim of a damaged record: %v, want ErrCorrupt", err)
		}
		res := apply(t, r, &store.Command{Op: store.OpResetOffset, Group: "g", Offset: 1})
		equal(t, "reset of a damaged record", res, store.Result{Offset: 1, Generation: 2, Found: true})
		equal(t, "append after", offsetsOf(appendAt(t, r, t0, msg("b"))), []uint64{1})
	})
}

// TestOpen_OldGroupValues: group values of formats 1 (8 bytes) and 2 (8
// bytes sealed) read as generation 0, accept a generation 0 commit, and a
// claim fences them.
func TestOpen_OldGroupValues(t *testing.T) {
	for _, tt := range []struct {
		name string
		val  func(key string, off uint64) []byte
	}{
		{"Format1", func(_ string, off uint64) []byte { return be64(off) }},
		{"Format2", func(key string, off uint64) []byte {
			crc := crc32.Update(crc32.Checksum([]byte(key), crc32.MakeTable(crc32.Castagnoli)), crc32.MakeTable(crc32.Castagnoli), be64(off))
			return append(be64(off), be32(crc)...)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := openAt(t, rewritten(t, func(tx *bolt.Tx) error {
				b := tx.Bucket([]byte("groups"))
				return errors.Join(b.Put([]byte("g"), tt.val("g", 7)), b.Put([]byte("h"), tt.val("h", 8)))
			}))
			equal(t, "old record", group(t, r, "g"), store.GroupState{Offset: 7})
			equal(t, "old records", groupStates(t, r), map[string]store.GroupState{"g": {Offset: 7}, "h": {Offset: 8}})
			if _, err := commit(r, "g", 1, 9); !errors.Is(err, store.ErrStaleGeneration) {
				t.Fatalf("commit with generation 1 to an old record: %v", err)
			}
			if res, err := commit(r, "g", 0, 9); err != nil || !res.Found {
				t.Fatalf("commit with generation 0 to an old record: %+v, %v", res, err)
			}
			equal(t, "rewritten record", group(t, r, "g"), store.GroupState{Offset: 9, Updated: t0})
			equal(t, "claim of an old record", claim(t, r, "h", store.StartFirst, 0), store.Result{Offset: 8, Generation: 1, Found: true})
		})
	}
}

// TestPartition_LastGeneration: the counter hands out MaxUint64, then
// refuses (ErrBadCommand, nothing changed) rather than wrap to a used
// generation.
func TestPartition_LastGeneration(t *testing.T) {
	p := openAt(t, rewritten(t, func(tx *bolt.Tx) error {
		meta := tx.Bucket([]byte("meta"))
		st, err := store.StateWithGroupGen(meta.Get([]byte("state")), math.MaxUint64-1)
		if err != nil {
			return err
		}
		return meta.Put([]byte("state"), st)
	}))
	if res := claim(t, p, "g", store.StartAt, 3); res.Generation != math.MaxUint64 {
		t.Fatalf("claim of the last generation: %+v", res)
	}
	if _, err := commit(p, "g", math.MaxUint64, 4); err != nil {
		t.Fatalf("commit with generation MaxUint64: %v", err)
	}
	before := dump(t, p)
	for _, c := range []store.Command{{Op: store.OpClaim, Now: t0, Group: "g"}, {Op: store.OpResetOffset, Now: t0, Group: "g"},
		{Op: store.OpClaim, Now: t0, Group: "h"}} {
		if _, err := p.Apply(context.Background(), &c); !errors.Is(err, store.ErrBadCommand) {
			t.Fatalf("%+v past the last generation: %v, want ErrBadCommand", c, err)
		}
	}
	equal(t, "state after refused claims", dump(t, p), before)
	equal(t, "record", group(t, p, "g"), store.GroupState{Offset: 4, Generation: math.MaxUint64, Updated: t0})
}

func be32(v uint32) []byte { return []byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)} }

// TestOpen_Format2Fixture opens a partition file and WAL written by the
// release before group generations (testdata/format2, gzipped: file format
// 2, effect records of version 1 with the state of version 1). The file
// held a0..a2 and groups in-file=2 (deleted was committed, then deleted);
// the WAL only, b0, b1, in-wal=4 and in-file=3.
func TestOpen_Format2Fixture(t *testing.T) {
	dir := unpackFixture(t, "testdata/format2")
	t.Run("FileAlone", func(t *testing.T) {
		d := t.TempDir()
		copyDir(t, dir, d)
		os.RemoveAll(filepath.Join(d, "wal"))
		p, err := store.Open(filepath.Join(d, "0.db"), store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		equal(t, "groups", groupStates(t, p), map[string]store.GroupState{"in-file": {Offset: 2}})
		bodies, _ := readAll(t, p)
		equal(t, "log", bodies, []string{"body-a0", "body-a1", "body-a2"})
	})
	t.Run("Replay", func(t *testing.T) {
		d := t.TempDir()
		copyDir(t, dir, d)
		r := mustWALNode(t, d)
		equal(t, "groups", groupStates(t, r.p), map[string]store.GroupState{"in-file": {Offset: 3}, "in-wal": {Offset: 4}})
		bodies, _ := readAll(t, r.p)
		equal(t, "log", bodies, []string{"body-a0", "body-a1", "body-a2", "body-b0", "body-b1"})
		equal(t, "dedup after replay", appendAt(t, r.p, t0, store.Message{ID: "b1"})[0], store.Ack{Offset: 4, Duplicate: true})
		if _, err := commit(r.p, "in-wal", 0, 5); err != nil {
			t.Fatalf("generation 0 commit to a replayed old record: %v", err)
		}
		equal(t, "first claim", claim(t, r.p, "in-file", store.StartAt, 0), store.Result{Offset: 3, Generation: 1, Found: true})
		equal(t, "append", offsetsOf(appendAt(t, r.p, t0, msg("c"))), []uint64{5})
		r.close(t)
		r2 := mustWALNode(t, d)
		equal(t, "after reopen", group(t, r2.p, "in-file"), store.GroupState{Offset: 3, Generation: 1, Updated: t0})
		equal(t, "claim after reopen", claim(t, r2.p, "in-wal", store.StartAt, 0).Generation, uint64(2))
	})
}

// unpackFixture gunzips every file under src into a new directory.
func unpackFixture(t testing.TB, src string) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.Walk(src, func(path string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(src, strings.TrimSuffix(path, ".gz"))
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			return err
		}
		raw, err := io.ReadAll(zr)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dst, rel)), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), raw, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// groupOpsBatch mixes every group op in one ApplyBatch, appends among them,
// and returns the records it should leave.
func groupOpsBatch(t *testing.T, p *store.Partition) map[string]store.GroupState {
	t.Helper()
	big := msg("b1")
	cmds := []*store.Command{
		{Op: store.OpClaim, Now: t0, Group: "g", Start: store.StartAt, Offset: 3},      // gen 1
		{Op: store.OpCommitOffset, Now: t0 + 1, Group: "g", Generation: 1, Offset: 4},  // ok
		{Op: store.OpResetOffset, Now: t0 + 2, Group: "g", Offset: 1},                  // gen 2, Reset
		{Op: store.OpCommitOffset, Now: t0 + 3, Group: "g", Generation: 1, Offset: 9},  // stale
		{Op: store.OpAppend, Now: t0 + 3, Msgs: []store.Message{big}},                  //
		{Op: store.OpAppend, Now: t0 + 3, Msgs: []store.Message{msg("b2")}},            //
		{Op: store.OpAppend, Now: t0 + 3, Msgs: []store.Message{msg("b3")}},            //
		{Op: store.OpDeleteGroup, Now: t0 + 4, Group: "g"},                             // gone
		{Op: store.OpCommitOffset, Now: t0 + 5, Group: "g", Generation: 2, Offset: 7},  // stale: no record
		{Op: store.OpClaim, Now: t0 + 6, Group: "g", Start: store.StartLast},           // gen 3 at Next
		{Op: store.OpResetOffset, Now: t0 + 7, Group: "h", Offset: 2},                  // gen 4, Reset
		{Op: store.OpDeleteGroup, Now: t0 + 8, Group: "h", MaxAge: 1},                  // not idle: kept
		{Op: store.OpDeleteGroup, Now: t0 + 9, Group: "h", MaxAge: 2},                  // Updated == Now-MaxAge: kept
		{Op: store.OpClaim, Now: t0 + 10, Group: "i", Start: store.StartFirst},         // gen 5
		{Op: store.OpDeleteGroup, Now: t0 + 13, Group: "i", MaxAge: 2},                 // idle: deleted
		{Op: store.OpResetOffset, Now: t0 + 14, Group: "i", Offset: 0},                 // gen 6
		{Op: store.OpCommitOffset, Now: t0 + 15, Group: "i", Generation: 6, Offset: 1}, // ok under the reset's gen
	}
	_, errs, err := p.ApplyBatch(context.Background(), cmds)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		stale := i == 3 || i == 8
		if stale != errors.Is(e, store.ErrStaleGeneration) || !stale && e != nil {
			t.Fatalf("command %d (op %d): %v", i, cmds[i].Op, e)
		}
	}
	return map[string]store.GroupState{
		"g": {Offset: 3, Generation: 3, Updated: t0 + 6},
		"h": {Offset: 2, Generation: 4, Updated: t0 + 7, Reset: true},
		"i": {Offset: 1, Generation: 6, Updated: t0 + 15, Reset: true},
	}
}

// TestPartition_GroupOpsBatchReopen: the group ops of one batch leave the
// records they should, and the same after a reopen (with ZEZE_STORE_WAL=1
// through a WAL), and the counter goes on.
func TestPartition_GroupOpsBatchReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.db")
	p := openAt(t, path)
	want := groupOpsBatch(t, p)
	equal(t, "groups", groupStates(t, p), want)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	r := openAt(t, path)
	equal(t, "groups after reopen", groupStates(t, r), want)
	equal(t, "claim after reopen", claim(t, r, "j", store.StartAt, 0).Generation, uint64(7))
}

// TestWAL_GroupOpsBatchReplay: the batch of
// TestPartition_GroupOpsBatchReopen only in the WAL, then a crash: the
// replay leaves the same records.
func TestWAL_GroupOpsBatchReplay(t *testing.T) {
	dir := t.TempDir()
	n := mustWALNodeWith(t, dir, stalled)
	want := groupOpsBatch(t, n.p)
	crash := t.TempDir()
	copyDir(t, dir, crash)
	r := mustWALNode(t, crash)
	equal(t, "groups after replay", groupStates(t, r.p), want)
	equal(t, "claim after replay", claim(t, r.p, "j", store.StartAt, 0).Generation, uint64(7))
}

// TestPartition_GroupStatesDamagedReplaced: a damaged record, then replaced
// by a reset (OpResetOffset takes a damaged record too) or deleted: the
// record the partition holds now is intact, so GroupStates lists the
// groups. While the replacing gen is not yet in the file, it fails with the
// damage the file still holds.
func TestPartition_GroupStatesDamagedReplaced(t *testing.T) {
	for _, op := range []store.Op{store.OpResetOffset, store.OpDeleteGroup} {
		dir := t.TempDir()
		n := mustWALNodeWith(t, dir, store.Options{})
		claim(t, n.p, "g", store.StartAt, 4)
		claim(t, n.p, "k", store.StartAt, 1)
		n.close(t)
		flipInBucket(t, filepath.Join(dir, "0.db"), "groups", []byte("g"), "ZG")
		r := mustWALNodeWith(t, dir, stalled)
		apply(t, r.p, &store.Command{Op: op, Group: "g", Offset: 1})
		if _, err := r.p.GroupStates(); err != nil {
			t.Errorf("op %d: GroupStates after the damaged record was replaced: %v", op, err)
		}
	}
}

// TestPartition_LastGenerationBatchReopen: at the counter's last value, a
// batch hands it out once, refuses the next claim and reset, keeps the
// commit under it, and a reopen (or WAL replay) keeps the counter there.
func TestPartition_LastGenerationBatchReopen(t *testing.T) {
	path := rewritten(t, func(tx *bolt.Tx) error {
		meta := tx.Bucket([]byte("meta"))
		st, err := store.StateWithGroupGen(meta.Get([]byte("state")), math.MaxUint64-1)
		if err != nil {
			return err
		}
		return meta.Put([]byte("state"), st)
	})
	p := openAt(t, path)
	cmds := []*store.Command{
		{Op: store.OpClaim, Now: t0, Group: "g", Start: store.StartAt, Offset: 2},
		{Op: store.OpResetOffset, Now: t0, Group: "g", Offset: 0},
		{Op: store.OpCommitOffset, Now: t0 + 1, Group: "g", Generation: math.MaxUint64, Offset: 3},
		{Op: store.OpDeleteGroup, Now: t0 + 2, Group: "g"},
		{Op: store.OpClaim, Now: t0 + 3, Group: "g"},
		{Op: store.OpCommitOffset, Now: t0 + 4, Group: "g", Generation: math.MaxUint64, Offset: 4},
	}
	_, errs, err := p.ApplyBatch(context.Background(), cmds)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		switch i {
		case 1, 4:
			if !errors.Is(e, store.ErrBadCommand) {
				t.Fatalf("command %d past the last generation: %v", i, e)
			}
		case 5:
			if !errors.Is(e, store.ErrStaleGeneration) {
				t.Fatalf("commit after the delete revived generation MaxUint64: %v", e)
			}
		default:
			if e != nil {
				t.Fatalf("command %d: %v", i, e)
			}
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	r := openAt(t, path)
	equal(t, "groups after reopen", groupStates(t, r), map[string]store.GroupState{})
	if _, err := r.Apply(context.Background(), &store.Command{Op: store.OpClaim, Now: t0, Group: "g"}); !errors.Is(err, store.ErrBadCommand) {
		t.Fatalf("claim after reopen past the last generation: %v", err)
	}
}

// TestPartition_FenceResetsEveryGroup: OpFence gives every group a new
// generation, marked Reset, lowers an offset past the log's end to it, and
// keeps a lease; each owner's commit and renewal is refused after it, and
// a claim with the new generation goes on from the offset stored. The
// fence's own record holds the end and its generation, and is no group's.
func TestPartition_FenceResetsEveryGroup(t *testing.T) {
	p, _ := open(t)
	appendAt(t, p, t0, msg("a"), msg("b"), msg("c"))
	low := claim(t, p, "low", store.StartFirst, 0).Generation
	if _, err := commit(p, "low", low, 1); err != nil {
		t.Fatal(err)
	}
	// A position past the end, as one taken from a lost copy's tail.
	past := apply(t, p, &store.Command{Op: store.OpResetOffset, Group: "past", Offset: 50}).Generation
	leased := apply(t, p, &store.Command{Op: store.OpClaim, Now: t0, Group: "leased", MaxAge: int64(time.Hour)}).Generation
	res := apply(t, p, &store.Command{Op: store.OpFence, Now: t0 + sec, Offset: 3})
	if res.Count != 3 {
		t.Fatalf("fence: %+v, want 3 records fenced", res)
	}
	for name, was := range map[string]uint64{"low": low, "past": past, "leased": leased} {
		g := group(t, p, name)
		if g.Generation <= 3<<32 || !g.Reset {
			t.Fatalf("%s after the fence at epoch 3: %+v, want a generation past 3<<32 marked Reset (was %d)", name, g, was)
		}
		if _, err := commit(p, name, was, 2); !errors.Is(err, store.ErrStaleGeneration) {
			t.Fatalf("%s's commit with its old generation: %v, want ErrStaleGeneration", name, err)
		}
		if _, err := p.Apply(context.Background(), &store.Command{Op: store.OpRenew, Now: t0 + sec, Group: name, Generation: was}); !errors.Is(err, store.ErrStaleGeneration) {
			t.Fatalf("%s's renewal with its old generation: %v, want ErrStaleGeneration", name, err)
		}
	}
	if g := group(t, p, "low"); g.Offset != 1 {
		t.Fatalf("low's offset %d after the fence, want 1 kept", g.Offset)
	}
	if g := group(t, p, "past"); g.Offset != 3 {
		t.Fatalf("past's offset %d after the fence, want the end, 3", g.Offset)
	}
	if g := group(t, p, "leased"); g.Lease != int64(time.Hour) || g.Updated != t0 {
		t.Fatalf("leased after the fence: %+v, want its lease kept", g)
	}
	mark := group(t, p, store.FenceRecord)
	if mark.Offset != 3 || mark.Generation <= group(t, p, "leased").Generation {
		t.Fatalf("the fence's record: %+v, want the end, 3, and the fence's last generation", mark)
	}
	if all, err := p.GroupStates(); err != nil || len(all) != 3 {
		t.Fatalf("GroupStates after the fence: %v, %v; want the three groups alone", all, err)
	}
	g := group(t, p, "past")
	if res := claim(t, p, "past", store.StartAt, 0); res.Offset != 3 || res.Generation <= g.Generation {
		t.Fatalf("claim after the fence: %+v, want offset 3 and a later generation", res)
	}
	if res := apply(t, p, &store.Command{Op: store.OpFence, Now: t0 + 2*sec, Offset: 3}); res.Count != 3 {
		t.Fatalf("a second fence: %+v", res)
	}
	for _, epoch := range []uint64{0, 1 << 31} {
		if _, err := p.Apply(context.Background(), &store.Command{Op: store.OpFence, Now: t0, Offset: epoch}); !errors.Is(err, store.ErrBadCommand) {
			t.Fatalf("a fence at epoch %d: %v, want ErrBadCommand", epoch, err)
		}
	}
	for _, op := range []store.Op{store.OpClaim, store.OpCommitOffset, store.OpResetOffset, store.OpDeleteGroup, store.OpRenew, store.OpUnclaim} {
		if _, err := p.Apply(context.Background(), &store.Command{Op: op, Now: t0, Group: store.FenceRecord}); !errors.Is(err, store.ErrBadCommand) {
			t.Fatalf("op %d naming the fence's record: %v, want ErrBadCommand", op, err)
		}
	}
}
