package store_test

import (
	"errors"
	"testing"

	"github.com/zeze-go/mq/store"
)

// TestPartition_FenceOutrunsGenerationsOfACopyThatFencedItself: OpFence
// hands out generations past any the copy given up may have handed out
// since it parted from this one, so that no owner from that copy matches
// a generation here. The copy given up may itself have fenced after the
// two parted (its leader led after an earlier accepted loss, at an
// earlier epoch, and the other copy never got that entry). After the
// survivor's own fence and one claim by a consumer here, a stale owner
// from the given-up copy commits: it is refused (before, both counters
// were moved alike, the generations matched, and a position from the
// lost tail replaced the real owner's, skipping what new sends stored).
func TestPartition_FenceOutrunsGenerationsOfACopyThatFencedItself(t *testing.T) {
	a, _ := open(t)                              // the copy given up
	b, _ := open(t)                              // the survivor
	for _, p := range []*store.Partition{a, b} { // the common prefix
		appendAt(t, p, t0, msg("0"), msg("1"), msg("2"), msg("3"), msg("4"))
		claim(t, p, "billing", store.StartFirst, 0)
	}
	// The given-up copy, alone: its leader fenced (a loss accepted
	// earlier), took sends, and a consumer claimed and read its tail.
	apply(t, a, &store.Command{Op: store.OpFence, Now: t0 + sec, Offset: 2})
	appendAt(t, a, t0+sec, msg("a5"), msg("a6"), msg("a7"), msg("a8"), msg("a9"))
	stale := claim(t, a, "billing", store.StartFirst, 0).Generation
	if _, err := commit(a, "billing", stale, 10); err != nil {
		t.Fatal(err)
	}
	// The survivor after the loss of that copy is accepted: its leader
	// fences, new sends take offsets 5.., and a consumer here claims.
	apply(t, b, &store.Command{Op: store.OpFence, Now: t0 + 2*sec, Offset: 3})
	appendAt(t, b, t0+2*sec, msg("b5"), msg("b6"), msg("b7"), msg("b8"), msg("b9"))
	owner := claim(t, b, "billing", store.StartFirst, 0)
	if owner.Offset != 0 {
		t.Fatalf("the survivor's owner claimed at %d, want 0", owner.Offset)
	}
	// The stale owner, whose claim was on the copy given up, commits here.
	res, err := commit(b, "billing", stale, 10)
	if !errors.Is(err, store.ErrStaleGeneration) {
		g := group(t, b, "billing")
		t.Fatalf("a stale owner from the given-up copy (generation %d) committed on the survivor after its fence: %+v, %v; "+
			"the record is now %+v, the survivor's owner holds generation %d and has delivered nothing past 0",
			stale, res, err, g, owner.Generation)
	}
}
