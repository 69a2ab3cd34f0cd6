package pairlog

import (
	"fmt"
	"testing"

	"github.com/hashicorp/raft"
)

// ents returns entries from index first on, one per epoch given.
func ents(first uint64, epochs ...uint64) []*raft.Log {
	out := make([]*raft.Log, len(epochs))
	for i, e := range epochs {
		idx := first + uint64(i)
		out[i] = &raft.Log{Index: idx, Term: e, Type: raft.LogCommand, Data: fmt.Appendf(nil, "%d@%d", idx, e)}
	}
	return out
}

// entriesOf returns every entry s holds.
func entriesOf(t *testing.T, s raft.LogStore) []raft.Log {
	t.Helper()
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	var out []raft.Log
	for i := first; i <= last && last > 0; i++ {
		var e raft.Log
		if err := s.GetLog(i, &e); err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		out = append(out, e)
	}
	return out
}
