package raftqueue

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/memfs"
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
// An empty log appends next at first.
type raftLogModel struct {
	first uint64
	ents  []*raft.Log
}

func (m *raftLogModel) last() uint64 { return m.first + uint64(len(m.ents)) - 1 }

// logOp is one call raft makes on its log: StoreLogs(logs), or, with logs
// nil, DeleteRange(lo, hi).
type logOp struct {
	logs   []*raft.Log
	lo, hi uint64
}

func (op logOp) String() string {
	if op.logs == nil {
		return fmt.Sprintf("DeleteRange(%d, %d)", op.lo, op.hi)
	}
	return fmt.Sprintf("StoreLogs(%d-%d)", op.logs[0].Index, op.logs[len(op.logs)-1].Index)
}

// run makes the call on l.
func (op logOp) run(l *WALLog) error {
	if op.logs == nil {
		return l.DeleteRange(op.lo, op.hi)
	}
	return l.StoreLogs(op.logs)
}

// apply makes the call on the model: what the log holds once it returned.
func (m *raftLogModel) apply(op logOp) {
	if op.logs != nil {
		from := op.logs[0].Index
		if len(m.ents) == 0 || from < m.first {
			m.first, m.ents = from, nil
		}
		m.ents = append(m.ents[:from-m.first:from-m.first], op.logs...)
		return
	}
	switch {
	case len(m.ents) == 0 || op.hi < m.first || op.lo > m.last():
	case op.lo > m.first:
		m.ents = m.ents[:op.lo-m.first]
	case op.hi >= m.last():
		m.first, m.ents = op.hi+1, nil
	default:
		m.ents = m.ents[op.hi+1-m.first:]
		m.first = op.hi + 1
	}
}

// applied returns a copy of the model with op applied.
func (m *raftLogModel) applied(op logOp) *raftLogModel {
	c := &raftLogModel{first: m.first, ents: slices.Clip(m.ents)}
	c.apply(op)
	return c
}

// check compares the store with the model, entry by entry.
func (m *raftLogModel) check(t *testing.T, l *WALLog, when string) {
	t.Helper()
	if d := m.diff(l); d != "" {
		t.Fatalf("%s: %s", when, d)
	}
}

// diff says how the log differs from the model, or "" if it does not: the
// same bounds, the same entries, nothing around them.
func (m *raftLogModel) diff(l *WALLog) string {
	first, _ := l.FirstIndex()
	last, _ := l.LastIndex()
	wantFirst, wantLast := m.first, m.last()
	if len(m.ents) == 0 {
		wantFirst, wantLast = 0, 0
	}
	if first != wantFirst || last != wantLast {
		return fmt.Sprintf("log %d-%d, want %d-%d", first, last, wantFirst, wantLast)
	}
	for i, want := range m.ents {
		var got raft.Log
		if err := l.GetLog(m.first+uint64(i), &got); err != nil {
			return fmt.Sprintf("GetLog(%d): %v", m.first+uint64(i), err)
		}
		if got.Index != want.Index || got.Term != want.Term || got.Type != want.Type ||
			!bytes.Equal(got.Data, want.Data) || !bytes.Equal(got.Extensions, want.Extensions) ||
			!got.AppendedAt.Equal(want.AppendedAt) {
			return fmt.Sprintf("entry %d is %+v, want %+v", want.Index, got, *want)
		}
	}
	var e raft.Log
	if err := l.GetLog(wantLast+1, &e); !errors.Is(err, raft.ErrLogNotFound) {
		return fmt.Sprintf("GetLog past the end: %v", err)
	}
	if len(m.ents) > 0 && m.first > 1 {
		if err := l.GetLog(m.first-1, &e); !errors.Is(err, raft.ErrLogNotFound) {
			return fmt.Sprintf("GetLog before the first: %v", err)
		}
	}
	return ""
}

// raftLogGen makes the calls raft makes on its log, at random: appends
// after the last entry; a follower's conflicting tail deleted, then
// replaced (or not yet: a crash, or a compaction, may come between);
// compaction keeping a tail; the whole log deleted after a snapshot
// install, then appends after the snapshot.
type raftLogGen struct {
	rng     *rand.Rand
	term    uint64
	maxData int
}

func newRaftLogGen(seed uint64, maxData int) *raftLogGen {
	return &raftLogGen{rng: rand.New(rand.NewPCG(seed, 7)), term: 1, maxData: maxData}
}

// entries returns k new entries from index from, of the current term.
func (g *raftLogGen) entries(from uint64, k int) []*raft.Log {
	logs := make([]*raft.Log, k)
	for i := range logs {
		data := make([]byte, g.rng.IntN(g.maxData))
		for j := range data {
			data[j] = byte(g.rng.Uint32())
		}
		logs[i] = &raft.Log{Index: from + uint64(i), Term: g.term, Type: raft.LogCommand, Data: data,
			AppendedAt: time.Unix(0, int64(g.rng.Uint64()>>1)-1<<62)}
		if g.rng.IntN(4) == 0 {
			logs[i].Extensions = []byte("ext")
		}
	}
	return logs
}

// next returns the next calls on a log that holds m.
func (g *raftLogGen) next(m *raftLogModel) []logOp {
	n := len(m.ents)
	switch r := g.rng.IntN(19); {
	case r < 10 || n == 0: // append after the last
		next := m.last() + 1
		if n == 0 {
			next = m.first
		}
		return []logOp{{logs: g.entries(next, 1+g.rng.IntN(20))}}
	case r < 14: // a follower's conflicting tail, then (mostly) its replacement
		at := m.first + uint64(g.rng.IntN(n))
		g.term++
		ops := []logOp{{lo: at, hi: m.last()}}
		if r < 13 {
			ops = append(ops, logOp{logs: g.entries(at, 1+g.rng.IntN(10))})
		}
		return ops
	case r < 18 && n > 1: // compaction, keeping a tail
		hi := m.first + uint64(g.rng.IntN(n-1))
		return []logOp{{lo: m.first, hi: hi}}
	default: // a snapshot installed: the whole log goes, and raft appends after it
		snap := m.last() + uint64(g.rng.IntN(50))
		return []logOp{{lo: m.first, hi: m.last()}, {logs: g.entries(snap+1, 1+g.rng.IntN(5))}}
	}
}

// TestWALLog_Model drives the log as raft does (raftLogGen) against a
// model, reopening it now and then; small segments make the WAL delete
// segments as compaction frees them.
func TestWALLog_Model(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { walLogModelRun(t, seed) })
	}
}

func walLogModelRun(t *testing.T, seed uint64) {
	g := newRaftLogGen(seed, 3000)
	dir := t.TempDir()
	const segSize = 64 << 10
	n := openWALLogNode(t, dir, segSize)
	defer func() { n.close() }()
	m := &raftLogModel{first: 1}
	for step := range 300 {
		if g.rng.IntN(20) == 0 {
			n.close()
			n = openWALLogNode(t, dir, segSize)
		} else {
			for _, op := range g.next(m) {
				if err := op.run(n.l); err != nil {
					t.Fatalf("step %d: %v: %v", step, op, err)
				}
				m.apply(op)
			}
		}
		m.check(t, n.l, fmt.Sprintf("step %d", step))
	}
	// Compact all but the last entry: the WAL keeps only what holds it.
	if len(m.ents) > 1 {
		op := logOp{lo: m.first, hi: m.last() - 1}
		if err := op.run(n.l); err != nil {
			t.Fatal(err)
		}
		m.apply(op)
	}
	n.close()
	n = openWALLogNode(t, dir, segSize)
	m.check(t, n.l, "at the end")
	segs, _ := filepath.Glob(filepath.Join(dir, "*.wal"))
	if len(segs) > 3 {
		t.Errorf("%d segments left for one entry and a prefix record", len(segs))
	}
}

// TestWALLog_Refusals: entries with a gap, and a hole deleted from the
// middle of the log, are refused. (A failed write or sync:
// TestWALLog_Faults.)
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

// TestWALLog_TailThenCompaction: a follower's conflicting tail deleted,
// then a compaction (raft's snapshot goroutine) before the replacement is
// appended. The compaction keeps entries below the tail, so the tail
// record must outlive it: with one segment a write, the tail's segment is
// deleted as soon as it is released, and a restart would bring the tail
// back from the entries' record.
func TestWALLog_TailThenCompaction(t *testing.T) {
	dir := t.TempDir()
	n := openWALLogNode(t, dir, 1)
	var logs []*raft.Log
	for i := uint64(1); i <= 10; i++ {
		logs = append(logs, &raft.Log{Index: i, Term: 1, Data: []byte{byte(i)}, AppendedAt: time.Unix(0, 0)})
	}
	if err := n.l.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
	if err := n.l.DeleteRange(6, 10); err != nil {
		t.Fatal(err)
	}
	if err := n.l.DeleteRange(1, 2); err != nil {
		t.Fatal(err)
	}
	m := &raftLogModel{first: 3, ents: logs[2:5]}
	m.check(t, n.l, "before the restart")
	n.close()
	n = openWALLogNode(t, dir, 1)
	defer n.close()
	m.check(t, n.l, "after the restart")
}

// TestWALLog_GetLogDuringCompaction: raft's replication reads entries
// while its snapshot goroutine compacts them away; an entry dropped
// meanwhile must read as it was or as raft.ErrLogNotFound (raft then sends
// a snapshot), never as another error, though its segment is deleted and
// the WAL's handle to it closed under the read.
func TestWALLog_GetLogDuringCompaction(t *testing.T) {
	w, l, err := openMemLog(memfs.New(), 4<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	const last = 3000
	errc := make(chan error, 1)
	go func() {
		defer close(errc)
		for i := uint64(1); i <= last; i += 10 {
			logs := make([]*raft.Log, 10)
			for j := range logs {
				logs[j] = &raft.Log{Index: i + uint64(j), Term: 1, Data: make([]byte, 100)}
			}
			if err := l.StoreLogs(logs); err != nil {
				errc <- err
				return
			}
			if i > 50 {
				if err := l.DeleteRange(i-50, i-20); err != nil {
					errc <- err
					return
				}
			}
		}
	}()
	reads, notFound := 0, 0
	for {
		select {
		case err, ok := <-errc:
			if ok {
				t.Fatal(err)
			}
			t.Logf("%d reads, %d of entries compacted away", reads, notFound)
			return
		default:
		}
		// The first entry, then the last: each read is of another record
		// than the one before, so that it reads the WAL.
		i, _ := l.FirstIndex()
		if reads%2 == 1 {
			i, _ = l.LastIndex()
		}
		var e raft.Log
		err := l.GetLog(i, &e)
		reads++
		switch {
		case errors.Is(err, raft.ErrLogNotFound):
			notFound++
		case err != nil:
			t.Fatalf("GetLog(%d) while compacting: %v", i, err)
		case e.Index != i:
			t.Fatalf("GetLog(%d) read entry %d", i, e.Index)
		}
	}
}

// TestWALLog_ReplayCostsItsEntries: a log written one entry per record,
// with a compaction now and then, replays at Open looking at a few
// indexes per entry, not at the whole log for each record (a node whose
// pair log was long took minutes to open).
func TestWALLog_ReplayCostsItsEntries(t *testing.T) {
	dir := t.TempDir()
	n := openWALLogNode(t, dir, 1<<20)
	const entries = 4000
	for i := uint64(1); i <= entries; i++ {
		if err := n.l.StoreLogs([]*raft.Log{{Index: i, Term: 1, Data: []byte{byte(i)}, AppendedAt: time.Unix(0, 0)}}); err != nil {
			t.Fatal(err)
		}
		if i%1000 == 0 {
			first, _ := n.l.FirstIndex()
			if err := n.l.DeleteRange(first, i-500); err != nil {
				t.Fatal(err)
			}
		}
	}
	n.close()
	n = openWALLogNode(t, dir, 1<<20)
	defer n.close()
	if first, _ := n.l.FirstIndex(); first != 3501 {
		t.Fatalf("first index %d after the restart, want 3501", first)
	}
	if got := n.l.replayScanned; got > 4*entries {
		t.Fatalf("the replay looked at %d indexes for %d entries", got, entries)
	}
}
