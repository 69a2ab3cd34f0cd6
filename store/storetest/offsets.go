package storetest

import (
	"testing"

	"github.com/zeze-go/mq/store"
)

// claim runs OpClaim of group at now and checks that its generation is new:
// above every generation seen before (after).
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
		// An offset may go back (a consumer re-reading): the store does not
		// judge it.
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
}
