package raftqueue

import (
	"fmt"
	"math"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/store"
)

// A history is what the clients of a fault test did to the partition and
// what they were told, for the linearizability check (porcupine): appends
// of one message each, answered with an offset or an unknown outcome, and
// reads of one offset, answered with the ID stored there or none.
type history struct {
	start time.Time

	mu       sync.Mutex // guards the fields below
	ops      []porcupine.Operation
	acks     []ack
	reads    []read
	maxAcked int64 // the highest offset acked, -1 before any
}

// ack is one acknowledged append: the ID, where the ack said it went, the
// replica that acked it and when.
type ack struct {
	id      string
	off     uint64
	dup     bool
	replica raft.ServerID
	ret     int64
}

// read is one answered read: the offset, the ID found ("" for none), the
// replica that served it and when it was called.
type read struct {
	off     uint64
	id      string
	replica raft.ServerID
	call    int64
}

type opKind uint8

const (
	opAppend opKind = iota + 1
	opRead
	opFinal // the whole log, read once the clients have stopped
)

type logInput struct {
	kind opKind
	id   string // opAppend
	off  uint64 // opRead
}

type logOutput struct {
	unknown bool   // opAppend: ErrUnknownOutcome, the append may or may not have happened
	off     uint64 // opAppend: the acked offset
	dup     bool   // opAppend: the ack said the ID was stored already
	id      string // opRead: the ID at the offset, "" for none
}

// unknownReturn is the return time of an append of unknown outcome: it may
// take effect at any time after its call.
const unknownReturn = math.MaxInt64

func newHistory() *history {
	return &history{start: time.Now(), maxAcked: -1}
}

// now is a history timestamp: monotonic nanoseconds since the start.
func (h *history) now() int64 { return int64(time.Since(h.start)) }

func (h *history) add(op porcupine.Operation) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, op)
}

// appended records an append answered with a by replica.
func (h *history) appended(client int, id string, call, ret int64, a store.Ack, replica raft.ServerID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, porcupine.Operation{
		ClientId: client, Input: logInput{kind: opAppend, id: id}, Call: call,
		Output: logOutput{off: a.Offset, dup: a.Duplicate}, Return: ret,
	})
	h.acks = append(h.acks, ack{id: id, off: a.Offset, dup: a.Duplicate, replica: replica, ret: ret})
	h.maxAcked = max(h.maxAcked, int64(a.Offset))
}

// unknown records an append whose outcome is unknown.
func (h *history) unknown(client int, id string, call int64) {
	h.add(porcupine.Operation{
		ClientId: client, Input: logInput{kind: opAppend, id: id}, Call: call,
		Output: logOutput{unknown: true}, Return: unknownReturn,
	})
}

// read records a read of off that found id ("" for none) on replica.
func (h *history) read(client int, off uint64, id string, call, ret int64, replica raft.ServerID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, porcupine.Operation{
		ClientId: client, Input: logInput{kind: opRead, off: off}, Call: call,
		Output: logOutput{id: id}, Return: ret,
	})
	h.reads = append(h.reads, read{off: off, id: id, replica: replica, call: call})
}

// highest returns the highest offset acked so far, or -1.
func (h *history) highest() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.maxAcked
}

// logModel is the partition as a sequential log: an append of an ID not in
// the log stores it at the end and returns that offset, an append of an ID
// in the log returns the offset it has (a duplicate, as store's dedup
// answers: Ack.Duplicate with the first copy's offset), a read returns the
// ID at the offset or none past the end. The history ends with one read of
// the whole log, final. The log only grows, so in any linearization every
// state is a prefix of final: the state is the prefix's length, and an
// append that would leave final's prefixes cannot be linearized there. An
// append of unknown outcome whose ID final lacks never took effect.
func logModel(final []string) porcupine.Model {
	at := make(map[string]int, len(final))
	for off, id := range final {
		at[id] = off
	}
	return porcupine.Model{
		Init: func() interface{} { return 0 },
		Step: func(state, input, output interface{}) (bool, interface{}) {
			n, in, out := state.(int), input.(logInput), output.(logOutput)
			switch in.kind {
			case opAppend:
				off, ok := at[in.id]
				switch {
				case ok && off < n: // stored already
					return out.unknown || out.off == uint64(off) && out.dup, n
				case ok && off == n: // stored now
					return out.unknown || out.off == uint64(off) && !out.dup, n + 1
				default: // stored later by another call, or never
					return !ok && out.unknown, n
				}
			case opRead:
				if in.off < uint64(n) {
					return out.id == final[in.off], n
				}
				return out.id == "", n
			default:
				return n == len(final), n
			}
		},
		Hash: func(state interface{}) uint64 { return uint64(state.(int)) },
		DescribeOperation: func(input, output interface{}) string {
			in, out := input.(logInput), output.(logOutput)
			switch {
			case in.kind == opRead && out.id == "":
				return fmt.Sprintf("read(%d) → none", in.off)
			case in.kind == opRead:
				return fmt.Sprintf("read(%d) → %s", in.off, out.id)
			case in.kind == opFinal:
				return fmt.Sprintf("final log of %d", len(final))
			case out.unknown:
				return fmt.Sprintf("append(%s) → unknown", in.id)
			case out.dup:
				return fmt.Sprintf("append(%s) → %d (duplicate)", in.id, out.off)
			default:
				return fmt.Sprintf("append(%s) → %d", in.id, out.off)
			}
		},
		DescribeState: func(state interface{}) string {
			return fmt.Sprintf("log of %d", state.(int))
		},
	}
}

// checkTimeout bounds the linearizability check; a history it cannot
// decide within it counts as not shown linearizable.
const checkTimeout = 30 * time.Second

// verdict is what the checks of a fault test found.
type verdict struct {
	ops        int                   // operations checked
	lin        porcupine.CheckResult // porcupine's answer
	lost       []string              // acked IDs missing from the final log
	moved      []string              // acked at one offset, stored at another: acks of a deposed leader
	twice      []string              // IDs stored twice
	notLeader  []string              // acks by a replica that did not lead a term holding the ID
	splitTerms []string              // terms in which two replicas sent AppendEntries
	stale      []string              // reads that missed an append acked before they began
	wrong      []string              // reads that found an ID the final log has elsewhere or not at all
}

// add adds o, another partition's verdict, to v.
func (v *verdict) add(o verdict) {
	if v.ops == 0 || o.lin != porcupine.Ok {
		v.lin = o.lin
	}
	v.ops += o.ops
	v.lost = append(v.lost, o.lost...)
	v.moved = append(v.moved, o.moved...)
	v.twice = append(v.twice, o.twice...)
	v.notLeader = append(v.notLeader, o.notLeader...)
	v.splitTerms = append(v.splitTerms, o.splitTerms...)
	v.stale = append(v.stale, o.stale...)
	v.wrong = append(v.wrong, o.wrong...)
}

func (v verdict) ok() bool {
	return v.lin == porcupine.Ok &&
		len(v.lost)+len(v.moved)+len(v.twice)+len(v.notLeader)+len(v.splitTerms)+len(v.stale)+len(v.wrong) == 0
}

func (v verdict) String() string {
	return fmt.Sprintf("%d operations: linearizable %s; %d acked and lost, %d acked at another offset, %d stored twice, "+
		"%d acked by a replica that did not lead the term, %d terms with two leaders, %d stale reads, %d wrong reads",
		v.ops, v.lin, len(v.lost), len(v.moved), len(v.twice), len(v.notLeader), len(v.splitTerms), len(v.stale), len(v.wrong))
}

// report fails t with what v found, a few examples of each.
func (v verdict) report(t testing.TB) {
	t.Helper()
	if v.ok() {
		return
	}
	t.Errorf("%v", v)
	for _, l := range []struct {
		what string
		ids  []string
	}{{"lost", v.lost}, {"moved", v.moved}, {"twice", v.twice}, {"not the leader", v.notLeader}, {"two leaders", v.splitTerms},
		{"stale reads", v.stale}, {"wrong reads", v.wrong}} {
		if len(l.ids) > 0 {
			t.Errorf("%s: %v", l.what, l.ids[:min(len(l.ids), 5)])
		}
	}
}

// check checks the history against final, the whole log once the clients
// stopped (the replicas hold it alike), and terms, the terms of the entries
// holding each ID in the leader's raft log: every ack is in final at its
// offset, acked by the leader of a term of an entry holding it (leaderOf),
// no ID stored twice, and the history linearizable. A failing check writes
// porcupine's visualization into t's artifact directory.
func (h *history) check(t testing.TB, final []store.Message, terms map[string][]uint64, leaderOf func(uint64) (raft.ServerID, bool)) verdict {
	t.Helper()
	var v verdict
	ids := make([]string, len(final))
	at := map[string]uint64{}
	for i, m := range final {
		if m.Offset != uint64(i) {
			t.Fatalf("the final log has offset %d at position %d", m.Offset, i)
		}
		if _, dup := at[m.ID]; dup {
			v.twice = append(v.twice, m.ID)
		}
		ids[i], at[m.ID] = m.ID, m.Offset
	}
	h.mu.Lock()
	acks := append([]ack(nil), h.acks...)
	reads := append([]read(nil), h.reads...)
	ops := h.prune(at)
	h.mu.Unlock()
	v.stale, v.wrong = checkReads(reads, acks, ids)
	for _, a := range acks {
		off, ok := at[a.id]
		switch {
		case !ok:
			v.lost = append(v.lost, fmt.Sprintf("%s@%d", a.id, a.off))
		case off != a.off:
			v.moved = append(v.moved, fmt.Sprintf("%s acked at %d by %s, stored at %d", a.id, a.off, a.replica, off))
		}
		if ok && !ledAny(a.replica, terms[a.id], leaderOf) {
			v.notLeader = append(v.notLeader, fmt.Sprintf("%s acked by %s, in entries of terms %v", a.id, a.replica, terms[a.id]))
		}
	}
	end := h.now()
	ops = append(ops, porcupine.Operation{Input: logInput{kind: opFinal}, Call: end, Output: logOutput{}, Return: end})
	v.ops = len(ops)
	model := logModel(ids)
	var info porcupine.LinearizationInfo
	v.lin, info = porcupine.CheckOperationsVerbose(model, ops, checkTimeout)
	if v.lin != porcupine.Ok {
		path := filepath.Join(t.ArtifactDir(), "history.html")
		if err := porcupine.VisualizePath(model, info, path); err != nil {
			t.Logf("visualize: %v", err)
		} else {
			t.Logf("porcupine's view of the history: %s (kept with -artifacts)", path)
		}
	}
	return v
}

// checkReads returns the reads that found none at an offset that an ack
// returned before the read began had reached (stale), and those that found
// an ID the final log does not hold there (wrong).
func checkReads(reads []read, acks []ack, final []string) (stale, wrong []string) {
	sort.Slice(acks, func(i, j int) bool { return acks[i].ret < acks[j].ret })
	reached := make([]uint64, len(acks)) // reached[k]: 1 + the highest offset acked by acks[:k+1]
	var hi uint64
	for k, a := range acks {
		hi = max(hi, a.off+1)
		reached[k] = hi
	}
	for _, r := range reads {
		switch {
		case r.id == "":
			k := sort.Search(len(acks), func(k int) bool { return acks[k].ret >= r.call })
			if k > 0 && r.off < reached[k-1] {
				stale = append(stale, fmt.Sprintf("read(%d) → none at %s, after offset %d was acked", r.off, r.replica, reached[k-1]-1))
			}
		case r.off >= uint64(len(final)) || final[r.off] != r.id:
			wrong = append(wrong, fmt.Sprintf("read(%d) → %s at %s", r.off, r.id, r.replica))
		}
	}
	return stale, wrong
}

// ledAny reports whether replica led one of terms.
func ledAny(replica raft.ServerID, terms []uint64, leaderOf func(uint64) (raft.ServerID, bool)) bool {
	for _, term := range terms {
		if id, ok := leaderOf(term); ok && id == replica {
			return true
		}
	}
	return false
}

// prune returns the operations to check: all but the appends of unknown
// outcome that cannot have taken effect, which the model would accept as
// no-ops anywhere and which only widen the search: those of an ID that the
// final log lacks, or that another append stored (acked without
// Duplicate). at holds the final log's offsets by ID. h.mu is held.
func (h *history) prune(at map[string]uint64) []porcupine.Operation {
	stored := map[string]bool{}
	for _, op := range h.ops {
		if in, out := op.Input.(logInput), op.Output.(logOutput); in.kind == opAppend && !out.unknown && !out.dup {
			stored[in.id] = true
		}
	}
	ops := make([]porcupine.Operation, 0, len(h.ops)+1)
	for _, op := range h.ops {
		if in, out := op.Input.(logInput), op.Output.(logOutput); in.kind == opAppend && out.unknown {
			if _, ok := at[in.id]; !ok || stored[in.id] {
				continue
			}
		}
		ops = append(ops, op)
	}
	return ops
}

// clients are a fault test's writers and readers: faultWriters goroutines
// appending messages of their own IDs (send retries one until it is acked),
// and faultReaders reading.
type clients struct {
	t     testing.TB
	acked atomic.Int64 // appends acked; send adds to it
	stop  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
	errs  chan error
}

func newClients(t testing.TB) *clients {
	return &clients{t: t, stop: make(chan struct{}), errs: make(chan error, faultWriters+faultReaders)}
}

// start starts the writers, each sending c<k>-<n> for n = 0, 1, ... with
// send, and the readers, each running read until the clients stop.
func (c *clients) start(send func(client int, id string) error, read func(client int)) {
	for k := range faultWriters + faultReaders {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			if k >= faultWriters {
				read(k)
				return
			}
			for n := 0; !c.stopped(); n++ {
				if err := send(k, fmt.Sprintf("c%d-%d", k, n)); err != nil {
					c.errs <- err
					return
				}
			}
		}()
	}
}

// halt stops the clients, each writer once its message is acked, and fails
// the test with their errors.
func (c *clients) halt() {
	c.once.Do(func() { close(c.stop) })
	c.wg.Wait()
	for {
		select {
		case err := <-c.errs:
			c.t.Error(err)
		default:
			return
		}
	}
}

func (c *clients) stopped() bool {
	select {
	case <-c.stop:
		return true
	default:
		return false
	}
}

// progress waits until n more appends are acked.
func (c *clients) progress(n int64) {
	c.t.Helper()
	want := c.acked.Load() + n
	deadline := time.Now().Add(patience)
	for c.acked.Load() < want {
		if time.Now().After(deadline) {
			c.t.Fatalf("%d appends acked, %d wanted within %v", c.acked.Load(), want, patience)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
