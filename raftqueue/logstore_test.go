package raftqueue

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/store"
)

// walLogNode is one WAL with one group log in it, reopened as a node does:
// the WAL, then the log (retaining its records), then FinishRecovery.
type walLogNode struct {
	t   testing.TB
	dir string
	w   *store.WAL
	l   *WALLog
}

func openWALLogNode(t testing.TB, dir string, segSize int64) *walLogNode {
	t.Helper()
	w, err := store.OpenWAL(dir, store.WALOptions{SegmentSize: segSize})
	if err != nil {
		t.Fatalf("OpenWAL: %v", err)
	}
	l, err := OpenWALLog(w, "g")
	if err != nil {
		w.Close()
		t.Fatalf("OpenWALLog: %v", err)
	}
	if err := w.FinishRecovery(); err != nil {
		w.Close()
		t.Fatalf("FinishRecovery: %v", err)
	}
	return &walLogNode{t: t, dir: dir, w: w, l: l}
}

func (n *walLogNode) close() {
	n.t.Helper()
	if err := n.w.Close(); err != nil {
		n.t.Fatalf("WAL Close: %v", err)
	}
}

// raftLogModel is what the log must hold: entries by index, first..last.
type raftLogModel struct {
	first uint64
	ents  []*raft.Log
}

func (m *raftLogModel) last() uint64 { return m.first + uint64(len(m.ents)) - 1 }

// check compares the store with the model, entry by entry.
func (m *raftLogModel) check(t *testing.T, l *WALLog, when string) {
	t.Helper()
	first, _ := l.FirstIndex()
	last, _ := l.LastIndex()
	wantFirst, wantLast := m.first, m.last()
	if len(m.ents) == 0 {
		wantFirst, wantLast = 0, 0
	}
	if first != wantFirst || last != wantLast {
		t.Fatalf("%s: log %d-%d, want %d-%d", when, first, last, wantFirst, wantLast)
	}
	for i, want := range m.ents {
		var got raft.Log
		if err := l.GetLog(m.first+uint64(i), &got); err != nil {
			t.Fatalf("%s: GetLog(%d): %v", when, m.first+uint64(i), err)
		}
		if got.Index != want.Index || got.Term != want.Term || got.Type != want.Type ||
			!bytes.Equal(got.Data, want.Data) || !bytes.Equal(got.Extensions, want.Extensions) ||
			!got.AppendedAt.Equal(want.AppendedAt) {
			t.Fatalf("%s: entry %d is %+v, want %+v", when, want.Index, got, *want)
		}
	}
	var e raft.Log
	if err := l.GetLog(wantLast+1, &e); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("%s: GetLog past the end: %v", when, err)
	}
	if len(m.ents) > 0 && m.first > 1 {
		if err := l.GetLog(m.first-1, &e); !errors.Is(err, raft.ErrLogNotFound) {
			t.Fatalf("%s: GetLog before the first: %v", when, err)
		}
	}
}

// TestWALLog_Model drives the log as raft does (appends, a follower's
// conflicting tail replaced, compaction, the whole log removed after a
// snapshot install) in random order, reopening it now and then, against
// a model; small segments make the WAL delete segments as compaction frees
// them.
func TestWALLog_Model(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { walLogModelRun(t, seed) })
	}
}

func walLogModelRun(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	dir := t.TempDir()
	const segSize = 64 << 10
	n := openWALLogNode(t, dir, segSize)
	defer func() { n.close() }()
	m := &raftLogModel{first: 1}
	term := uint64(1)
	entry := func(i uint64) *raft.Log {
		data := make([]byte, rng.IntN(3000))
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		e := &raft.Log{Index: i, Term: term, Type: raft.LogCommand, Data: data,
			AppendedAt: time.Unix(0, int64(rng.Uint64()>>1)-1<<62)}
		if rng.IntN(4) == 0 {
			e.Extensions = []byte("ext")
		}
		return e
	}
	store := func(from uint64, k int) {
		var logs []*raft.Log
		for i := range k {
			logs = append(logs, entry(from+uint64(i)))
		}
		if err := n.l.StoreLogs(logs); err != nil {
			t.Fatalf("StoreLogs: %v", err)
		}
		if len(m.ents) == 0 || from < m.first {
			m.first, m.ents = from, nil
		}
		m.ents = append(m.ents[:from-m.first], logs...)
	}
	for step := range 300 {
		switch r := rng.IntN(20); {
		case r < 10 || len(m.ents) == 0: // append after the last
			next := m.last() + 1
			if len(m.ents) == 0 {
				next = m.first
			}
			store(next, 1+rng.IntN(20))
		case r < 13: // a follower's conflicting tail, then its replacement
			at := m.first + uint64(rng.IntN(len(m.ents)))
			if err := n.l.DeleteRange(at, m.last()); err != nil {
				t.Fatalf("DeleteRange tail: %v", err)
			}
			m.ents = m.ents[:at-m.first]
			term++
			store(at, 1+rng.IntN(10))
		case r < 16: // compaction, keeping a tail
			hi := m.first + uint64(rng.IntN(len(m.ents)))
			if hi == m.last() {
				hi--
			}
			if hi < m.first {
				continue
			}
			if err := n.l.DeleteRange(m.first, hi); err != nil {
				t.Fatalf("DeleteRange prefix: %v", err)
			}
			m.ents = m.ents[hi+1-m.first:]
			m.first = hi + 1
		case r < 17: // a snapshot installed: the whole log goes, and raft appends after it
			if err := n.l.DeleteRange(m.first, m.last()); err != nil {
				t.Fatalf("DeleteRange all: %v", err)
			}
			snap := m.last() + uint64(rng.IntN(50))
			m.first, m.ents = snap+1, nil
			store(snap+1, 1+rng.IntN(5))
		case r < 18: // a conflicting tail deleted, then a restart before its replacement
			at := m.first + uint64(rng.IntN(len(m.ents)))
			if err := n.l.DeleteRange(at, m.last()); err != nil {
				t.Fatalf("DeleteRange tail: %v", err)
			}
			if last, _ := n.l.LastIndex(); len(m.ents) > 1 && at > m.first && last != at-1 {
				t.Fatalf("step %d: tail from %d deleted, last %d", step, at, last)
			}
			m.ents = m.ents[:at-m.first]
			n.close()
			n = openWALLogNode(t, dir, segSize)
		default:
			n.close()
			n = openWALLogNode(t, dir, segSize)
		}
		m.check(t, n.l, fmt.Sprintf("step %d", step))
	}
	// Compact all but the last entry: the WAL keeps only what holds it.
	if len(m.ents) > 1 {
		if err := n.l.DeleteRange(m.first, m.last()-1); err != nil {
			t.Fatal(err)
		}
		m.ents = m.ents[len(m.ents)-1:]
		m.first = m.ents[0].Index
	}
	n.close()
	n = openWALLogNode(t, dir, segSize)
	m.check(t, n.l, "at the end")
	segs, _ := filepath.Glob(filepath.Join(dir, "*.wal"))
	if len(segs) > 3 {
		t.Errorf("%d segments left for one entry and a prefix record", len(segs))
	}
}

// TestWALLog_Durable: StoreLogs returns only once its entries are in a
// synced write: a WAL that fails its sync fails StoreLogs, and the log
// then refuses further writes.
func TestWALLog_Refusals(t *testing.T) {
	n := openWALLogNode(t, t.TempDir(), 0)
	defer n.close()
	if err := n.l.StoreLogs([]*raft.Log{{Index: 1}, {Index: 3}}); err == nil {
		t.Fatal("entries with a gap stored")
	}
	if err := n.l.StoreLogs([]*raft.Log{{Index: 1, Term: 1}, {Index: 2, Term: 1}, {Index: 3, Term: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := n.l.DeleteRange(2, 2); err == nil {
		t.Fatal("a hole deleted from the middle of the log")
	}
}
