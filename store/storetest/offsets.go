package storetest

import (
	"testing"

	"github.com/zeze-go/mq/store"
)

// claim runs OpClaim of group at now and checks that its generation is new:
// above every generation seen before, which after holds.
func claim(t testing.TB, p Partition, now int64, group string, start store.Start, offset, after uint64) store.Result {
	t.Helper()
	res := apply(t, p, &store.Command{Op: store.OpClaim, Now: now, Group: group, Start: start, Offset: offset})
	if res.Generation <= after {
		t.Fatalf("claim of %s: generation %d, want above %d", group, res.Generation, after)
	}
	return res
}

func commitOffset(group string, offset, generation uint64) *store.Command {
	return &store.Command{Op: store.OpCommitOffset, Now: t0 + 50*sec, Group: group, Offset: offset, Generation: generation}
}

// group returns group's record, failing the test when it has none.
func group(t testing.TB, p Partition, name string) store.GroupState {
	t.Helper()
	g, ok, err := p.Group(name)
	if err != nil || !ok {
		t.Fatalf("Group(%s) = %+v, %v, %v; want a record", name, g, ok, err)
	}
	return g
}

func noGroup(t testing.TB, p Partition, name string) {
	t.Helper()
	if g, ok, err := p.Group(name); ok || err != nil {
		t.Fatalf("Group(%s) = %+v, %v, %v; want no record", name, g, ok, err)
	}
}

var offsetTests = []test{
	{"ClaimStart", func(t *testing.T, p Partition) {
		appendAt(t, p, t0, msg("0"), msg("1"), msg("2"))
		appendAt(t, p, t0+100*sec, msg("3"), msg("4"))
		apply(t, p, &store.Command{Op: store.OpTrim, Now: t0 + 100*sec, MaxAge: 50 * sec}) // log [3, 5)
		noGroup(t, p, "first")
		// One counter for the partition: each claim, of any group, is above
		// the ones before.
		first := claim(t, p, t0+101*sec, "first", store.StartFirst, 99, 0)
		last := claim(t, p, t0+102*sec, "last", store.StartLast, 99, first.Generation)
		at := claim(t, p, t0+103*sec, "at", store.StartAt, 1, last.Generation)
		for _, tc := range []struct {
			name string
			res  store.Result
			want store.GroupState
		}{
			{"first", first, store.GroupState{Offset: 3, Generation: first.Generation, Updated: t0 + 101*sec}},
			{"last", last, store.GroupState{Offset: 5, Generation: last.Generation, Updated: t0 + 102*sec}},
			{"at", at, store.GroupState{Offset: 1, Generation: at.Generation, Updated: t0 + 103*sec}},
		} {
			if tc.res.Found || tc.res.Offset != tc.want.Offset {
				t.Errorf("claim of %s: Found %v, Offset %d; want a new group at %d", tc.name, tc.res.Found, tc.res.Offset, tc.want.Offset)
			}
			if g, ok, err := p.Group(tc.name); g != tc.want || !ok || err != nil {
				t.Errorf("Group(%s) = %+v, %v, %v; want %+v", tc.name, g, ok, err, tc.want)
			}
		}
	}},
	{"ClaimExisting", func(t *testing.T, p Partition) {
		one := claim(t, p, t0, "g", store.StartAt, 4, 0)
		apply(t, p, commitOffset("g", 7, one.Generation))
		// A record keeps its offset: Start applies to a new group only.
		two := claim(t, p, t0+60*sec, "g", store.StartLast, 99, one.Generation)
		if !two.Found || two.Offset != 7 {
			t.Fatalf("second claim: Found %v, Offset %d; want the record's 7", two.Found, two.Offset)
		}
		equal(t, "Group", group(t, p, "g"), store.GroupState{Offset: 7, Generation: two.Generation, Updated: t0 + 60*sec})
	}},
	{"Commit", func(t *testing.T, p Partition) {
		c := claim(t, p, t0, "g", store.StartAt, 0, 0)
		apply(t, p, commitOffset("g", 6, c.Generation))
		equal(t, "Group after commit", group(t, p, "g"), store.GroupState{Offset: 6, Generation: c.Generation, Updated: t0 + 50*sec})
		// An offset may go back, as for a consumer re-reading: the store does
		// not judge it.
		cmd := commitOffset("g", 2, c.Generation)
		cmd.Now = t0 + 51*sec
		apply(t, p, cmd)
		equal(t, "Group after a commit back", group(t, p, "g"), store.GroupState{Offset: 2, Generation: c.Generation, Updated: t0 + 51*sec})
	}},
	{"CommitWithoutRecord", func(t *testing.T, p Partition) {
		// A group without a record accepts generation 0 only, and the
		// commit makes its record.
		applyErr(t, p, commitOffset("h", 5, 3), store.ErrStaleGeneration)
		noGroup(t, p, "h")
		apply(t, p, commitOffset("g", 5, 0))
		equal(t, "Group", group(t, p, "g"), store.GroupState{Offset: 5, Generation: 0, Updated: t0 + 50*sec})
		c := claim(t, p, t0+60*sec, "g", store.StartFirst, 0, 0)
		if !c.Found || c.Offset != 5 {
			t.Fatalf("claim after a commit: Found %v, Offset %d; want the record's 5", c.Found, c.Offset)
		}
		applyErr(t, p, commitOffset("g", 9, 0), store.ErrStaleGeneration)
		equal(t, "Group after a refused commit", group(t, p, "g"), store.GroupState{Offset: 5, Generation: c.Generation, Updated: t0 + 60*sec})
	}},
	{"StaleGeneration", func(t *testing.T, p Partition) {
		old := claim(t, p, t0, "g", store.StartAt, 3, 0)
		apply(t, p, commitOffset("g", 4, old.Generation))
		cur := claim(t, p, t0+60*sec, "g", store.StartAt, 0, old.Generation) // another owner
		want := store.GroupState{Offset: 4, Generation: cur.Generation, Updated: t0 + 60*sec}
		for _, gen := range []uint64{old.Generation, cur.Generation + 1, 0} {
			cmd := commitOffset("g", 8, gen)
			cmd.Now = t0 + 70*sec
			applyErr(t, p, cmd, store.ErrStaleGeneration)
			equal(t, "Group after a stale commit", group(t, p, "g"), want)
		}
		apply(t, p, commitOffset("g", 9, cur.Generation))
		equal(t, "offset", group(t, p, "g").Offset, uint64(9))
	}},
	{"ResetFences", func(t *testing.T, p Partition) {
		owner := claim(t, p, t0, "g", store.StartAt, 2, 0)
		res := apply(t, p, &store.Command{Op: store.OpResetOffset, Now: t0 + 10*sec, Group: "g", Offset: 0})
		if res.Generation <= owner.Generation || res.Offset != 0 {
			t.Fatalf("reset: Generation %d, Offset %d; want above %d, 0", res.Generation, res.Offset, owner.Generation)
		}
		want := store.GroupState{Offset: 0, Generation: res.Generation, Updated: t0 + 10*sec, Reset: true}
		equal(t, "Group after reset", group(t, p, "g"), want)
		applyErr(t, p, commitOffset("g", 5, owner.Generation), store.ErrStaleGeneration)
		equal(t, "Group after the fenced owner's commit", group(t, p, "g"), want)
		apply(t, p, commitOffset("g", 1, res.Generation))
		equal(t, "offset", group(t, p, "g").Offset, uint64(1))
		// The next claim is above the reset's generation.
		c := claim(t, p, t0+60*sec, "g", store.StartAt, 0, res.Generation)
		if !c.Found || c.Offset != 1 {
			t.Fatalf("claim after reset: Found %v, Offset %d", c.Found, c.Offset)
		}
		if group(t, p, "g").Reset {
			t.Fatal("Group after a claim still marked Reset")
		}
	}},
	{"DeleteIdle", func(t *testing.T, p Partition) {
		claim(t, p, t0, "g", store.StartAt, 3, 0)
		res := apply(t, p, &store.Command{Op: store.OpDeleteGroup, Now: t0 + 10*sec, Group: "g", MaxAge: 10 * sec})
		if res.Count != 0 || !res.Found {
			t.Fatalf("delete of a record exactly MaxAge old: Count %d, Found %v; want it kept", res.Count, res.Found)
		}
		equal(t, "offset", group(t, p, "g").Offset, uint64(3))
		res = apply(t, p, &store.Command{Op: store.OpDeleteGroup, Now: t0 + 10*sec + 1, Group: "g", MaxAge: 10 * sec})
		if res.Count != 1 {
			t.Fatalf("delete of an idle record: Count %d, want 1", res.Count)
		}
		noGroup(t, p, "g")
		res = apply(t, p, &store.Command{Op: store.OpDeleteGroup, Now: t0, Group: "g", MaxAge: sec})
		if res.Count != 0 || res.Found {
			t.Fatalf("delete of no record: Count %d, Found %v", res.Count, res.Found)
		}
	}},
	{"DeleteThenClaim", func(t *testing.T, p Partition) {
		old := claim(t, p, t0, "g", store.StartAt, 3, 0)
		other := claim(t, p, t0, "other", store.StartAt, 0, old.Generation)
		apply(t, p, &store.Command{Op: store.OpDeleteGroup, Group: "g"})
		noGroup(t, p, "g")
		equal(t, "other group", group(t, p, "other").Generation, other.Generation)
		apply(t, p, &store.Command{Op: store.OpDeleteGroup, Group: "never"}) // a no-op
		// Generations are never reused, also not those of a deleted group.
		c := claim(t, p, t0+60*sec, "g", store.StartAt, 8, other.Generation)
		if c.Found || c.Offset != 8 {
			t.Fatalf("claim after delete: Found %v, Offset %d; want a new group at 8", c.Found, c.Offset)
		}
		applyErr(t, p, commitOffset("g", 5, old.Generation), store.ErrStaleGeneration)
		equal(t, "Group", group(t, p, "g"), store.GroupState{Offset: 8, Generation: c.Generation, Updated: t0 + 60*sec})
	}},
	{"ClaimLease", func(t *testing.T, p Partition) {
		// A claim with a MaxAge lease waits while the owner changed the
		// record within it; an owner renews it by committing.
		lease := 10 * sec
		leased := func(now int64) *store.Command {
			return &store.Command{Op: store.OpClaim, Now: now, Group: "g", MaxAge: lease}
		}
		owner := apply(t, p, leased(t0)) // no record: no lease to respect
		cmd := commitOffset("g", 4, owner.Generation)
		cmd.Now = t0 + 5*sec
		apply(t, p, cmd)
		held := store.GroupState{Offset: 4, Generation: owner.Generation, Updated: t0 + 5*sec, Lease: lease}
		for _, now := range []int64{t0 + 5*sec, t0 + 14*sec, t0 + 15*sec - 1} {
			res := applyErr(t, p, leased(now), store.ErrClaimed)
			if res.Generation != owner.Generation || res.Offset != 4 {
				t.Fatalf("refused claim: Generation %d, Offset %d; want the holder's %d, 4", res.Generation, res.Offset, owner.Generation)
			}
			equal(t, "Group after a refused claim", group(t, p, "g"), held)
		}
		if !held.Leased(t0+15*sec-1, lease) || held.Leased(t0+15*sec, lease) {
			t.Fatal("GroupState.Leased disagrees with the claim")
		}
		// A renewal moves the lease on and keeps the offset; one of another
		// generation is refused.
		applyErr(t, p, &store.Command{Op: store.OpRenew, Now: t0 + 14*sec, Group: "g", Generation: owner.Generation + 1}, store.ErrStaleGeneration)
		apply(t, p, &store.Command{Op: store.OpRenew, Now: t0 + 8*sec, Group: "g", Generation: owner.Generation})
		held.Updated = t0 + 8*sec
		equal(t, "Group after a renewal", group(t, p, "g"), held)
		applyErr(t, p, leased(t0+17*sec), store.ErrClaimed)
		// A record stamped more than the lease ahead of the claim, the
		// partition's clock having stepped back, holds nothing.
		if held.Leased(held.Updated-lease-1, lease) || !held.Leased(held.Updated-lease, lease) {
			t.Fatal("GroupState.Leased of a record stamped ahead of now")
		}
		// A claimer with a shorter lease respects the holder's longer one.
		short := leased(t0 + 17*sec)
		short.MaxAge = sec
		applyErr(t, p, short, store.ErrClaimed)
		// Without a lease the claim takes the group at once, for a
		// coordinator that knows better; with one, once the lease ran out.
		next := apply(t, p, leased(t0+18*sec))
		if next.Generation <= owner.Generation || next.Offset != 4 {
			t.Fatalf("claim after the lease: Generation %d, Offset %d", next.Generation, next.Offset)
		}
		applyErr(t, p, leased(t0+19*sec), store.ErrClaimed) // the new owner's claim is a lease too
		own := leased(t0 + 19*sec)
		own.Generation = next.Generation // the owner claiming again: not held off by its own lease
		again := apply(t, p, own)
		if again.Generation <= next.Generation {
			t.Fatalf("the owner's claim again: Generation %d, want above %d", again.Generation, next.Generation)
		}
		next = again
		unleased := apply(t, p, &store.Command{Op: store.OpClaim, Now: t0 + 19*sec, Group: "g"})
		if unleased.Generation <= next.Generation {
			t.Fatalf("claim without a lease: Generation %d, want above %d", unleased.Generation, next.Generation)
		}
	}},
	{"Unclaim", func(t *testing.T, p Partition) {
		// OpUnclaim commits like OpCommitOffset and lets go: the next
		// leased claim needs not wait.
		lease := 10 * sec
		owner := claim(t, p, t0, "g", store.StartAt, 2, 0)
		applyErr(t, p, &store.Command{Op: store.OpUnclaim, Now: t0 + sec, Group: "g", Offset: 7, Generation: owner.Generation + 1}, store.ErrStaleGeneration)
		apply(t, p, &store.Command{Op: store.OpUnclaim, Now: t0 + sec, Group: "g", Offset: 7, Generation: owner.Generation})
		equal(t, "Group after unclaim", group(t, p, "g"), store.GroupState{Offset: 7, Generation: owner.Generation, Updated: t0 + sec, Released: true})
		next := apply(t, p, &store.Command{Op: store.OpClaim, Now: t0 + 2*sec, Group: "g", MaxAge: lease})
		if next.Generation <= owner.Generation || next.Offset != 7 {
			t.Fatalf("claim after unclaim: Generation %d, Offset %d; want above %d, 7", next.Generation, next.Offset, owner.Generation)
		}
		if group(t, p, "g").Released {
			t.Fatal("Group after a claim still marked Released")
		}
		// A reset takes the group from its owner but keeps its lease: another
		// claim waits for it, as the owner may still deliver; the owner,
		// fenced, claims again at once with the reset's generation.
		reset := apply(t, p, &store.Command{Op: store.OpResetOffset, Now: t0 + 3*sec, Group: "g", Offset: 1})
		equal(t, "Group after a reset under a lease", group(t, p, "g"),
			store.GroupState{Offset: 1, Generation: reset.Generation, Updated: t0 + 2*sec, Reset: true, Lease: lease})
		applyErr(t, p, &store.Command{Op: store.OpClaim, Now: t0 + 3*sec, Group: "g", MaxAge: lease, Generation: next.Generation}, store.ErrClaimed)
		again := apply(t, p, &store.Command{Op: store.OpClaim, Now: t0 + 3*sec, Group: "g", MaxAge: lease, Generation: reset.Generation})
		if again.Offset != 1 {
			t.Fatalf("claim after a reset: Offset %d, want 1", again.Offset)
		}
		// A reset of a record held by no lease leaves it free.
		apply(t, p, &store.Command{Op: store.OpUnclaim, Now: t0 + 4*sec, Group: "g", Offset: 1, Generation: again.Generation})
		apply(t, p, &store.Command{Op: store.OpResetOffset, Now: t0 + 5*sec, Group: "g", Offset: 0})
		apply(t, p, &store.Command{Op: store.OpClaim, Now: t0 + 5*sec, Group: "g", MaxAge: lease})
		// An OpUnclaim with a missing group is a bad command, as a commit's.
		applyErr(t, p, &store.Command{Op: store.OpUnclaim, Now: t0, Offset: 1}, store.ErrBadCommand)
	}},
}
