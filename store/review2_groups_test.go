package store_test

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq/store"
)

// review2Batch mixes every group op in one ApplyBatch, appends among them,
// and returns the records it should leave.
func review2Batch(t *testing.T, p *store.Partition) map[string]store.GroupState {
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

// TestReview2_MixedBatchReopen: the group ops of one batch, leave the records they should, and the same after a reopen (with
// ZEZE_STORE_WAL=1 through a WAL), and the counter goes on.
func TestReview2_MixedBatchReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.db")
	p := openAt(t, path)
	want := review2Batch(t, p)
	equal(t, "groups", groupStates(t, p), want)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	r := openAt(t, path)
	equal(t, "groups after reopen", groupStates(t, r), want)
	equal(t, "claim after reopen", claim(t, r, "j", store.StartAt, 0).Generation, uint64(7))
}

// TestReview2_MixedBatchReplay: the same batch only in the WAL, then a crash.
func TestReview2_MixedBatchReplay(t *testing.T) {
	dir := t.TempDir()
	n := mustWALNodeWith(t, dir, stalled)
	want := review2Batch(t, n.p)
	crash := t.TempDir()
	copyDir(t, dir, crash)
	r := mustWALNode(t, crash)
	equal(t, "groups after replay", groupStates(t, r.p), want)
	equal(t, "claim after replay", claim(t, r.p, "j", store.StartAt, 0).Generation, uint64(7))
}

// TestReview2_GroupStatesDamagedReplaced: a damaged record, then replaced
// by a reset (OpResetOffset takes a damaged record too) or deleted: the
// record the partition holds now is intact, so GroupStates must list the
// groups. While the replacing gen is not yet in the file, it fails with the
// damage the file still holds.
func TestReview2_GroupStatesDamagedReplaced(t *testing.T) {
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

// TestReview2_LastGenerationBatchReopen: at the counter's last value, a
// batch hands it out once, refuses the next claim and reset, keeps the
// commit under it, and a reopen (or WAL replay) keeps the counter there.
func TestReview2_LastGenerationBatchReopen(t *testing.T) {
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
