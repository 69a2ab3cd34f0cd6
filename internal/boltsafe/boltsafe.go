// Package boltsafe opens and uses bbolt files that may be damaged without
// letting the damage crash the process.
//
// bbolt trusts its file: a flipped byte in a page header, a freelist or a
// branch element makes it panic with "invalid freelist page", "page type is
// unknown" or slice bounds out of range, or read outside its memory map,
// and a fault there kills the process. This package turns such damage into
// an error wrapping ErrCorrupt that names the file:
//
//   - Open checks the file with its own reader, through ReadAt, with no
//     memory map and no panics, before bbolt touches it, under bbolt's file
//     lock: the meta page bbolt would pick, the freelist, and the B+trees.
//     Files up to FullCheckBytes, and files without a stored freelist,
//     which bbolt walks whole at Open anyway, get the full check. Larger
//     ones get a quick one, of the meta, the freelist, the root bucket's
//     tree and the top-level buckets' root pages, with Check for the rest.
//   - View and Update run bbolt with a deferred recover and
//     debug.SetPanicOnFault, so damage met later returns ErrCorrupt too:
//     pages the quick check did not read, a file changed under the process.
//
// bbolt's own tx.Check is not used: it runs in a goroutine of its own, where
// a panic on a damaged page cannot be recovered, and DB.Open walks a file
// without a stored freelist the same way, reporting damage with a panic in
// yet another goroutine. Checking first is what keeps those from running on
// damage.
//
// A missing or empty, 0-byte, file is not checked: bbolt creates a new
// database in it. A missing one is made as a temporary file linked into
// place once complete, so that a failed creation leaves nothing behind.
// Callers that must tell a new file from a truncated one look before they
// open.
//
// Not covered: db.Batch, whose transactions run in a timer goroutine where
// nothing can recover a panic; and damage below the top-level buckets' root
// pages of a file that got the quick check, which bbolt may meet outside
// View and Update, or in a way no recover catches, as when a cycle of pages
// makes its recursive descent overflow the stack. Run Check on such files
// first when that matters.
package boltsafe

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// ErrCorrupt is returned, wrapped with the file's path and what was wrong,
// when a file is not a bbolt file as bbolt writes it, or bbolt panicked or
// faulted reading it.
var ErrCorrupt = errors.New("boltsafe: corrupt file")

// FullCheckBytes is the largest file that Open checks in full. A full check
// reads every page in use once.
const FullCheckBytes = 64 << 20

// mode is the mode of the files Open creates.
const mode = 0o600

// Open opens the bbolt file at path with opts, or bbolt's defaults if opts
// is nil, after checking it, and returns ErrCorrupt naming the file for
// damage found by the check or met by bbolt while opening. Other errors,
// such as a lock held past opts.Timeout or permissions, are returned as
// bbolt returns them.
//
// The check holds a shared lock on the file, so it waits for another
// process, or another *bolt.DB in this one, that has the file open for
// writing, like bbolt's own Open, until opts.Timeout, forever if zero; the
// open after it may wait as long again.
func Open(path string, opts *bolt.Options) (*bolt.DB, error) {
	o := bolt.Options{}
	if opts != nil {
		o = *opts
	} else if bolt.DefaultOptions != nil {
		o = *bolt.DefaultOptions
	}
	info, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) && !o.ReadOnly {
		if err := create(path, &o); err != nil {
			return nil, err
		}
	} else if err == nil && info.Size() > 0 {
		s := scopeWritable
		switch {
		case info.Size() <= FullCheckBytes:
			s = scopeFull
		case o.ReadOnly:
			s = scopeQuick
		}
		ro, err := checkLocked(path, &o, s)
		if err != nil {
			return nil, err
		}
		// Between this Close and the Open below, only a bbolt writer of
		// its own may take the file; what it writes is bbolt's own.
		if err := ro.Close(); err != nil {
			return nil, err
		}
	}
	return openContained(path, &o)
}

// create makes a new bbolt file at path: bbolt initializes and syncs a
// temporary file, which is then linked into place and the directory synced.
// A creation that fails half-way, as on a full disk with bbolt's first pages
// written in part, then leaves no file at path that the next Open would take
// for a damaged one. A file that appeared at path meanwhile is kept.
func create(path string, o *bolt.Options) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, filepath.Base(path)+".*.new")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if err := f.Close(); err != nil {
		return err
	}
	db, err := openContained(tmp, o)
	if err != nil {
		return err
	}
	if err := db.Close(); err != nil {
		return err
	}
	if err := os.Link(tmp, path); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return SyncDir(dir)
}

// ReplaceFile makes path hold b, whole or not at all: a new file, synced,
// renamed over path, and the directory synced. It is for the small files
// kept beside the bbolt ones: the cluster's state cache, address book and
// node file.
func ReplaceFile(path string, b []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if serr := f.Sync(); err == nil {
		err = serr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// ErrNotTagged is ReadTagged's answer for a file that is not header, one
// line and a newline.
var ErrNotTagged = errors.New("boltsafe: not a tagged file")

// ReadTagged returns the value of a tagged file, as WriteTagged wrote it:
// header (ending in a newline), the value and a newline. found is false
// when the file does not exist; a file of another shape, or an empty
// value, is ErrNotTagged naming it.
func ReadTagged(path, header string) (value string, found bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	v, hasHeader := strings.CutPrefix(string(b), header)
	v, hasEnd := strings.CutSuffix(v, "\n")
	if !hasHeader || !hasEnd || v == "" || strings.ContainsAny(v, "\n\x00") {
		return "", false, fmt.Errorf("%w: %s", ErrNotTagged, path)
	}
	return v, true, nil
}

// WriteTagged makes path a tagged file holding value (see ReadTagged),
// whole or not at all (ReplaceFile), its directory made if missing.
func WriteTagged(path, header, value string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return ReplaceFile(path, []byte(header+value+"\n"))
}

// SyncDir fsyncs directory dir, so that the names created, renamed or
// removed in it last are durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// Check checks the whole bbolt file at path, as Open does for small files,
// taking a shared lock on it as a read-only bbolt open does, waiting until
// opts.Timeout; opts may be nil. It returns nil or an error wrapping
// ErrCorrupt for damage; the file must exist.
func Check(path string, opts *bolt.Options) error {
	return CheckView(path, opts, nil)
}

// CheckView is Check, then, if the file passed and fn is not nil, fn in a
// read transaction of it, with the same lock: a caller's own checks of the
// file's content cost no second open.
func CheckView(path string, opts *bolt.Options, fn func(*bolt.Tx) error) error {
	o := bolt.Options{}
	if opts != nil {
		o = *opts
	}
	ro, err := checkLocked(path, &o, scopeFull)
	if err != nil {
		return err
	}
	if fn != nil {
		err = View(ro, fn)
	}
	if cerr := ro.Close(); err == nil {
		err = cerr
	}
	return err
}

// checkLocked opens path read-only through bbolt, which takes the shared
// file lock and validates the meta pages without reading further, then
// checks the file through a descriptor of its own. It returns the read-only
// DB, still open and holding the lock, when the file passed.
func checkLocked(path string, opts *bolt.Options, s scope) (*bolt.DB, error) {
	ro, err := openContained(path, &bolt.Options{
		ReadOnly: true,
		Timeout:  opts.Timeout,
		PageSize: opts.PageSize,
		OpenFile: opts.OpenFile,
	})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) || errors.Is(err, ErrCorrupt) || errors.Is(err, os.ErrNotExist) || errors.Is(err, os.ErrPermission) {
			return nil, err
		}
		// bbolt refused the file, for invalid meta pages or as too
		// small: say why in our terms if the check can, else pass bbolt's
		// error on.
		if cerr := checkFile(path, scopeQuick); cerr != nil {
			return nil, cerr
		}
		return nil, err
	}
	if err := checkFile(path, s); err != nil {
		ro.Close()
		return nil, err
	}
	return ro, nil
}

// checkFile checks the file at path through a descriptor of its own.
func checkFile(path string, s scope) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return err
	}
	err = check(f, info.Size(), s)
	if errors.Is(err, errDamage) {
		return fmt.Errorf("%w: %s: %v", ErrCorrupt, path, strings.ReplaceAll(err.Error(), errDamage.Error()+": ", ""))
	}
	return err
}

// openContained runs bolt.Open, turning a panic in it into ErrCorrupt. A
// DB whose Open panicked cannot be closed: its descriptor, lock and memory
// map stay until the process ends. Open's check makes this unreachable for
// damage present before the call.
func openContained(path string, opts *bolt.Options) (db *bolt.DB, err error) {
	defer contain(func() string { return path }, &err, debug.SetPanicOnFault(true))
	return bolt.Open(path, mode, opts)
}

// View runs db.View(fn). A panic of bbolt, or a memory fault, inside it,
// from damage met while reading, returns an error wrapping ErrCorrupt
// naming db's file; a panic of fn's own code is passed on.
func View(db *bolt.DB, fn func(*bolt.Tx) error) (err error) {
	defer contain(db.Path, &err, debug.SetPanicOnFault(true)) // the path is read only for a panic: Close clears it
	return db.View(fn)
}

// Update runs db.Update(fn), containing panics as View does. After an
// ErrCorrupt from Update, bbolt's in-memory state, its freelist and its
// write lock, may be inconsistent: stop writing and close the DB.
func Update(db *bolt.DB, fn func(*bolt.Tx) error) (err error) {
	defer contain(db.Path, &err, debug.SetPanicOnFault(true)) // the path is read only for a panic: Close clears it
	return db.Update(fn)
}

// contain is deferred by every bbolt call of this package, with the
// goroutine's SetPanicOnFault setting from before the call: the deferred
// call's arguments are evaluated on the way in, so faults panic for the
// whole call. It restores that setting and turns a panic raised in bbolt's
// code, or a memory fault, into an error wrapping ErrCorrupt for path.
// Other panics go on.
func contain(path func() string, err *error, onFault bool) {
	debug.SetPanicOnFault(onFault)
	r := recover()
	if r == nil {
		return
	}
	if !fromBolt(r) {
		panic(r)
	}
	*err = fmt.Errorf("%w: %s: bbolt: %v", ErrCorrupt, path(), r)
}

// fromBolt reports whether the panic being recovered, r, is a memory fault
// or was raised by bbolt's code. Called from a deferred function, it still
// sees the panicking frames: the first one outside the runtime is where the
// panic began.
func fromBolt(r any) bool {
	if _, ok := r.(interface{ Addr() uintptr }); ok {
		return true // a fault: bbolt or fn read a page that is not there
	}
	pcs := make([]uintptr, 64)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs)])
	for {
		f, more := frames.Next()
		if !strings.HasPrefix(f.Function, "runtime.") {
			return strings.HasPrefix(f.Function, "go.etcd.io/bbolt.") || strings.HasPrefix(f.Function, "go.etcd.io/bbolt/")
		}
		if !more {
			return false
		}
	}
}
