// Package memfs is an in-memory store.FS that keeps only what was synced
// across a crash: a test crashes it at a chosen operation, or fails the
// operations it picks, then reopens the image the crash left. Only tests
// import it.
package memfs

import (
	"bytes"
	"io"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/zeze-go/mq/store"
)

// FS is an in-memory store.FS that keeps, per file, the contents last
// synced, and per directory the entries last synced. Crash images revert
// every file to its synced contents and the directory to its synced
// entries; they may keep a random subset of the unsynced 512-byte sectors,
// as a power loss can. After a crash every operation fails with EIO.
//
// Faults behave as on Linux: a write that fails may have landed a prefix
// of whole pages. A sync that fails loses the sectors it was writing back:
// they stay readable, as the page cache keeps them, but no later sync
// writes them, which is fsyncgate. Every other handle of the file open at
// the time reports the error at its next sync, as errseq does. A closed
// handle fails.
type FS struct {
	mu      sync.Mutex
	files   map[string]*node // current entries
	durable map[string]*node // entries as of the last SyncDir
	dirs    map[string]bool  // directory -> its entry in its parent is durable
	crashed bool
	fail    func(op Op) error // see SetFail
	failOps int               // operations since fail was set
	ops     int               // writes, syncs, truncates, removes and directory syncs so far
	// crashAt, if positive, is the operation CrashAt armed: onCrash gets
	// the image, made with crashLoss and crashRng.
	crashAt   int
	crashLoss bool
	crashRng  *rand.Rand
	onCrash   func(img *FS)
}

// node is a file: its current sectors and those as of its last sync,
// each kept only when it holds a non-zero byte, since segments are mostly
// zeros allocated ahead of the writer.
type node struct {
	data, synced map[int64]*sector
	size, ssize  int64
	dirty        map[int64]bool // sectors written or cut since the last sync
	wbErr        int            // failed syncs so far, for errseq
}

const sectorSize = 512

type sector [sectorSize]byte

func newNode() *node {
	return &node{data: map[int64]*sector{}, synced: map[int64]*sector{}, dirty: map[int64]bool{}}
}

func (n *node) writeAt(b []byte, off int64) {
	for len(b) > 0 {
		sec, in := off/sectorSize, off%sectorSize
		k := min(int64(len(b)), sectorSize-in)
		part := b[:k]
		if s := n.data[sec]; s != nil {
			copy(s[in:], part)
			n.dirty[sec] = true
		} else if !isZero(part) {
			s = &sector{}
			copy(s[in:], part)
			n.data[sec] = s
			n.dirty[sec] = true
		} else if n.synced[sec] != nil {
			n.dirty[sec] = true // zeros over synced data: the sector is absent now
		}
		b, off = b[k:], off+k
	}
	n.size = max(n.size, off)
}

func (n *node) readAt(b []byte, off int64) int {
	if off >= n.size {
		return 0
	}
	b = b[:min(int64(len(b)), n.size-off)]
	for done := 0; done < len(b); {
		sec, in := (off+int64(done))/sectorSize, (off+int64(done))%sectorSize
		k := min(len(b)-done, int(sectorSize-in))
		if s := n.data[sec]; s != nil {
			copy(b[done:done+k], s[in:])
		} else {
			clear(b[done : done+k])
		}
		done += k
	}
	return len(b)
}

func (n *node) truncate(size int64) {
	if size < n.size {
		for sec := range n.data {
			if sec*sectorSize >= size {
				delete(n.data, sec)
				n.dirty[sec] = true
			}
		}
		if in := size % sectorSize; in != 0 {
			if s := n.data[size/sectorSize]; s != nil {
				clear(s[in:])
				n.dirty[size/sectorSize] = true
			}
		}
	}
	n.size = size
}

// lose forgets what was being written back, as a failed sync does: the
// sectors stay as they are, as the page cache keeps them, but are no longer
// dirty, so no later sync writes them.
func (n *node) lose() {
	clear(n.dirty)
	n.wbErr++
}

func (n *node) sync() {
	for sec := range n.dirty {
		if s := n.data[sec]; s != nil {
			c := *s
			n.synced[sec] = &c
		} else {
			delete(n.synced, sec)
		}
	}
	clear(n.dirty)
	n.ssize = n.size
}

// crashed returns the node a crash leaves: with powerLoss, the synced
// sectors and size plus, with rng, a random subset of the unsynced sectors
// and perhaps the new size; without, everything written.
func (n *node) crashed(powerLoss bool, rng *rand.Rand) *node {
	out := newNode()
	src, size := n.data, n.size
	if powerLoss {
		src, size = n.synced, n.ssize
	}
	for sec, s := range src {
		c := *s
		out.data[sec] = &c
	}
	if powerLoss && rng != nil && (len(n.dirty) > 0 || n.size != n.ssize) {
		if rng.IntN(2) == 0 {
			size = n.size
		}
		secs := make([]int64, 0, len(n.dirty))
		for sec := range n.dirty {
			secs = append(secs, sec)
		}
		slices.Sort(secs)
		for _, sec := range secs {
			if rng.IntN(2) != 0 {
				continue
			}
			if s := n.data[sec]; s != nil {
				c := *s
				out.data[sec] = &c
			} else {
				delete(out.data, sec)
			}
		}
	}
	out.truncate(size)
	clear(out.dirty)
	for sec, s := range out.data {
		c := *s
		out.synced[sec] = &c
	}
	out.ssize = size
	return out
}

var _ store.FS = (*FS)(nil)

var zeroSector sector

func isZero(b []byte) bool { return bytes.Equal(b, zeroSector[:len(b)]) }

// New returns an empty file system.
func New() *FS {
	return &FS{files: map[string]*node{}, durable: map[string]*node{}, dirs: map[string]bool{}}
}

// Op is an operation SetFail's hook is asked about.
type Op struct {
	Kind string // "write", "sync", "truncate", "remove" or "syncdir"
	Name string // the file, or the directory of a syncdir
	// N numbers the operations from the one after SetFail, from 1.
	N int
	// Data is a write's bytes, valid during the call.
	Data []byte
}

// SetFail makes fail, unless nil, decide the outcome of every write, sync,
// truncate, remove and directory sync from now: a non-nil error fails the
// operation as that call on Linux would fail. fail runs with the file
// system locked: it must not call its methods.
func (m *FS) SetFail(fail func(op Op) error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fail, m.failOps = fail, 0
}

func (m *FS) check(kind, name string, data []byte) error {
	if m.crashed {
		return syscall.EIO
	}
	m.ops++
	m.failOps++
	if m.crashAt > 0 && m.ops == m.crashAt {
		m.crashLocked()
		return syscall.EIO
	}
	if m.fail != nil {
		return m.fail(Op{Kind: kind, Name: name, N: m.failOps, Data: data})
	}
	return nil
}

// OpenFile implements store.FS.
func (m *FS) OpenFile(name string, flag int, perm fs.FileMode) (store.File, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.crashed {
		return nil, syscall.EIO
	}
	n, ok := m.files[name]
	switch {
	case ok && flag&os.O_CREATE != 0 && flag&os.O_EXCL != 0:
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrExist}
	case !ok && flag&os.O_CREATE == 0:
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	case !ok && !m.reachable(path.Dir(name)):
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	case !ok:
		n = newNode()
		m.files[name] = n
	}
	return &file{fs: m, n: n, name: name, seen: n.wbErr}, nil
}

// ReadDir implements store.FS.
func (m *FS) ReadDir(dir string) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.crashed {
		return nil, syscall.EIO
	}
	if !m.reachable(path.Clean(dir)) {
		return nil, &fs.PathError{Op: "readdir", Path: dir, Err: fs.ErrNotExist}
	}
	var out []string
	for name := range m.files {
		if path.Dir(name) == path.Clean(dir) {
			out = append(out, path.Base(name))
		}
	}
	slices.Sort(out)
	return out, nil
}

// Remove implements store.FS.
func (m *FS) Remove(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check("remove", name, nil); err != nil {
		return err
	}
	if _, ok := m.files[name]; !ok {
		return &fs.PathError{Op: "remove", Path: name, Err: fs.ErrNotExist}
	}
	delete(m.files, name)
	return nil
}

// MkdirAll implements store.FS: a new directory is durable once its
// parent is synced.
func (m *FS) MkdirAll(dir string, perm fs.FileMode) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.crashed {
		return syscall.EIO
	}
	for d := path.Clean(dir); d != "/" && d != "." && !m.dirs[d] && !m.hasDir(d); d = path.Dir(d) {
		m.dirs[d] = false // not durable until its parent is synced
	}
	return nil
}

func (m *FS) hasDir(d string) bool {
	_, ok := m.dirs[d]
	return ok
}

// SyncDir implements store.FS.
func (m *FS) SyncDir(dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check("syncdir", dir, nil); err != nil {
		return err
	}
	dir = path.Clean(dir)
	for d := range m.dirs {
		if path.Dir(d) == dir {
			m.dirs[d] = true
		}
	}
	for name := range m.durable {
		if path.Dir(name) == dir {
			if _, ok := m.files[name]; !ok {
				delete(m.durable, name)
			}
		}
	}
	for name, n := range m.files {
		if path.Dir(name) == dir {
			m.durable[name] = n
		}
	}
	return nil
}

// Image returns the file system a crash at this instant leaves: with
// powerLoss, the synced entries and contents plus, with rng, a random
// subset of the unsynced sectors; without, everything written. The
// receiver is marked crashed.
func (m *FS) Image(powerLoss bool, rng *rand.Rand) *FS {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.imageLocked(powerLoss, rng)
}

// Ops returns how many writes, syncs, truncates, removes and directory
// syncs the file system has seen.
func (m *FS) Ops() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ops
}

// CrashAt arms a crash at the n-th write, sync, truncate, remove or
// directory sync from now: that operation fails with EIO and nothing after
// it reaches the disk. onCrash gets the image the crash leaves, as Image
// makes it, of a power loss or of a process crash, after which what was
// written stays, while the operation waits.
func (m *FS) CrashAt(n int, powerLoss bool, rng *rand.Rand, onCrash func(img *FS)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.crashAt, m.crashLoss, m.crashRng, m.onCrash = m.ops+n, powerLoss, rng, onCrash
}

// CrashNow crashes the file system as CrashAt would, unless it crashed.
func (m *FS) CrashNow() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.crashed {
		m.crashLocked()
	}
}

func (m *FS) crashLocked() {
	img := m.imageLocked(m.crashLoss, m.crashRng)
	if m.onCrash != nil {
		m.onCrash(img)
	}
}

func (m *FS) imageLocked(powerLoss bool, rng *rand.Rand) *FS {
	m.crashed = true
	out := New()
	src := m.files
	if powerLoss {
		// The synced entries; with rng, each unsynced change of an entry,
		// a file created, removed or replaced or a directory created, may
		// have reached the disk too, as a journal commit for another file
		// takes it along.
		src = maps.Clone(m.durable)
		var changed []string
		for name, n := range m.files {
			if m.durable[name] != n {
				changed = append(changed, name)
			}
		}
		for name := range m.durable {
			if _, ok := m.files[name]; !ok {
				changed = append(changed, name)
			}
		}
		slices.Sort(changed)
		for _, name := range changed {
			if rng == nil || rng.IntN(2) != 0 {
				continue
			}
			if n, ok := m.files[name]; ok {
				src[name] = n
			} else {
				delete(src, name)
			}
		}
	}
	dirs := slices.Sorted(maps.Keys(m.dirs))
	for _, d := range dirs {
		if !powerLoss || m.dirs[d] || rng != nil && rng.IntN(2) == 0 {
			out.dirs[d] = true
		}
	}
	names := make([]string, 0, len(src))
	for name := range src {
		if out.reachable(path.Dir(name)) {
			names = append(names, name)
		}
	}
	slices.Sort(names) // rng is used in the same order each time
	for _, name := range names {
		node := src[name].crashed(powerLoss, rng)
		out.files[name] = node
		out.durable[name] = node
	}
	for d := range out.dirs {
		if !out.reachable(d) {
			delete(out.dirs, d)
		}
	}
	return out
}

// reachable reports whether directory d and its parents exist.
func (m *FS) reachable(d string) bool {
	for ; d != "/" && d != "."; d = path.Dir(d) {
		if !m.hasDir(d) {
			return false
		}
	}
	return true
}

// Names returns the current file names containing sub.
func (m *FS) Names(sub string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for n := range m.files {
		if strings.Contains(n, sub) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// Bytes returns a copy of a file's current contents.
func (m *FS) Bytes(name string) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, ok := m.files[name]
	if !ok {
		return nil
	}
	b := make([]byte, n.size)
	n.readAt(b, 0)
	return b
}

// SetBytes replaces a file's current and synced contents.
func (m *FS) SetBytes(name string, b []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.files[name]
	n.truncate(0)
	n.writeAt(b, 0)
	n.size = int64(len(b))
	n.sync()
}

type file struct {
	fs     *FS
	n      *node
	name   string
	seen   int // n.wbErr reported to this handle
	closed bool
}

// use checks that f is open and the file system not crashed.
func (f *file) use() error {
	switch {
	case f.closed:
		return os.ErrClosed
	case f.fs.crashed:
		return syscall.EIO
	}
	return nil
}

func (f *file) ReadAt(b []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.use(); err != nil {
		return 0, err
	}
	n := f.n.readAt(b, off)
	if n < len(b) {
		return n, io.EOF
	}
	return n, nil
}

func (f *file) WriteAt(b []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.use(); err != nil {
		return 0, err
	}
	err := f.fs.check("write", f.name, b)
	if err != nil {
		if f.fs.crashed {
			return 0, err
		}
		// The pages before the one that failed landed.
		k := max(0, (off+int64(len(b))/2)/4096*4096-off)
		f.n.writeAt(b[:k], off)
		return int(k), err
	}
	f.n.writeAt(b, off)
	return len(b), nil
}

func (f *file) Sync() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.use(); err != nil {
		return err
	}
	if err := f.fs.check("sync", f.name, nil); err != nil {
		if !f.fs.crashed {
			f.n.lose()
			f.seen = f.n.wbErr
		}
		return err
	}
	f.n.sync()
	if f.seen != f.n.wbErr {
		f.seen = f.n.wbErr
		return syscall.EIO // another handle's sync failed since this one's last
	}
	return nil
}

func (f *file) Truncate(size int64) error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.use(); err != nil {
		return err
	}
	if err := f.fs.check("truncate", f.name, nil); err != nil {
		return err
	}
	f.n.truncate(size)
	return nil
}

func (f *file) Size() (int64, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.use(); err != nil {
		return 0, err
	}
	return f.n.size, nil
}

func (f *file) Close() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.closed {
		return os.ErrClosed
	}
	f.closed = true
	return nil
}

// Size returns a file's current size.
func (m *FS) Size(name string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n, ok := m.files[name]; ok {
		return n.size
	}
	return 0
}
