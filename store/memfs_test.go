package store_test

import (
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/zeze-go/mq/store"
)

// memFS is an in-memory store.FS that keeps, per file, the contents last
// synced, and per directory the entries last synced. Crash images revert
// every file to its synced contents (optionally keeping a random subset of
// the unsynced 512-byte sectors, as a power loss can) and the directory to
// its synced entries. After Crash every operation fails with EIO.
type memFS struct {
	mu      sync.Mutex
	files   map[string]*memNode // current entries
	durable map[string]*memNode // entries as of the last SyncDir
	dirs    map[string]bool
	crashed bool
	// fail, if set, is asked before every write, sync and truncate.
	fail func(op, name string) error
	ops  int
}

type memNode struct {
	data   []byte
	synced []byte
	dirty  []bool // sectors written since the last sync
	ndirty int
	list   []int // the dirty sectors
}

func (n *memNode) mark(from, to int64) {
	for sec := int(from / 512); sec <= int((to-1)/512); sec++ {
		for sec >= len(n.dirty) {
			n.dirty = append(n.dirty, make([]bool, len(n.dirty)+64)...)
		}
		if !n.dirty[sec] {
			n.dirty[sec] = true
			n.ndirty++
			n.list = append(n.list, sec)
		}
	}
}

func (n *memNode) sync() {
	if len(n.synced) != len(n.data) {
		s := make([]byte, len(n.data))
		copy(s, n.synced)
		n.synced = s
	}
	for _, sec := range n.list {
		n.dirty[sec] = false
		s, e := sec*512, min(sec*512+512, len(n.data))
		if s < e {
			copy(n.synced[s:e], n.data[s:e])
		}
	}
	n.ndirty, n.list = 0, n.list[:0]
}

func newMemFS() *memFS {
	return &memFS{files: map[string]*memNode{}, durable: map[string]*memNode{}, dirs: map[string]bool{}}
}

func (m *memFS) check(op, name string) error {
	if m.crashed {
		return syscall.EIO
	}
	m.ops++
	if m.fail != nil {
		return m.fail(op, name)
	}
	return nil
}

func (m *memFS) OpenFile(name string, flag int, perm fs.FileMode) (store.File, error) {
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
	case !ok:
		n = &memNode{}
		m.files[name] = n
	}
	return &memFile{fs: m, n: n, name: name}, nil
}

func (m *memFS) ReadDir(dir string) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.crashed {
		return nil, syscall.EIO
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

func (m *memFS) Remove(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check("remove", name); err != nil {
		return err
	}
	if _, ok := m.files[name]; !ok {
		return &fs.PathError{Op: "remove", Path: name, Err: fs.ErrNotExist}
	}
	delete(m.files, name)
	return nil
}

func (m *memFS) MkdirAll(dir string, perm fs.FileMode) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dirs[path.Clean(dir)] = true
	return nil
}

func (m *memFS) SyncDir(dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check("syncdir", dir); err != nil {
		return err
	}
	dir = path.Clean(dir)
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
// powerLoss, the synced entries and contents (plus, with rng, a random
// subset of the unsynced sectors); without, everything written. The
// receiver is marked crashed.
func (m *memFS) Image(powerLoss bool, rng *rand.Rand) *memFS {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.crashed = true
	out := newMemFS()
	for d := range m.dirs {
		out.dirs[d] = true
	}
	src := m.files
	if powerLoss {
		src = m.durable
	}
	for name, n := range src {
		var b []byte
		if !powerLoss {
			b = slices.Clone(n.data)
		} else {
			b = slices.Clone(n.synced)
			if rng != nil && (n.ndirty > 0 || len(n.data) != len(n.synced)) {
				if rng.IntN(2) == 0 && len(n.data) > len(b) {
					b = append(b, make([]byte, len(n.data)-len(b))...)
				}
				for _, sec := range n.list {
					s, e := sec*512, min(sec*512+512, len(b), len(n.data))
					if s < e && rng.IntN(2) == 0 {
						copy(b[s:e], n.data[s:e])
					}
				}
			}
		}
		node := &memNode{data: b, synced: slices.Clone(b)}
		out.files[name] = node
		out.durable[name] = node
	}
	return out
}

// Names returns the current file names containing sub.
func (m *memFS) Names(sub string) []string {
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
func (m *memFS) Bytes(name string) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n, ok := m.files[name]; ok {
		return slices.Clone(n.data)
	}
	return nil
}

// SetBytes replaces a file's contents (current and synced).
func (m *memFS) SetBytes(name string, b []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.files[name]
	n.data, n.synced, n.dirty, n.ndirty, n.list = slices.Clone(b), slices.Clone(b), nil, 0, nil
}

type memFile struct {
	fs   *memFS
	n    *memNode
	name string
}

func (f *memFile) ReadAt(b []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.fs.crashed {
		return 0, syscall.EIO
	}
	if off >= int64(len(f.n.data)) {
		return 0, io.EOF
	}
	n := copy(b, f.n.data[off:])
	if n < len(b) {
		return n, io.EOF
	}
	return n, nil
}

func (f *memFile) WriteAt(b []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.fs.check("write", f.name); err != nil {
		return 0, err
	}
	if end := off + int64(len(b)); end > int64(len(f.n.data)) {
		f.n.data = append(f.n.data, make([]byte, end-int64(len(f.n.data)))...)
	}
	copy(f.n.data[off:], b)
	if len(b) > 0 {
		f.n.mark(off, off+int64(len(b)))
	}
	return len(b), nil
}

func (f *memFile) Sync() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.fs.check("sync", f.name); err != nil {
		return err
	}
	f.n.sync()
	return nil
}

func (f *memFile) Truncate(size int64) error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.fs.check("truncate", f.name); err != nil {
		return err
	}
	if size < int64(len(f.n.data)) {
		f.n.data = f.n.data[:size:size]
	} else {
		f.n.data = append(f.n.data, make([]byte, size-int64(len(f.n.data)))...)
	}
	return nil
}

func (f *memFile) Size() (int64, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.fs.crashed {
		return 0, syscall.EIO
	}
	return int64(len(f.n.data)), nil
}

func (f *memFile) Close() error { return nil }
