package store_test

// The crash simulation: random command sequences on partitions sharing a
// WAL over the file system that keeps only synced bytes, a crash at a random
// write or sync, a second crash during the recovery, then a clean recovery.
// Each partition's state must then be the state after some prefix of its
// commands that holds every acknowledged one (and nothing not issued), and
// every acknowledged result must be the one a crash-free partition gives.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/memfs"
	"github.com/zeze-go/mq/store"
)

const simParts = 2

// simOps is about how many writes and syncs a whole schedule makes: the
// first crash comes at a uniformly random one of 1..simOps*5/4.
const simOps = 120

// simCase is one schedule: the commands of each partition, in batches, and
// how the node is tuned and crashed. Everything follows from the seed.
type simCase struct {
	seed      uint64
	batches   [simParts][][]*store.Command
	popts     store.Options
	wopts     store.WALOptions
	powerLoss bool // else a process crash: the written bytes stay
	crashOp   int  // the operation of the first crash, counted from Open
	recovery  int  // crash 2: < 0 at operation -recovery of the recovery, else after opening that many partitions
}

func newSimCase(seed uint64, avgOps int) *simCase {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	c := &simCase{seed: seed, powerLoss: rng.IntN(4) != 0}
	c.wopts.SegmentSize = int64(16<<10) << rng.IntN(4)
	if !c.powerLoss && rng.IntN(2) == 0 {
		c.wopts.SyncInterval = time.Duration(1+rng.IntN(3)) * time.Millisecond
	}
	c.popts.MaterializeAfter = []time.Duration{time.Millisecond, 10 * time.Millisecond, time.Hour}[rng.IntN(3)]
	c.popts.MaxPendingBytes = []int{32 << 10, 256 << 10, 16 << 20}[rng.IntN(3)]
	c.crashOp = 1 + rng.IntN(avgOps+avgOps/4+2)
	if rng.IntN(2) == 0 {
		c.recovery = -(1 + rng.IntN(8))
	} else {
		c.recovery = rng.IntN(simParts + 1)
	}
	for i := range simParts {
		c.batches[i] = simCommands(rng, i)
	}
	return c
}

func (c *simCase) String() string {
	return fmt.Sprintf("powerLoss=%v syncInterval=%v segment=%d materializeAfter=%v maxPending=%d crashOp=%d recovery=%d",
		c.powerLoss, c.wopts.SyncInterval, c.wopts.SegmentSize, c.popts.MaterializeAfter, c.popts.MaxPendingBytes, c.crashOp, c.recovery)
}

// simCommands returns a random command sequence for partition i, in
// batches: appends with repeated IDs, delayed messages and releases,
// claims, resets, offset commits (with the group's generation, a stale one
// or none) and group deletes, trims, and transactions prepared then
// committed, rolled back, checked or left open.
func simCommands(rng *rand.Rand, part int) [][]*store.Command {
	now := t0
	var out [][]*store.Command
	var batch []*store.Command
	var open []string // prepared, undecided
	ids, txs := 0, 0
	// The generations the commands hand out, as the partition will: one
	// counter, and each group's current one (absent: no record, which
	// accepts 0). A commit picks the current one, an older or a newer one.
	var counter uint64
	owner := map[string]uint64{}
	generation := func(g string) uint64 {
		switch cur := owner[g]; rng.IntN(4) {
		case 0, 1:
			return cur
		case 2:
			return uint64(rng.IntN(int(counter) + 1)) // mostly stale
		default:
			return counter + 1 // never handed out yet
		}
	}
	msgs := func(n int) []store.Message {
		ms := make([]store.Message, n)
		for k := range ms {
			id := ids
			ids++
			if ids > 5 && rng.IntN(5) == 0 {
				id = rng.IntN(ids) // a resend
			}
			body := make([]byte, rng.IntN(1500))
			for j := range body {
				body[j] = byte(id + j)
			}
			ms[k] = store.Message{ID: fmt.Sprintf("p%d-m%d", part, id), Key: "k" + strconv.Itoa(id%3),
				Body: body, Timestamp: now}
			if rng.IntN(8) == 0 {
				ms[k].DeliverAt = now + int64(1+rng.IntN(50))*int64(time.Millisecond)
			}
			if rng.IntN(10) == 0 {
				ms[k].ID = "" // no dedup entry
			}
		}
		return ms
	}
	n := 10 + rng.IntN(50)
	for range n {
		now += int64(1+rng.IntN(5)) * int64(time.Millisecond)
		var c *store.Command
		grp := "g" + strconv.Itoa(rng.IntN(2))
		switch r := rng.IntN(23); {
		case r < 9:
			k := 1 + rng.IntN(4)
			if rng.IntN(15) == 0 {
				k = 17 + rng.IntN(30) // a bulk append
			}
			c = &store.Command{Op: store.OpAppend, Msgs: msgs(k)}
		case r < 11:
			c = &store.Command{Op: store.OpCommitOffset, Group: grp, Offset: uint64(rng.IntN(100)), Generation: generation(grp)}
		case r == 11:
			c = &store.Command{Op: store.OpDeleteGroup, Group: grp}
			delete(owner, grp)
		case r >= 20:
			c = &store.Command{Op: store.OpClaim, Group: grp, Start: store.Start(rng.IntN(3)), Offset: uint64(rng.IntN(100))}
			if r == 22 {
				c = &store.Command{Op: store.OpResetOffset, Group: grp, Offset: uint64(rng.IntN(100))}
			}
			counter++
			owner[grp] = counter
		case r == 12:
			c = &store.Command{Op: store.OpTrim, MaxBytes: int64(rng.IntN(40 << 10)), DedupTTL: int64(rng.IntN(100)) * int64(time.Millisecond),
				DecideTTL: int64(rng.IntN(100)) * int64(time.Millisecond), Limit: rng.IntN(20)}
		case r == 13:
			c = &store.Command{Op: store.OpRelease, Limit: rng.IntN(5)}
		case r < 16:
			txid := fmt.Sprintf("tx%d-%d", part, txs)
			txs++
			open = append(open, txid)
			c = &store.Command{Op: store.OpPrepare, TxID: txid, Msgs: msgs(1 + rng.IntN(3)), Producer: "node"}
		default:
			if len(open) == 0 {
				c = &store.Command{Op: store.OpTxChecked, TxID: "tx-none"}
				break
			}
			j := rng.IntN(len(open))
			txid := open[j]
			switch rng.IntN(5) {
			case 0, 1:
				c = &store.Command{Op: store.OpCommitTx, TxID: txid, Msgs: msgs(rng.IntN(2))}
			case 2:
				c = &store.Command{Op: store.OpRollbackTx, TxID: txid}
			case 3:
				c = &store.Command{Op: store.OpTxChecked, TxID: txid}
			default:
				c = &store.Command{Op: store.OpPrepare, TxID: txid, Msgs: msgs(1)} // a second prepare
			}
			if c.Op == store.OpCommitTx || c.Op == store.OpRollbackTx {
				open = append(open[:j], open[j+1:]...)
			}
		}
		c.Now = now
		batch = append(batch, c)
		if len(batch) >= 1+rng.IntN(6) {
			out = append(out, batch)
			batch = nil
		}
	}
	if len(batch) > 0 {
		out = append(out, batch)
	}
	return out
}

// simNode is a WAL on a memfs.FS and partitions whose files are in dir.
type simNode struct {
	mu      sync.Mutex // guards parts (a crash snapshots them from a WAL goroutine)
	wal     *store.WAL
	parts   []*store.Partition
	snapped int // partitions in the crash's snapshot
}

// open opens the WAL and the first n partitions.
func (n *simNode) open(mfs *memfs.FS, dir string, c *simCase, upto int, early bool) error {
	wopts := c.wopts
	wopts.FS = mfs
	w, err := store.OpenWAL("/wal", wopts)
	if err != nil {
		return err
	}
	if early {
		store.AckBeforeSync(w)
	}
	n.mu.Lock()
	n.wal = w
	n.mu.Unlock()
	for i := range upto {
		o := c.popts
		o.WAL, o.Stream = w, "s/"+strconv.Itoa(i)
		p, err := store.Open(filepath.Join(dir, strconv.Itoa(i)+".db"), o)
		if err != nil {
			return err
		}
		n.mu.Lock()
		n.parts = append(n.parts, p)
		n.mu.Unlock()
	}
	return nil
}

// snapshot writes what a crash now leaves of the open partition files into
// dst (the others keep the copy dst has).
func (n *simNode) snapshot(dst string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.snapped = len(n.parts)
	for i, p := range n.parts {
		if err := store.SnapshotFile(p, filepath.Join(dst, strconv.Itoa(i)+".db")); err != nil {
			return err
		}
	}
	return nil
}

func (n *simNode) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range n.parts {
		p.Close()
	}
	if n.wal != nil {
		n.wal.Close()
	}
}

// simOutcome is what the issuer of one partition saw.
type simOutcome struct {
	acked, issued int // commands: every one before acked answered, none at or after issued sent
	res           []store.Result
	errs          []error
}

// failure reports whether err says the partition failed (the crash), as
// opposed to the command's own error.
func failure(err error) bool {
	return errors.Is(err, store.ErrFailed) || errors.Is(err, store.ErrCorrupt) || errors.Is(err, store.ErrClosed) ||
		errors.Is(err, store.ErrWALFailed)
}

// runSim runs schedule c once (early: the broken build that acknowledges
// before syncing) and returns what went wrong, or nil.
func runSim(c *simCase, early bool) (st simStats, err error) {
	var notes []string
	note := func(format string, args ...any) { notes = append(notes, fmt.Sprintf(format, args...)) }
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w\nhistory: %s", err, strings.Join(notes, "; "))
		}
	}()
	root, err := os.MkdirTemp(simTempRoot(), "sim")
	if err != nil {
		return st, err
	}
	defer os.RemoveAll(root)
	dirs := make([]string, 4)
	for i := range dirs {
		dirs[i] = filepath.Join(root, strconv.Itoa(i))
		if err := os.Mkdir(dirs[i], 0o700); err != nil {
			return st, err
		}
	}
	rng := rand.New(rand.NewPCG(c.seed, 0xc4a5))

	// Run 1, crashed at crashOp.
	var cmds [simParts][]*store.Command
	for i := range simParts {
		for _, b := range c.batches[i] {
			cmds[i] = append(cmds[i], b...)
		}
	}
	mfs := memfs.New()
	var img *memfs.FS
	var snapErr error
	n := &simNode{}
	crashed := make(chan struct{}) // closed as the crash begins
	mfs.CrashAt(c.crashOp, c.powerLoss, rng, func(im *memfs.FS) {
		close(crashed)
		img, snapErr = im, n.snapshot(dirs[1])
	})
	if err := n.open(mfs, dirs[0], c, simParts, early); err != nil && !isClosed(crashed) {
		n.close()
		return st, fmt.Errorf("open: %w", err)
	}
	var outs [simParts]simOutcome
	var wg sync.WaitGroup
	n.mu.Lock()
	parts := n.parts
	n.mu.Unlock()
	for i, p := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := &outs[i]
			for _, b := range c.batches[i] {
				o.issued += len(b)
				rs, es, err := p.ApplyBatch(context.Background(), b)
				if err != nil {
					return
				}
				for _, e := range es {
					if failure(e) {
						return
					}
				}
				if isClosed(crashed) && hasBulk(b) {
					// Answered after the crash began, perhaps: a bulk
					// append goes into the partition file (outside the
					// simulated file system) without the WAL, and the
					// crash's snapshot of that file may precede it. A
					// dead process answers nothing.
					return
				}
				o.acked += len(b)
				o.res, o.errs = append(o.res, rs...), append(o.errs, es...)
			}
		}()
	}
	wg.Wait()
	st.whole = !isClosed(crashed)
	mfs.CrashNow()     // the schedule may end before its crash
	st.ops = mfs.Ops() // (and the crash's snapshot is complete)
	note("run 1: crashed at op %d of %d armed, %d partitions snapshotted, acked/issued %v, WAL %v",
		st.ops, c.crashOp, n.snapped, outs, img.Names(".wal"))
	n.close()
	if snapErr != nil {
		return st, fmt.Errorf("snapshot: %w", snapErr)
	}

	// Run 2: the recovery, crashed.
	if err := copyFlat(dirs[1], dirs[2]); err != nil {
		return st, err
	}
	r := &simNode{}
	var img2 *memfs.FS
	var snap2 error
	crash2 := func(im *memfs.FS) { img2, snap2 = im, r.snapshot(dirs[2]) }
	if c.recovery < 0 {
		img.CrashAt(-c.recovery, c.powerLoss, rng, crash2)
	} else {
		img.CrashAt(1<<30, c.powerLoss, rng, crash2) // at CrashNow below
	}
	upto := c.recovery
	if upto < 0 {
		upto = simParts
	}
	err = r.open(img, dirs[1], c, upto, false)
	if err == nil && c.recovery < 0 {
		err = r.wal.FinishRecovery()
	}
	st.recoveryFailed = err != nil
	if err != nil && img2 == nil {
		r.close()
		return st, fmt.Errorf("recovery: %w", err)
	}
	img.CrashNow()
	note("run 2: %d partitions opened, %d snapshotted, error %v, WAL %v", len(r.parts), r.snapped, err, img2.Names(".wal"))
	r.close()
	if snap2 != nil {
		return st, fmt.Errorf("snapshot 2: %w", snap2)
	}

	// Run 3: a clean recovery, then the check.
	f := &simNode{}
	defer f.close()
	if err := f.open(img2, dirs[2], c, simParts, false); err != nil {
		return st, fmt.Errorf("final recovery: %w", err)
	}
	if err := f.wal.FinishRecovery(); err != nil {
		return st, fmt.Errorf("final recovery: %w", err)
	}
	for i, p := range f.parts {
		o := &outs[i]
		res, errs, dumps, err := simReference(dirs[3], cmds[i][:o.issued], o.acked)
		if err != nil {
			return st, fmt.Errorf("reference: %w", err)
		}
		os.Remove(filepath.Join(dirs[3], "ref.db"))
		for k := range o.acked {
			if fmt.Sprint(o.res[k]) != fmt.Sprint(res[k]) || fmt.Sprint(o.errs[k]) != fmt.Sprint(errs[k]) {
				return st, fmt.Errorf("partition %d: command %d (%v) answered %+v, %v; a crash-free partition answers %+v, %v",
					i, k, cmds[i][k].Op, o.res[k], o.errs[k], res[k], errs[k])
			}
		}
		got, err := store.Dump(p)
		if err != nil {
			return st, fmt.Errorf("partition %d: dump: %w", i, err)
		}
		match := -1
		for k := o.acked; k <= o.issued; k++ {
			if dumps[k-o.acked] == got {
				match = k
				break
			}
		}
		st.acked += o.acked
		st.unknown += o.issued - o.acked
		for k := range o.acked {
			if errors.Is(o.errs[k], store.ErrStaleGeneration) {
				st.stale++
			} else if cmds[i][k].Op == store.OpCommitOffset && cmds[i][k].Generation > 0 {
				st.fenced++
			}
		}
		if match < 0 {
			return st, fmt.Errorf("partition %d: the recovered state is no prefix of %d..%d commands (%v); against the state after %d:\n%s",
				i, o.acked, o.issued, opsOf(cmds[i][:o.issued]), o.acked, dumpDiff(dumps[0], got))
		}
		st.landed += match - o.acked
		// Sends work: one more append lands at the end of the log.
		next := p.Stats().Next
		rs, err := p.Apply(context.Background(), &store.Command{Op: store.OpAppend, Now: t0 + int64(time.Hour),
			Msgs: []store.Message{{ID: "after", Body: []byte("after")}}})
		if err != nil {
			return st, fmt.Errorf("partition %d: send after recovery: %w", i, err)
		}
		if rs.Acks[0].Offset != next {
			return st, fmt.Errorf("partition %d: send after recovery at %d, next was %d", i, rs.Acks[0].Offset, next)
		}
		// Claims continue the generations of the recovered prefix.
		want := uint64(1)
		for k, c := range cmds[i][:match] {
			if (c.Op == store.OpClaim || c.Op == store.OpResetOffset) && errs[k] == nil {
				want++
			}
		}
		rs, err = p.Apply(context.Background(), &store.Command{Op: store.OpClaim, Now: t0 + int64(time.Hour), Group: "after"})
		if err != nil || rs.Generation != want {
			return st, fmt.Errorf("partition %d: claim after recovery: generation %d, %v; want %d", i, rs.Generation, err, want)
		}
	}
	return st, nil
}

// simStats counts what one schedule did.
type simStats struct {
	ops            int  // writes and syncs before the first crash
	acked, unknown int  // commands acknowledged; sent but unanswered (or answered with the crash)
	landed         int  // unanswered commands found applied after recovery
	stale, fenced  int  // acknowledged commits refused as stale; applied with a generation above 0
	recoveryFailed bool // the crash hit the second recovery before it finished
	whole          bool // the schedule ended before its crash
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func opsOf(cmds []*store.Command) []store.Op {
	out := make([]store.Op, len(cmds))
	for i, c := range cmds {
		out[i] = c.Op
	}
	return out
}

// simTempRoot is a memory file system when there is one: the partition
// files' fsyncs say nothing in these tests (crashes are simulated) and cost
// a disk flush each elsewhere.
func simTempRoot() string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		return "/dev/shm"
	}
	return os.TempDir()
}

// simSchedules is how many schedules TestCrashSim runs:
// ZEZE_CRASHSIM_SCHEDULES, or 2000 (200 with -short; a twentieth of that
// with the race detector, which CI runs besides the full count without it).
func simSchedules() int {
	if v, err := strconv.Atoi(os.Getenv("ZEZE_CRASHSIM_SCHEDULES")); err == nil && v > 0 {
		return v
	}
	n := 2000
	if testing.Short() {
		n = 200
	}
	if raceEnabled {
		n /= 20
	}
	return n
}

// TestCrashSim runs the crash simulation over many seeded schedules. A
// failure prints its seed; ZEZE_CRASHSIM_SEED=<seed> runs that schedule
// alone, 20 times (the commands, the crash points and the sectors a power
// loss keeps follow from the seed; the goroutines' interleaving does not).
func TestCrashSim(t *testing.T) {
	if v := os.Getenv("ZEZE_CRASHSIM_SEED"); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		for range 20 {
			c := newSimCase(seed, simOps)
			if _, err := runSim(c, false); err != nil {
				t.Fatalf("seed %d: %s: %v", seed, c, err)
			}
		}
		return
	}
	n := simSchedules()
	base := uint64(time.Now().UnixNano())
	start := time.Now()
	var sum simStats
	whole := 0
	kinds := map[string]int{}
	for i := range n {
		seed := base + uint64(i)
		c := newSimCase(seed, simOps)
		st, err := runSim(c, false)
		if err != nil {
			t.Fatalf("schedule %d, seed %d (replay: ZEZE_CRASHSIM_SEED=%d go test -run TestCrashSim ./store): %s: %v", i, seed, seed, c, err)
		}
		sum.ops += st.ops
		sum.acked += st.acked
		sum.unknown += st.unknown
		sum.landed += st.landed
		sum.stale += st.stale
		sum.fenced += st.fenced
		if st.whole {
			whole++
		}
		switch {
		case c.powerLoss:
			kinds["power loss"]++
		case c.wopts.SyncInterval > 0:
			kinds["process crash, SyncInterval"]++
		default:
			kinds["process crash"]++
		}
		if c.recovery < 0 {
			kinds["recovery crashed at a write or sync"]++
		} else {
			kinds[fmt.Sprintf("recovery crashed after %d of %d partitions", c.recovery, simParts)]++
		}
		if st.recoveryFailed {
			kinds["recovery failed by its crash"]++
		}
	}
	t.Logf("crash simulation: %d schedules in %v, 0 failures: %d writes and syncs before the first crash (%d schedules ended first), %d commands acknowledged (all found as answered), %d unanswered of which %d found applied; %d fenced commits applied, %d refused as stale",
		n, time.Since(start).Round(time.Millisecond), sum.ops, whole, sum.acked, sum.unknown, sum.landed, sum.fenced, sum.stale)
	names := make([]string, 0, len(kinds))
	for k := range kinds {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		t.Logf("  %-45s %5d", k, kinds[k])
	}
}

// TestCrashSim_NegativeControl runs the simulation on a broken build that
// acknowledges each WAL write before its sync: the checker must catch it.
func TestCrashSim_NegativeControl(t *testing.T) {
	base := uint64(time.Now().UnixNano())
	for i := range 500 {
		c := newSimCase(base+uint64(i), 20)
		c.powerLoss = true
		c.wopts.SyncInterval = 0
		c.popts.MaterializeAfter = time.Hour // what was acked is in the WAL only
		c.popts.MaxPendingBytes = 16 << 20
		if _, err := runSim(c, true); err != nil {
			t.Logf("negative control caught after %d schedules (seed %d): %s", i+1, c.seed, firstLine(err.Error()))
			return
		}
	}
	t.Fatal("500 schedules of a build that acknowledges before fsync passed the check")
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// hasBulk reports whether a command of b has enough messages for its batch
// to go into the partition file without the WAL.
func hasBulk(b []*store.Command) bool {
	for _, c := range b {
		if len(c.Msgs) > 16 {
			return true
		}
	}
	return false
}

func (o simOutcome) String() string { return fmt.Sprintf("%d/%d", o.acked, o.issued) }

// TestCrashSim_Batching checks what the simulation's reference relies on: a
// partition given the same commands reaches the same state, and answers
// the same, whether they come one by one without a WAL or in batches behind
// one whose gens go into the file at any moment.
func TestCrashSim_Batching(t *testing.T) {
	n := 200
	if raceEnabled || testing.Short() {
		n = 20
	}
	base := uint64(time.Now().UnixNano())
	for i := range n {
		c := newSimCase(base+uint64(i), 60)
		dir, err := os.MkdirTemp(simTempRoot(), "batching")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		var cmds []*store.Command
		for _, b := range c.batches[0] {
			cmds = append(cmds, b...)
		}
		res, errs, dumps, err := simReference(dir, cmds, len(cmds))
		if err != nil {
			t.Fatal(err)
		}
		w, p, err := openWALPartition("/wal", store.WALOptions{FS: memfs.New()}, filepath.Join(dir, "b.db"), c.popts)
		if err != nil {
			t.Fatal(err)
		}
		k := 0
		for _, b := range c.batches[0] {
			rs, es, err := p.ApplyBatch(context.Background(), b)
			if err != nil {
				t.Fatal(err)
			}
			for j := range b {
				if fmt.Sprint(rs[j], es[j]) != fmt.Sprint(res[k], errs[k]) {
					t.Fatalf("seed %d (%s): command %d (%v) answered %v %v in a batch, %v %v alone", c.seed, c, k, cmds[k].Op, rs[j], es[j], res[k], errs[k])
				}
				k++
			}
		}
		got, err := store.Dump(p)
		if err != nil {
			t.Fatal(err)
		}
		p.Close()
		w.Close()
		if got != dumps[0] {
			t.Fatalf("seed %d (%s): batched state differs (%v):\n%s", c.seed, c, opsOf(cmds), dumpDiff(dumps[0], got))
		}
	}
}
