package metastate

import (
	"slices"
	"testing"
)

// The partitions of a DoubleWrite chunk share one record in the metadata,
// whichever of them a command names.

// chunkSame fails the test unless the partitions first..first+n-1 of "d" in
// s have one record, with Chunk first.
func chunkSame(t *testing.T, s *State, first, n int) Partition {
	t.Helper()
	top, _ := s.Topic("d")
	a := top.Parts[first]
	for j := first; j < first+n; j++ {
		p := top.Parts[j]
		if p.Chunk != first || p.Leader != a.Leader || p.Epoch != a.Epoch || p.Version != a.Version ||
			!slices.Equal(p.Replicas, a.Replicas) || !slices.Equal(p.InSync, a.InSync) {
			t.Fatalf("d/%d %+v differs from d/%d %+v, its chunk's first", j, p, first, a)
		}
	}
	if f, m := top.Chunk(first + n - 1); f != first || m != n {
		t.Fatalf("Chunk(%d) = %d, %d; want %d, %d", first+n-1, f, m, first, n)
	}
	return a
}

// TestPairChunk_CommandsOnAnyMember: commands naming the last, the
// middle, the first partition of a chunk (and a chunk of one) change the
// chunk's record once (Version+1), all of it, nothing of the others; a
// command carrying the version of another chunk, an older version of its
// own, or a partition out of range is refused and changes nothing; a
// snapshot round-trips every step.
func TestPairChunk_CommandsOnAnyMember(t *testing.T) {
	ft := newStateT(t)
	ft.nodes("a", "b", "c", "d", "e")
	ft.must(CreateTopic{Name: "d", Partitions: 7, Type: TypeDoubleWrite, GroupSize: 3}) // {0,1,2} {3,4,5} {6}
	check := func() {
		t.Helper()
		s := ft.s()
		chunkSame(t, s, 0, 3)
		chunkSame(t, s, 3, 3)
		chunkSame(t, s, 6, 1)
		got, err := DecodeSnapshot(encodeSnap(t, s))
		if err != nil || !sameState(s, got) {
			t.Fatalf("snapshot round trip: %v", err)
		}
	}
	check()
	c0, c1 := ft.dwPart(0), ft.dwPart(3)
	ft.must(SetInSync{Topic: "d", Partition: 2, Version: 1, InSync: []string{c0.Leader}})
	check()
	if p := ft.dwPart(1); p.Version != 2 || !slices.Equal(p.InSync, []string{c0.Leader}) {
		t.Fatalf("d/1 after SetInSync naming d/2: %+v", p)
	}
	if p := ft.dwPart(3); p.Version != 1 || !slices.Equal(p.InSync, c1.Replicas) {
		t.Fatalf("d/3, another chunk, changed: %+v", p)
	}
	// Stale: the version the chunk had, the version of another chunk.
	ft.refused(RenewEpoch{Topic: "d", Partition: 1, Version: 1}, ErrStale)
	ft.refused(SetInSync{Topic: "d", Partition: 4, Version: 2, InSync: c1.Replicas}, ErrStale)
	ft.refused(RenewEpoch{Topic: "d", Partition: 7, Version: 1}, ErrInvalid)
	ft.refused(RenewEpoch{Topic: "d", Partition: -1, Version: 1}, ErrInvalid)
	// Promote naming d/1 while the follower is out of sync: refused.
	ft.refused(Promote{Topic: "d", Partition: 1, Version: 2, Leader: c0.Follower()}, ErrNotInSync)
	ft.must(RenewEpoch{Topic: "d", Partition: 1, Version: 2})
	check()
	if p := ft.dwPart(2); p.Epoch != 2 || p.Version != 3 {
		t.Fatalf("d/2 after RenewEpoch naming d/1: %+v", p)
	}
	ft.must(SetInSync{Topic: "d", Partition: 0, Version: 3, InSync: c0.Replicas})
	ft.must(NodeDown{ID: c0.Leader, Session: 1})
	ft.must(Promote{Topic: "d", Partition: 2, Version: 4, Leader: c0.Follower()})
	check()
	p := ft.dwPart(1)
	if p.Leader != c0.Follower() || p.Epoch != 3 || p.Version != 5 {
		t.Fatalf("chunk {0,1,2} after Promote naming d/2: %+v", p)
	}
	ft.must(ReplaceFollower{Topic: "d", Partition: 5, Version: 1})
	ft.must(ReplaceFollower{Topic: "d", Partition: 6, Version: 1})
	check()
	if q := ft.dwPart(4); q.Version != 2 || q.Epoch != 2 || q.Follower() == c1.Follower() {
		t.Fatalf("chunk {3,4,5} after ReplaceFollower naming d/5: %+v", q)
	}
	ft.must(AlterTopic{Name: "d", Partitions: 10}) // {7,8,9}
	check()
	chunkSame(t, ft.s(), 7, 3)
	ft.must(SetInSync{Topic: "d", Partition: 9, Version: 1, InSync: []string{ft.dwPart(7).Leader}})
	check()
	chunkSame(t, ft.s(), 7, 3)
}
