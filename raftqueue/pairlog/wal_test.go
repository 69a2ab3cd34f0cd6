package pairlog_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/zeze-go/mq/raftqueue"
	"github.com/zeze-go/mq/raftqueue/pairlog"
	"github.com/zeze-go/mq/store"
)

// This file is an external test package: raftqueue, whose WALLog a node
// keeps a pair's log in, imports pairlog.

// TestLog_WALDurable: over the node's WAL, a cut tail and the entries that
// replaced it are what a reopened log holds.
func TestLog_WALDurable(t *testing.T) {
	dir := t.TempDir()
	stable := filepath.Join(dir, "stable.db")
	open := func() (*store.WAL, *raftboltdb.BoltStore, *pairlog.Log) {
		w, err := store.OpenWAL(filepath.Join(dir, "wal"), store.WALOptions{})
		if err != nil {
			t.Fatal(err)
		}
		wl, err := raftqueue.OpenWALLog(w, "dw/t/0")
		if err == nil {
			err = w.FinishRecovery()
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := raftboltdb.New(raftboltdb.Options{Path: stable})
		if err != nil {
			t.Fatal(err)
		}
		l, err := pairlog.OpenLog(wl, b, 0)
		if err != nil {
			t.Fatal(err)
		}
		return w, b, l
	}
	ents := func(first uint64, epochs ...uint64) []*raft.Log {
		out := make([]*raft.Log, len(epochs))
		for i, e := range epochs {
			idx := first + uint64(i)
			out[i] = &raft.Log{Index: idx, Term: e, Type: raft.LogCommand, Data: fmt.Appendf(nil, "%d@%d", idx, e)}
		}
		return out
	}
	w, b, l := open()
	if err := l.SetEpoch(1); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(pairlog.Append{Epoch: 1, Entries: ents(1, 1, 1, 1, 1)}); err != nil {
		t.Fatal(err)
	}
	if err := l.SetEpoch(2); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(pairlog.Append{Epoch: 2, PrevIndex: 2, PrevEpoch: 1, Entries: ents(3, 2, 2)}); err != nil {
		t.Fatal(err)
	}
	b.Close()
	w.Close()
	w, b, l = open()
	defer w.Close()
	defer b.Close()
	last, _, err := l.Last()
	if err != nil {
		t.Fatal(err)
	}
	es, err := l.Entries(1, last)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range es {
		got = append(got, string(e.Data))
	}
	if l.Epoch() != 2 || !slices.Equal(got, []string{"1@1", "2@1", "3@2", "4@2"}) {
		t.Fatalf("reopened at epoch %d holding %v", l.Epoch(), got)
	}
}
