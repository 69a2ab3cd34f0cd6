package store

import (
	"io"
	"io/fs"
	"os"
	"slices"
)

// FS is the file system the store writes its own files through: the
// write-ahead log. bbolt writes partition files itself, with its own
// fsyncs. Tests substitute a file system that keeps only synced bytes, or
// fails a chosen write or sync.
type FS interface {
	// OpenFile opens name with os.OpenFile's flags.
	OpenFile(name string, flag int, perm fs.FileMode) (File, error)
	// ReadDir returns the names in dir, sorted.
	ReadDir(dir string) ([]string, error)
	// Remove deletes name; the deletion is durable after SyncDir.
	Remove(name string) error
	// MkdirAll creates dir and its parents.
	MkdirAll(dir string, perm fs.FileMode) error
	// SyncDir makes the entries created and removed in dir durable.
	SyncDir(dir string) error
}

// File is an open file of an FS. Handles of one file share its contents;
// each reports a failed write-back to its own Sync.
type File interface {
	io.ReaderAt
	io.WriterAt
	// Sync makes the file's data and size durable, as fdatasync does.
	Sync() error
	Truncate(size int64) error
	Size() (int64, error)
	Close() error
}

// OSFS is the operating system's file system.
type OSFS struct{}

var _ FS = OSFS{}

// OpenFile implements FS.
func (OSFS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

// ReadDir implements FS.
func (OSFS) ReadDir(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(ents))
	for i, e := range ents {
		names[i] = e.Name()
	}
	slices.Sort(names)
	return names, nil
}

// Remove implements FS.
func (OSFS) Remove(name string) error { return os.Remove(name) }

// MkdirAll implements FS.
func (OSFS) MkdirAll(dir string, perm fs.FileMode) error { return os.MkdirAll(dir, perm) }

// SyncDir implements FS.
func (OSFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

type osFile struct{ f *os.File }

func (f osFile) ReadAt(b []byte, off int64) (int, error)  { return f.f.ReadAt(b, off) }
func (f osFile) WriteAt(b []byte, off int64) (int, error) { return f.f.WriteAt(b, off) }
func (f osFile) Sync() error                              { return fdatasync(f.f) }
func (f osFile) Truncate(size int64) error                { return f.f.Truncate(size) }
func (f osFile) Close() error                             { return f.f.Close() }

func (f osFile) Size() (int64, error) {
	fi, err := f.f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// MkdirAll creates dir and its missing parents on the operating system's
// file system, syncing the parent of each directory it creates: a power
// loss cannot then take a directory with the synced files in it. POSIX
// makes a new entry durable only once its directory is synced.
func MkdirAll(dir string) error {
	if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
		return nil // the common case, every partition of a topic: no listing
	}
	return mkdirDurable(OSFS{}, dir)
}
