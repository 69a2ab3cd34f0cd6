package raftqueue

import (
	"bytes"
	"io/fs"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/memfs"
	"github.com/zeze-go/mq/store"
)

// Power losses in the fault matrix: replica 0's WAL, which holds its raft
// log, lives on an in-memory file system (memfs), and a kill of replica 0
// is a crash that keeps only what was synced (plus a random subset of the
// unsynced sectors). Only the WAL loses unsynced bytes: the replica's
// partition.db, raft.db and snapshots are on the real disk and are closed
// normally. Replicas 1 and 2 are killed as in TestFault_LeaderKill.

// crashSyncDelay is how long a sync of a crashDisk takes, as a disk's flush
// does: a crash at a random instant often finds a write of the WAL done and
// its sync not, records raft has not counted yet.
const crashSyncDelay = time.Millisecond

// walSealBytes is the write header the WAL writes after each sync and
// leaves unsynced (a frame of 8 bytes, a body of 25): a crash finding more
// unsynced bytes than that found records written and not synced.
const walSealBytes = 33

// crashDisk is a WAL's file system: a memfs.FS whose syncs take
// crashSyncDelay and which crash stops at an instant: no write, sync,
// truncate, remove or directory change after it reaches the memfs, whose
// image is then what the crash left. Reads go on until the replica is
// closed (its page cache): raft panics on a log entry it cannot read.
type crashDisk struct {
	mfs *memfs.FS

	mu      sync.RWMutex // held (read) across each change that reaches mfs; crash holds it
	crashed bool
	lie     bool // a sync returns nil and syncs nothing (the negative control)
	// armed, set by crashAtWrite, crashes the disk once a write of more
	// than walSealBytes lands, and closes hit.
	armed atomic.Bool
	hit   chan struct{}

	umu      sync.Mutex       // guards unsynced
	unsynced map[string]int64 // file → bytes of non-zero writes since its last sync
}

var _ store.FS = (*crashDisk)(nil)

func newCrashDisk(mfs *memfs.FS) *crashDisk {
	return &crashDisk{mfs: mfs, unsynced: map[string]int64{}}
}

// change runs fn, a change of the memfs, unless the disk crashed.
func (d *crashDisk) change(fn func() error) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.crashed {
		return syscall.EIO
	}
	return fn()
}

// crash stops the disk at this instant and returns the bytes it held
// written and not synced.
func (d *crashDisk) crash() int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.crashed = true
	d.umu.Lock()
	defer d.umu.Unlock()
	var n int64
	for _, k := range d.unsynced {
		n += k
	}
	return n
}

// crashAtWrite arms a crash right after the next write of records lands,
// before its sync; the returned channel is closed once it did.
func (d *crashDisk) crashAtWrite() <-chan struct{} {
	d.hit = make(chan struct{})
	d.armed.Store(true)
	return d.hit
}

// lieFromNow makes every later sync return nil without syncing: the disk
// acknowledges what it has not made durable.
func (d *crashDisk) lieFromNow() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lie = true
}

func (d *crashDisk) OpenFile(name string, flag int, perm fs.FileMode) (store.File, error) {
	var f store.File
	err := d.change(func() (err error) {
		f, err = d.mfs.OpenFile(name, flag, perm)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &crashFile{File: f, d: d, name: name}, nil
}

func (d *crashDisk) ReadDir(dir string) ([]string, error) { return d.mfs.ReadDir(dir) }

func (d *crashDisk) Remove(name string) error {
	return d.change(func() error { return d.mfs.Remove(name) })
}

func (d *crashDisk) MkdirAll(dir string, perm fs.FileMode) error {
	return d.change(func() error { return d.mfs.MkdirAll(dir, perm) })
}

func (d *crashDisk) SyncDir(dir string) error {
	return d.change(func() error { return d.mfs.SyncDir(dir) })
}

type crashFile struct {
	store.File
	d    *crashDisk
	name string
}

func (f *crashFile) WriteAt(b []byte, off int64) (int, error) {
	var n int
	err := f.d.change(func() (err error) {
		n, err = f.File.WriteAt(b, off)
		return err
	})
	if len(bytes.TrimLeft(b[:n], "\x00")) > 0 { // not the zeros allocated ahead
		f.d.umu.Lock()
		f.d.unsynced[f.name] += int64(n)
		f.d.umu.Unlock()
		if n > walSealBytes && f.d.armed.CompareAndSwap(true, false) {
			f.d.crash()
			close(f.d.hit)
		}
	}
	return n, err
}

func (f *crashFile) Sync() error {
	time.Sleep(crashSyncDelay) // a crash meanwhile finds the write unsynced
	f.d.mu.RLock()
	defer f.d.mu.RUnlock()
	switch {
	case f.d.crashed:
		return syscall.EIO
	case f.d.lie:
		return nil
	}
	if err := f.File.Sync(); err != nil {
		return err
	}
	f.d.umu.Lock()
	delete(f.d.unsynced, f.name)
	f.d.umu.Unlock()
	return nil
}

func (f *crashFile) Truncate(size int64) error {
	return f.d.change(func() error { return f.File.Truncate(size) })
}

// crashReplica is replica 0 of a crash test, whose WAL is on disk, replaced
// by the image each crash leaves. The test goroutine alone uses it.
type crashReplica struct {
	disk *crashDisk
	rng  *rand.Rand // the images' random subsets of unsynced sectors; nil: none kept
	// What the crashes found: how many, how many as replica 0 led, how
	// many found records written and not synced.
	crashes, asLeader, cut int
}

// newCrashCluster starts a fault cluster whose replica 0 has its WAL on a
// crashDisk.
func newCrashCluster(t *testing.T, r *crashReplica) *faultCluster {
	t.Helper()
	r.disk = newCrashDisk(memfs.New())
	return newFaultClusterWith(t, false, 1, func(i int, dir string) (*store.WAL, *WALLog, error) {
		if i == 0 {
			return openNodeLogWith("/wal", store.WALOptions{FS: r.disk}, "group")
		}
		return openNodeLog(filepath.Join(dir, "wal"))
	})
}

// crashPoint is when crash stops the disk.
type crashPoint uint8

const (
	atInstant crashPoint = iota // at once
	atWrite                     // once the WAL wrote records, before their sync
)

// crash kills replica 0 by a power loss of its WAL's disk: the disk stops
// (at point), replica 0 is cut off and closed (its WAL failed at the
// crash, so its close may fail), and its next start opens the image the
// crash left.
func (r *crashReplica) crash(c *faultCluster, point crashPoint) {
	c.t.Helper()
	led := c.group(0).State() == raft.Leader
	if point == atWrite {
		select {
		case <-r.disk.crashAtWrite():
		case <-time.After(patience):
			c.t.Fatalf("r0 wrote no records within %v", patience)
		}
	}
	unsynced := r.disk.crash()
	c.isolate(0)
	c.mu.Lock()
	wal := c.wals[0]
	c.wals[0] = nil // closed below, its error the crash's
	c.mu.Unlock()
	c.stop(0)
	if wal != nil {
		_ = wal.Close()
	}
	r.disk = newCrashDisk(r.disk.mfs.Image(true, r.rng))
	r.crashes++
	if led {
		r.asLeader++
	}
	if unsynced > walSealBytes {
		r.cut++
	}
}

// lead moves leadership to replica i (raft's leadership transfer), and
// reports whether it leads.
func lead(c *faultCluster, i int) bool {
	c.t.Helper()
	for range 5 {
		l := c.leader()
		if l == i {
			return true
		}
		_ = c.group(l).Raft().LeadershipTransferToServer(c.ids[i], c.addrs[i]).Error() // tried again below
	}
	return c.leader() == i
}

// TestFault_CrashLeaderKill is TestFault_LeaderKill with replica 0's WAL
// on memfs: in every other round leadership moves to replica 0 and it is
// killed while it leads and clients write through it; the other rounds
// kill whoever leads. A kill of replica 0 is a power loss of its WAL (the
// synced bytes and a random subset of the unsynced sectors are left); its
// partition.db, raft.db and snapshots are on the real disk and closed
// normally. StoreLogs returns only once its entries are synced, so what a
// crash drops raft never counted: nothing acked may be lost.
func TestFault_CrashLeaderKill(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := &crashReplica{rng: rand.New(rand.NewPCG(seed, 1))}
	pause := rand.New(rand.NewPCG(seed, 2))
	c := newCrashCluster(t, r)
	kills := rounds(12)
	round := 0
	var last time.Time
	runFaultsOn(t, c, kills, func(c *faultCluster, w *workload) {
		time.Sleep(time.Until(last.Add(time.Second)))
		last = time.Now()
		round++
		if round%2 == 1 && lead(c, 0) {
			w.progress(10) // through replica 0
		}
		old := c.leader()
		if old != 0 {
			c.stop(old)
		} else {
			time.Sleep(time.Duration(pause.IntN(5000)) * time.Microsecond)
			point := atInstant
			if pause.IntN(2) == 0 {
				point = atWrite
			}
			r.crash(c, point)
		}
		w.progress(20) // through a new leader
		c.start(old)
	}).report(t)
	t.Logf("%d kills, %d of them crashes of replica 0 (%d as it led), %d of which found records written and not synced",
		kills, r.crashes, r.asLeader, r.cut)
	if r.asLeader < kills/4 {
		t.Errorf("replica 0 crashed %d times as it led, want %d at least", r.asLeader, kills/4)
	}
}

// diskSyncs is what replica 0's disk does with a sync in crashQuorum.
type diskSyncs uint8

const (
	syncsKept diskSyncs = iota // makes the data durable
	syncsLie                   // returns nil, from a moment on, and makes nothing durable
)

// crashQuorum makes replica 0 the only follower that stores the leader's
// entries (the other is cut off), then crashes it and kills the leader at
// once; replica 0 restarts from the image and the other follower rejoins:
// the two elect a leader, and the old one restarts. With the entries synced
// before StoreLogs returns, replica 0 holds every entry acked meanwhile and
// wins the election.
func crashQuorum(c *faultCluster, w *workload, r *crashReplica, syncs diskSyncs) {
	c.t.Helper()
	if c.leader() == 0 && !lead(c, 1) {
		c.t.Fatal("leadership stays with r0")
	}
	l := c.leader()
	f := 3 - l // the other follower
	if syncs == syncsLie {
		r.disk.lieFromNow()
	}
	w.progress(20) // stored by f too
	c.isolate(f)
	w.progress(50) // stored by l and replica 0 alone
	r.crash(c, atWrite)
	c.stop(l)
	c.heal()
	c.start(0)
	w.progress(50) // through replica 0 or f
	c.start(l)
}

// The leader and the only follower storing its entries fail at once, the
// follower by a power loss of its WAL, as crashQuorum does: nothing acked
// may be lost.
func TestFault_CrashQuorum(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := &crashReplica{rng: rand.New(rand.NewPCG(seed, 1))}
	c := newCrashCluster(t, r)
	runFaultsOn(t, c, rounds(1), func(c *faultCluster, w *workload) {
		crashQuorum(c, w, r, syncsKept)
	}).report(t)
}

// The negative control of the crash tests: crashQuorum with replica 0's
// disk acknowledging syncs without making anything durable, from a moment
// before the other follower is cut off; to raft, StoreLogs returns before
// its entries are synced (store's WAL acknowledging before the sync, which
// raftqueue cannot set). Replica 0 restarts without the entries acked
// since; the other follower, holding more, leads, and those acks are lost:
// the checks must fail. They read the new leader's log at once: replica 0
// and the old leader applied the lost entries to their partition files and
// will never hold the leader's log, which settle would wait out.
func TestFault_CrashNegativeControl(t *testing.T) {
	t.Parallel()
	// No unsynced sector kept: after the lies the WAL's write headers say
	// synced what is not, and a sector kept past a lost one is damage the
	// WAL rightly refuses to open.
	r := &crashReplica{}
	c := newCrashCluster(t, r)
	w := startWorkload(c)
	w.progress(30)
	crashQuorum(c, w, r, syncsLie)
	w.progress(30)
	w.halt()
	c.heal()
	l := c.leader()
	if err := c.group(l).Raft().Barrier(patience).Error(); err != nil {
		t.Fatalf("barrier on %s: %v", c.ids[l], err)
	}
	v := w.h.check(t, c.log(l), c.entryTerms(l), c.net.leaderOf)
	_, v.splitTerms = c.net.terms()
	if v.ok() {
		t.Fatalf("the checks passed a disk that acknowledges syncs it did not make: %v", v)
	}
	t.Logf("the checks failed a disk that acknowledges syncs it did not make, as they must: %v; %s leads", v, c.ids[l])
}
