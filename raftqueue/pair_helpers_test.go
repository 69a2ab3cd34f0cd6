package raftqueue

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/raftqueue/pairlog"
	"github.com/zeze-go/mq/store"
)

// pairs is a DoubleWrite pair in one process, each replica with its log in
// its own WAL (a node's), and the test playing the metadata group: it
// decides who leads which epoch (promote, rejoin). Replica i's Appends to
// the other go through a link the test can cut.
type pairs struct {
	t    testing.TB
	dirs [2]string
	opts func(cfg *PairConfig) // adjusts each replica's config (nil: none)

	mu     sync.Mutex
	reps   [2]*Pair
	wals   [2]*store.WAL
	logs   [2]*WALLog
	epoch  uint64         // the newest epoch given
	leader int            // the replica that leads it
	ledBy  map[uint64]int // which replica each epoch was given to
	cut    [2]atomic.Bool // replica i's appends to the other fail
	seen   entryRecord    // the entries both replicas' logs took, kept past compaction
	// compacted and installed count the compactions and snapshot installs
	// of the replicas stopped.
	compacted, installed int64
}

// entryRecord records, for the history's check, the epochs of the entries
// holding each ID in the replicas' logs, which compaction and snapshots
// empty: every entry stored, less the tails cut from a log (a
// deletion that does not start at its first entry). A log emptied for a
// snapshot keeps its record: the check may then take a cut entry for one
// that held the ID (a weaker "acked by the leader" check there; "lost"
// and the history still see such acks).
type entryRecord struct {
	mu sync.Mutex
	m  map[uint64]map[uint64][]string // index → epoch → IDs
}

func (r *entryRecord) store(logs []*raft.Log) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[uint64]map[uint64][]string{}
	}
	for _, l := range logs {
		cmds, _, err := decodeEntry(l.Data, 1, nil, nil)
		if err != nil {
			continue
		}
		var ids []string
		for _, c := range cmds {
			for _, m := range c.Msgs {
				ids = append(ids, m.ID)
			}
		}
		if r.m[l.Index] == nil {
			r.m[l.Index] = map[uint64][]string{}
		}
		r.m[l.Index][l.Term] = ids
	}
}

func (r *entryRecord) cut(lo, hi uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.m {
		if i >= lo && i <= hi {
			delete(r.m, i)
		}
	}
}

// epochs returns, for each ID, the epochs of the recorded entries holding
// it.
func (r *entryRecord) epochs() map[string][]uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string][]uint64{}
	for _, byEpoch := range r.m {
		for e, ids := range byEpoch {
			for _, id := range ids {
				out[id] = append(out[id], e)
			}
		}
	}
	return out
}

// recordingLog is a replica's log that records in rec what it stores.
type recordingLog struct {
	*WALLog
	rec *entryRecord
}

func (l recordingLog) StoreLogs(logs []*raft.Log) error {
	err := l.WALLog.StoreLogs(logs)
	if err == nil {
		l.rec.store(logs)
	}
	return err
}

func (l recordingLog) StoreLog(e *raft.Log) error { return l.StoreLogs([]*raft.Log{e}) }

func (l recordingLog) DeleteRange(lo, hi uint64) error {
	first, _ := l.WALLog.FirstIndex()
	err := l.WALLog.DeleteRange(lo, hi)
	if err == nil && lo > first {
		l.rec.cut(lo, hi)
	}
	return err
}

var errLinkCut = errors.New("test: link cut")

// pairLink is replica from's way to the other replica.
type pairLink struct {
	ps   *pairs
	from int
}

func (l pairLink) Append(ctx context.Context, a pairlog.Append) (uint64, error) {
	if l.ps.cut[l.from].Load() {
		return 0, errLinkCut
	}
	p := l.ps.rep(1 - l.from)
	if p == nil {
		return 0, errLinkCut
	}
	return p.Append(ctx, a)
}

func (l pairLink) Install(ctx context.Context, in pairlog.Install) error {
	if l.ps.cut[l.from].Load() {
		return errLinkCut
	}
	p := l.ps.rep(1 - l.from)
	if p == nil {
		return errLinkCut
	}
	return p.Install(ctx, in)
}

// newPairs opens two replicas, replica 0 leading epoch 1 and replica 1
// following it.
func newPairs(t testing.TB, opts func(cfg *PairConfig)) *pairs {
	t.Helper()
	base := t.TempDir()
	ps := &pairs{t: t, opts: opts, ledBy: map[uint64]int{}}
	ps.dirs = [2]string{filepath.Join(base, "a"), filepath.Join(base, "b")}
	t.Cleanup(ps.close)
	ps.start(0)
	ps.start(1)
	ps.epoch, ps.leader, ps.ledBy[1] = 1, 0, 0
	if err := ps.rep(1).Follow(1); err != nil {
		t.Fatal(err)
	}
	if err := ps.rep(0).Lead(1, pairLink{ps, 0}, false); err != nil {
		t.Fatal(err)
	}
	return ps
}

// id is replica i's name in histories.
func (ps *pairs) id(i int) raft.ServerID { return raft.ServerID([]string{"a", "b"}[i]) }

func (ps *pairs) rep(i int) *Pair {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.reps[i]
}

// start opens replica i from its directory; it neither leads nor follows.
func (ps *pairs) start(i int) {
	ps.t.Helper()
	w, l, err := openNodeLogWith(filepath.Join(ps.dirs[i], "wal"), store.WALOptions{}, "dw")
	if err != nil {
		ps.t.Fatal(err)
	}
	cfg := PairConfig{Dir: ps.dirs[i], Log: recordingLog{l, &ps.seen}, RetryAfter: 5 * time.Millisecond}
	if ps.opts != nil {
		ps.opts(&cfg)
	}
	p, err := OpenPair(cfg)
	if err != nil {
		w.Close()
		ps.t.Fatal(err)
	}
	ps.mu.Lock()
	ps.reps[i], ps.wals[i], ps.logs[i] = p, w, l
	ps.mu.Unlock()
}

// stop closes replica i (a kill as far as the other sees it: what it had
// not synced is in its WAL or lost with it).
func (ps *pairs) stop(i int) {
	ps.t.Helper()
	ps.mu.Lock()
	p, w := ps.reps[i], ps.wals[i]
	ps.reps[i], ps.wals[i], ps.logs[i] = nil, nil, nil
	ps.mu.Unlock()
	if p == nil {
		return
	}
	defer func() {
		ps.mu.Lock()
		ps.compacted += p.Compactions()
		ps.installed += p.Installs()
		ps.mu.Unlock()
	}()
	if err := p.Close(); err != nil {
		ps.t.Errorf("close %s: %v", ps.id(i), err)
	}
	if err := w.Close(); err != nil {
		ps.t.Errorf("close %s's WAL: %v", ps.id(i), err)
	}
}

func (ps *pairs) close() {
	ps.stop(0)
	ps.stop(1)
}

// promote makes the follower the leader of the next epoch, replicating to
// the old leader (alone: to none, the risk stage), as the metadata group's
// Promote does. The old leader may still run: its appends are refused
// from now on.
func (ps *pairs) promote(alone bool) int {
	ps.t.Helper()
	ps.mu.Lock()
	next := 1 - ps.leader
	ps.epoch++
	epoch := ps.epoch
	ps.leader, ps.ledBy[epoch] = next, next
	p := ps.reps[next]
	ps.mu.Unlock()
	var peer pairlog.Peer = pairLink{ps, next}
	if alone {
		peer = nil
	}
	if err := p.Lead(epoch, peer, false); err != nil {
		ps.t.Fatalf("promote %s to epoch %d: %v", ps.id(next), epoch, err)
	}
	return next
}

// renew gives the leader a new epoch, as the metadata does for a leader
// that restarted (a run needs an epoch of its own: pairlog.Log.Lead): the
// follower, if up, follows it, and the leader leads it.
func (ps *pairs) renew() {
	ps.t.Helper()
	ps.mu.Lock()
	ps.epoch++
	epoch, leader := ps.epoch, ps.leader
	ps.ledBy[epoch] = leader
	f := ps.reps[1-leader]
	ps.mu.Unlock()
	if f != nil {
		if err := f.Follow(epoch); err != nil {
			ps.t.Fatalf("%s follows epoch %d: %v", ps.id(1-leader), epoch, err)
		}
	}
	if err := ps.rep(leader).Lead(epoch, pairLink{ps, leader}, false); err != nil {
		ps.t.Fatalf("%s leads epoch %d: %v", ps.id(leader), epoch, err)
	}
}

// rejoin makes the replica that does not lead (started if down) follow the
// current epoch, and the leader replicate to it.
func (ps *pairs) rejoin() {
	ps.t.Helper()
	ps.mu.Lock()
	f, epoch, leader := 1-ps.leader, ps.epoch, ps.leader
	down := ps.reps[f] == nil
	ps.mu.Unlock()
	if down {
		ps.start(f)
	}
	if err := ps.rep(f).Follow(epoch); err != nil {
		ps.t.Fatalf("%s follows epoch %d: %v", ps.id(f), epoch, err)
	}
	if !ps.rep(leader).Leading() || ps.rep(leader).Epoch() != epoch || ps.isAlone(leader) {
		ps.renew()
	}
}

// isAlone reports whether replica i leads with no follower.
func (ps *pairs) isAlone(i int) bool {
	l := ps.rep(i).lead.Load()
	return l != nil && l.Alone()
}

// current returns the replica leading the newest epoch.
func (ps *pairs) current() int {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.leader
}

// leaderOf names who led epoch (history.check).
func (ps *pairs) leaderOf(epoch uint64) (raft.ServerID, bool) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	i, ok := ps.ledBy[epoch]
	return ps.id(i), ok
}

// send appends msgs through replica i.
func (ps *pairs) send(ctx context.Context, i int, msgs ...store.Message) (store.Result, error) {
	p := ps.rep(i)
	if p == nil {
		return store.Result{}, ErrClosed
	}
	return p.Apply(ctx, &store.Command{Op: store.OpAppend, Now: t0, Msgs: msgs})
}

// logOf returns what replica i's partition 0 holds.
func (ps *pairs) logOf(i int) []store.Message {
	ps.t.Helper()
	p, err := ps.rep(i).Partition(0)
	if err != nil {
		ps.t.Fatal(err)
	}
	msgs, err := p.Read(0, 1<<20, 0, nil)
	if err != nil {
		ps.t.Fatal(err)
	}
	return msgs
}

// settle waits until both replicas are up and hold the same messages,
// and returns them: the follower applies what the leader's last append
// told it was committed.
func (ps *pairs) settle() []store.Message {
	ps.t.Helper()
	deadline := time.Now().Add(patience)
	for {
		a, b := ps.logOf(0), ps.logOf(1)
		if slices.EqualFunc(a, b, sameMessage) {
			return a
		}
		if time.Now().After(deadline) {
			ps.t.Fatalf("the replicas differ: %d and %d messages", len(a), len(b))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func sameMessage(a, b store.Message) bool {
	return a.ID == b.ID && a.Offset == b.Offset && string(a.Body) == string(b.Body)
}

// entryEpochs reads replica i's log: the epochs of the entries holding
// each message ID.
func (ps *pairs) entryEpochs(i int) map[string][]uint64 {
	ps.t.Helper()
	ps.mu.Lock()
	logs := ps.logs[i]
	ps.mu.Unlock()
	first, _ := logs.FirstIndex()
	last, err := logs.LastIndex()
	if err != nil {
		ps.t.Fatal(err)
	}
	out := map[string][]uint64{}
	for idx := max(first, 1); idx <= last; idx++ {
		var l raft.Log
		if err := logs.GetLog(idx, &l); err != nil {
			ps.t.Fatalf("%s: entry %d: %v", ps.id(i), idx, err)
		}
		cmds, _, err := decodeEntry(l.Data, 1, nil, nil)
		if err != nil {
			ps.t.Fatalf("%s: entry %d: %v", ps.id(i), idx, err)
		}
		for _, c := range cmds {
			for _, m := range c.Msgs {
				out[m.ID] = append(out[m.ID], l.Term)
			}
		}
	}
	return out
}

// seenEpochs is entryEpochs over what both replicas' logs took, compacted
// or not (entryRecord).
func (ps *pairs) seenEpochs() map[string][]uint64 { return ps.seen.epochs() }

func (ps *pairs) String() string {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	c, in := ps.compacted, ps.installed
	for _, p := range ps.reps {
		if p != nil {
			c, in = c+p.Compactions(), in+p.Installs()
		}
	}
	return fmt.Sprintf("epoch %d led by %s, %d compactions, %d snapshots installed", ps.epoch, ps.id(ps.leader), c, in)
}

// waitApplied waits until p's applier has applied everything its log
// knows committed (a follower applies off the path of its appends).
func (p *Pair) waitApplied(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		p.applyMu.Lock()
		done := p.applied >= p.log.Commit() || p.closing
		p.applyMu.Unlock()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the follower's applier did not catch up within %v", patience)
		}
		time.Sleep(time.Millisecond)
	}
}

// gatedLog wraps a replica's raft.LogStore: hook, when set, runs before each
// write and may fail it (a failing disk), writing nothing.
type gatedLog struct {
	raft.LogStore
	hook *atomic.Pointer[func([]*raft.Log) error]
}

func (g *gatedLog) StoreLog(l *raft.Log) error { return g.StoreLogs([]*raft.Log{l}) }

func (g *gatedLog) StoreLogs(ls []*raft.Log) error {
	if h := g.hook.Load(); h != nil {
		if err := (*h)(ls); err != nil {
			return err
		}
	}
	return g.LogStore.StoreLogs(ls)
}

// diskHooks holds the write hooks of replicas a and b, kept across restarts.
type diskHooks struct {
	h [2]atomic.Pointer[func([]*raft.Log) error]
}

func (d *diskHooks) opts(cfg *PairConfig) {
	i := 0
	if filepath.Base(cfg.Dir) == "b" {
		i = 1
	}
	cfg.Log = &gatedLog{LogStore: cfg.Log, hook: &d.h[i]}
}

func (d *diskHooks) set(i int, f func([]*raft.Log) error) {
	if f == nil {
		d.h[i].Store(nil)
		return
	}
	d.h[i].Store(&f)
}

var errTestDisk = errors.New("test: disk write failed")

// lastIndex returns the last index of replica i's log.
func (ps *pairs) lastIndex(i int) uint64 {
	ps.mu.Lock()
	l := ps.logs[i]
	ps.mu.Unlock()
	if l == nil {
		return 0
	}
	last, err := l.LastIndex()
	if err != nil {
		ps.t.Errorf("%s: last index: %v", ps.id(i), err)
	}
	return last
}

// entryIDs returns the message IDs of entry idx of replica i's log (nil
// when it does not hold it).
func (ps *pairs) entryIDs(i int, idx uint64) []string {
	ps.mu.Lock()
	l := ps.logs[i]
	ps.mu.Unlock()
	var e raft.Log
	if l == nil || l.GetLog(idx, &e) != nil {
		return nil
	}
	cmds, _, err := decodeEntry(e.Data, 1, nil, nil)
	if err != nil {
		return []string{"<" + err.Error() + ">"}
	}
	var ids []string
	for _, c := range cmds {
		for _, m := range c.Msgs {
			ids = append(ids, m.ID)
		}
	}
	return ids
}

// atOffset returns the ID replica i's partition 0 holds at off ("" none).
func (ps *pairs) atOffset(i int, off uint64) string {
	for _, m := range ps.logOf(i) {
		if m.Offset == off {
			return m.ID
		}
	}
	return ""
}

// entryData encodes one entry of a single-partition pair appending msgs.
func entryData(msgs ...store.Message) []byte {
	body := appendEntryCommand(nil, entryOne, 0, &store.Command{Op: store.OpAppend, Now: t0, Msgs: msgs})
	return append(entryHeader(nil, entryOne, 1, 1), body...)
}

func logEntry(index, epoch uint64, data []byte) *raft.Log {
	return &raft.Log{Index: index, Term: epoch, Type: raft.LogCommand, Data: data}
}

// writeOnlyToFollower sends id through leader a, whose own write of it
// fails (its disk, or its process dying before the write) while the batch
// it sends at the same time reaches follower b: the send is of unknown
// outcome, and the entry (the exact one a tried to write) is in b's log
// only, at the returned index. (The leader writes and sends in parallel;
// the test delivers the batch itself, as the send goroutine would, to
// avoid a race with the failing write.)
func writeOnlyToFollower(t *testing.T, ps *pairs, d *diskHooks, id string) uint64 {
	t.Helper()
	want := ps.lastIndex(0) + 1
	var captured []*raft.Log
	var once sync.Once
	d.set(0, func(ls []*raft.Log) error {
		once.Do(func() {
			for _, l := range ls {
				c := *l
				captured = append(captured, &c)
			}
		})
		return errTestDisk
	})
	ps.cut[0].Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err := ps.send(ctx, 0, msg(id))
	cancel()
	d.set(0, nil)
	ps.cut[0].Store(false)
	if !errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("send %s with a's disk failing: %v, want ErrUnknownOutcome", id, err)
	}
	if len(captured) != 1 || captured[0].Index != want {
		t.Fatalf("setup: a tried to write %d entries", len(captured))
	}
	// The batch a's leader sent alongside its write.
	end, err := ps.rep(1).Append(context.Background(), pairlog.Append{Epoch: 1, PrevIndex: want - 1, PrevEpoch: 1,
		Entries: captured, Commit: want - 1})
	if err != nil || end != want {
		t.Fatalf("setup: deliver a's batch to b: %d %v", end, err)
	}
	if got := ps.entryIDs(1, want); !slices.Equal(got, []string{id}) || ps.lastIndex(0) != want-1 {
		t.Fatalf("setup: b's entry %d holds %v, a's log ends at %d", want, got, ps.lastIndex(0))
	}
	return want
}

// sendTo appends msgs to partition part through replica i.
func (ps *pairs) sendTo(ctx context.Context, i, part int, msgs ...store.Message) (store.Result, error) {
	p := ps.rep(i)
	if p == nil {
		return store.Result{}, ErrClosed
	}
	return p.ApplyTo(ctx, part, &store.Command{Op: store.OpAppend, Now: t0, Msgs: msgs})
}

// partOf returns what replica i's partition part holds.
func (ps *pairs) partOf(i, part int) []store.Message {
	ps.t.Helper()
	p, err := ps.rep(i).Partition(part)
	if err != nil {
		ps.t.Fatal(err)
	}
	msgs, err := p.Read(0, 1<<20, 0, nil)
	if err != nil {
		ps.t.Fatal(err)
	}
	return msgs
}

// nextEpoch hands out the next epoch, led by replica i.
func (ps *pairs) nextEpoch(i int) uint64 {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.epoch++
	ps.ledBy[ps.epoch], ps.leader = i, i
	return ps.epoch
}

// sendN sends n messages named tag0.. through replica i, one at a time
// (an entry each).
func (ps *pairs) sendN(ctx context.Context, i, n int, tag string) {
	ps.t.Helper()
	for k := range n {
		if _, err := ps.send(ctx, i, msg(fmt.Sprintf("%s%d", tag, k))); err != nil {
			ps.t.Fatalf("send %s%d: %v", tag, k, err)
		}
	}
}
