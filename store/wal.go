package store

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"os"
	"path"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// WAL is a node-level write-ahead log of named streams. One writer goroutine
// gathers the appends of every stream into one write and one fdatasync, so
// one flush covers the batches of all partitions and the entries of every
// raft group and DoubleWrite log of the node. A stream's owner releases its
// records once they are no longer needed, a partition once they are in its
// file, and a segment is deleted when nothing in it is needed.
//
// Segment file: a header, walMagic then a random salt of 8 bytes, then
// writes, each a write header frame followed by the frames of its records. A
// frame is
//
//	length uint32 BE | crc32c(body) uint32 BE | body
//	body: type uint8, then
//	  frameWrite:  salt (8), write number uint64 BE, synced uint64 BE
//	  frameRecord: stream name length uint16 BE, name, payload
//
// Records are acknowledged only after a sync covers them, and a write starts
// only after the one before it was synced, unless SyncInterval is set; a
// write header's synced is the offset in its segment below which everything
// was synced when the write began. Once a sync returns, a write header,
// the seal, is written after the records it covered, without a sync of its
// own; the next write puts its own header there. So after a crash only the
// bytes past the last synced offset can be torn, and an intact header says
// where that offset was. A bad frame at offset x of the newest segment is a
// torn tail, and is cut, when no intact write header after x says the
// segment was synced past x; otherwise, and anywhere in an older segment, it
// is ErrCorrupt. The salt, new for each segment, keeps bytes inside a record
// from passing for a write header, since a message body can hold anything;
// an intact write header with another salt than the segment header's where
// a frame starts is damage.
// Segments are zero-filled ahead of the writer, so a clean end of the
// records reads as a zero length.
//
// The size of a segment is extended, and synced, before anything is
// written past it, and always leaves walTailRoom bytes after the last
// write, room for its seal and a zero length after that: every byte ever
// written lies below a durable size, so a crash cannot cut the file inside
// the records. A frame running past the end of the file, or records ending
// less than walFrameLen bytes before it, is therefore a truncation, and
// ErrCorrupt, not a torn tail. Segments of format 2, walMagicV2, predate
// this rule and are read without it. A torn tail is cut by zeroing it, so
// that the size stays one the writer synced.
//
// Lock order: closeMu, for reading, before qmu; mu and extMu are taken
// alone.
// No lock is held while a done callback runs.
type WAL struct {
	dir     string
	fs      FS
	segSize int64
	every   time.Duration

	// The appends waiting for the writer. Append never blocks: each
	// stream's owner bounds what it has in flight, as a partition does with
	// its MaxPendingBytes.
	qmu    sync.Mutex
	queue  []*walReq
	queued chan struct{} // cap 1: the queue is not empty
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once

	closeMu sync.RWMutex
	closing bool

	mu   sync.Mutex     // guards refs, cur, err, old, rec, files
	refs map[uint64]int // segment -> records not yet released
	cur  uint64         // segment being written
	err  error          // sticky: after a failed write or sync nothing is appended
	old  []uint64       // segments found at Open, deleted by FinishRecovery
	rec  map[string][]walLoc
	// files holds segments open for reading: those of the previous run
	// while streams recover, and those holding records streams retain.
	files    map[uint64]File
	retained map[string]bool // streams that called Retain

	// The current segment. The writer goroutine owns size, wseq and synced;
	// extMu guards swapping the files and extending; alloc is read without it.
	extMu   sync.Mutex
	f, ext  File    // the writer's handle and the extender's own
	size    int64   // bytes of header and frames in f
	wseq    uint64  // writes so far
	synced  int64   // offset in f below which everything is synced
	salt    [8]byte // the segment's, in its header and each write header
	sealBuf []byte
	dirty   bool         // written since the last sync, with SyncInterval
	alloc   atomic.Int64 // bytes of f written, zeros past size included
	end     atomic.Int64 // end of the records in f, for the extender
	extWake chan struct{}
	extDone chan struct{}

	// ackEarly, set only by tests, acknowledges each write before its
	// sync: the broken build the crash tests must catch.
	ackEarly bool
}

// WALOptions tune a WAL. The zero value syncs every write before its
// records are acknowledged, on the operating system's file system.
type WALOptions struct {
	// FS is the file system of the segments. Default OSFS.
	FS FS
	// SyncInterval, when positive, acknowledges records once written and
	// syncs every SyncInterval instead, as RocketMQ's ASYNC_FLUSH does: a
	// process crash loses nothing, a power loss may lose the last interval.
	// Records appended with AppendRecord, the raft logs', are synced before
	// they are acknowledged all the same.
	SyncInterval time.Duration
	// SegmentSize is the size at which a new segment starts. Default 64 MiB.
	SegmentSize int64
}

// walLoc is where recovery found a record: its payload's place in a segment.
type walLoc struct {
	seg    uint64
	off    int64 // of the frame
	n      int   // frame length, header included
	legacy uint64
}

type walReq struct {
	stream  string
	payload []byte
	done    func(seg uint64, err error)
	doneAt  func(r WALRecord, err error) // instead of done: AppendRecord
	off     int64                        // of its frame, set by write
	n       int
}

// finish calls the request's callback.
func (r *walReq) finish(seg uint64, err error) {
	if r.doneAt != nil {
		r.doneAt(WALRecord{Seg: seg, Off: r.off, N: r.n}, err)
	} else {
		r.done(seg, err)
	}
}

const (
	// walMagic is format 3. Its version byte is 3 bits away from those of
	// formats 1 and 2, so that a bit or two flipped in it cannot pass for
	// an older format and be read by that format's rules.
	walMagic       = "ZZMQWAL\x0c"
	walMagicV2     = "ZZMQWAL\x02" // format 2: no rule on the size of a segment
	walMagicV1     = "ZZMQWAL\x01"
	walHeaderLen   = int64(len(walMagic)) + 8 // magic, salt
	walFrameLen    = 8
	frameWrite     = 1
	frameRecord    = 2
	writeBodyLen   = 1 + 8 + 8 + 8
	walSegmentSize = 64 << 20
	// walMaxFrame bounds a frame: the largest gen and its stream's name.
	walMaxFrame = maxGenBytes + 1 + 2 + MaxKeyBytes
	// walChunk is how far a segment is extended with zeros at a time. An
	// fdatasync after an append that grows the file must also commit the
	// file system's journal for the size and the new blocks; writing into
	// blocks already written and synced costs only the data flush.
	walChunk = 4 << 20
	// walTailRoom is what the writer keeps allocated and synced after its
	// last write: a seal, then a zero frame length.
	walTailRoom = walFrameLen + writeBodyLen + walFrameLen
)

var walZeros = make([]byte, 1<<20)

// ErrWALFailed is returned for appends after the WAL could not write or sync.
var ErrWALFailed = errors.New("store: write-ahead log failed")

// OpenWAL opens the write-ahead log in dir, creating it if needed, checks
// every record left by the previous run, cutting a torn tail, and starts a
// new segment. Streams recover their records with Recover; once every
// stream has, FinishRecovery deletes the old segments. Open reads the
// segments one frame at a time: it keeps where each record is, not the
// records.
func OpenWAL(dir string, opts WALOptions) (*WAL, error) {
	if opts.FS == nil {
		opts.FS = OSFS{}
	}
	if opts.SegmentSize <= 0 {
		opts.SegmentSize = walSegmentSize
	}
	if opts.SyncInterval < 0 {
		return nil, fmt.Errorf("store: negative WAL sync interval %v", opts.SyncInterval)
	}
	if err := mkdirDurable(opts.FS, dir); err != nil {
		return nil, fmt.Errorf("store: wal %s: %w", dir, err)
	}
	w := &WAL{
		dir:     dir,
		fs:      opts.FS,
		segSize: opts.SegmentSize,
		every:   opts.SyncInterval,
		queued:  make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		refs:    map[uint64]int{},
		extWake: make(chan struct{}, 1),
		extDone: make(chan struct{}),
		rec:     map[string][]walLoc{},
		files:   map[uint64]File{},
	}
	segs, err := w.segments()
	if err != nil {
		return nil, err
	}
	for i, s := range segs {
		if err := w.scan(s, i == len(segs)-1); err != nil {
			w.closeFiles()
			return nil, err
		}
	}
	w.old = segs
	next := uint64(1)
	if len(segs) > 0 {
		next = segs[len(segs)-1] + 1
	}
	if err := w.create(next); err != nil {
		w.closeFiles()
		return nil, err
	}
	go w.run()
	go w.extender()
	return w, nil
}

// mkdirDurable creates dir and its missing parents, and syncs the parent
// of each one it created: a directory's entry is durable only then, and a
// power loss could otherwise take the WAL with every acknowledged record.
func mkdirDurable(fsys FS, dir string) error {
	var missing []string
	for d := path.Clean(dir); d != "/" && d != "."; d = path.Dir(d) {
		if _, err := fsys.ReadDir(d); !errors.Is(err, os.ErrNotExist) {
			break
		}
		missing = append(missing, d)
	}
	if err := fsys.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := fsys.SyncDir(path.Dir(missing[i])); err != nil {
			return err
		}
	}
	return nil
}

func (w *WAL) segPath(seg uint64) string {
	return path.Join(w.dir, fmt.Sprintf("%016x.wal", seg))
}

func (w *WAL) segments() ([]uint64, error) {
	names, err := w.fs.ReadDir(w.dir)
	if err != nil {
		return nil, fmt.Errorf("store: wal %s: %w", w.dir, err)
	}
	var segs []uint64
	for _, name := range names {
		hex, ok := strings.CutSuffix(name, ".wal")
		if !ok || len(hex) != 16 {
			continue
		}
		if n, err := strconv.ParseUint(hex, 16, 64); err == nil && n > 0 {
			segs = append(segs, n)
		}
	}
	return segs, nil // sorted: fixed-width hex names
}

func (w *WAL) corrupt(seg uint64, format string, args ...any) error {
	return fmt.Errorf("%w: wal %s: %s", ErrCorrupt, w.segPath(seg), fmt.Sprintf(format, args...))
}

// scan indexes the records of seg, reading it one frame at a time. In the
// newest segment a torn tail is cut and synced.
func (w *WAL) scan(seg uint64, newest bool) error {
	f, err := w.fs.OpenFile(w.segPath(seg), os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("store: wal: %w", err)
	}
	size, err := f.Size()
	if err != nil {
		f.Close()
		return fmt.Errorf("store: wal: %w", err)
	}
	var hdr [walHeaderLen]byte
	nr, _ := f.ReadAt(hdr[:], 0)
	n := int64(nr)
	magic := string(hdr[:len(walMagic)])
	sized := magic == walMagic // the writer kept the size ahead of its writes
	switch {
	case n == walHeaderLen && (sized || magic == walMagicV2):
	case n >= int64(len(walMagicV1)) && magic == walMagicV1:
		err := w.scanV1(seg, f, size)
		if err != nil {
			f.Close()
			return err
		}
		w.files[seg] = f
		return nil
	default:
		// The header is written and synced before any record: a segment
		// without one that holds only zeros was torn as it was created and
		// holds nothing.
		f.Close()
		if zero, err := w.allZero(seg, 0, size); err != nil || !zero {
			return w.corrupt(seg, "bad header")
		}
		return nil
	}
	w.files[seg] = f
	salt := hdr[len(walMagic):]
	saltSeen := false // an intact write header agreed with the header's salt
	off, pastEOF, err := readFrames(f, walHeaderLen, size, func(off int64, body []byte) (bool, error) {
		if body[0] == frameWrite && len(body) == writeBodyLen {
			if !bytes.Equal(body[1:9], salt) {
				// Where a frame starts, the writer's bytes or zeros: an
				// intact write header of no other segment can be there.
				return false, w.corrupt(seg, "write header at %d has another salt than the segment's header", off)
			}
			saltSeen = true
		}
		return true, w.index(seg, off, body)
	})
	if err != nil {
		return err
	}
	if sized && (pastEOF || size-off < walFrameLen) {
		return w.corrupt(seg, "truncated: records end at %d of %d bytes, where the writer kept room", off, size)
	}
	if zero, err := w.allZero(seg, off, size); err != nil {
		return err
	} else if zero {
		return nil // the end of the records: zeros allocated ahead
	}
	if !newest {
		return w.corrupt(seg, "damaged frame at %d of %d bytes", off, size)
	}
	if !saltSeen {
		// The header's salt was never checked against a write header: it
		// may be damaged too, and then it matches none of the intact ones
		// after off. Any salt will do as evidence of a sync past off;
		// bytes of a record can only pass for one in a segment whose
		// first write was torn, and then the cost is a refusal to open,
		// never a loss.
		salt = nil
	}
	if later, err := w.syncedPast(f, salt, off, size); err != nil {
		return err
	} else if later {
		return w.corrupt(seg, "damaged frame at %d, followed by writes synced past it", off)
	}
	// A torn tail, never acknowledged: cut it by zeroing it, which keeps
	// the size the writer synced, since a smaller one would read as a
	// truncation; a crash while zeroing leaves a shorter torn tail.
	if err := zeroTail(f, off, size); err != nil {
		return fmt.Errorf("store: wal: cut torn tail of %s: %w", w.segPath(seg), err)
	}
	return nil
}

// zeroTail writes zeros over the bytes of [from, to) of f that are not
// zero, and syncs.
func zeroTail(f File, from, to int64) error {
	buf := make([]byte, 1<<20)
	for at := from; at < to; at += int64(len(buf)) {
		b := buf[:min(int64(len(buf)), to-at)]
		n, err := f.ReadAt(b, at)
		if err != nil && err != io.EOF {
			return err
		}
		if bytes.ContainsFunc(b[:n], func(r rune) bool { return r != 0 }) {
			if _, err := f.WriteAt(walZeros[:n], at); err != nil {
				return err
			}
		}
		if n < len(b) {
			break
		}
	}
	return f.Sync()
}

// index records the frame body at off of seg.
func (w *WAL) index(seg uint64, off int64, body []byte) error {
	switch body[0] {
	case frameWrite:
		if len(body) != writeBodyLen {
			return w.corrupt(seg, "write header of %d bytes at %d", len(body), off)
		}
		return nil
	case frameRecord:
		if len(body) < 3 {
			return w.corrupt(seg, "record of %d bytes at %d", len(body), off)
		}
		nl := int(binary.BigEndian.Uint16(body[1:]))
		if len(body) < 3+nl {
			return w.corrupt(seg, "record of %d bytes at %d", len(body), off)
		}
		name := string(body[3 : 3+nl])
		w.rec[name] = append(w.rec[name], walLoc{seg: seg, off: off, n: walFrameLen + len(body)})
		return nil
	}
	return w.corrupt(seg, "frame type %d at %d", body[0], off)
}

// syncedPast reports whether an intact write header of this segment, with
// its salt, after x says the segment was synced past x: then the bad frame
// at x is damage, not a tear. A nil salt matches any.
func (w *WAL) syncedPast(f File, salt []byte, x, size int64) (bool, error) {
	const chunk = 1 << 20
	sig := []byte{0, 0, 0, writeBodyLen}
	buf := make([]byte, chunk+walFrameLen+writeBodyLen)
	for at := x + 1; at < size; at += chunk {
		n, err := f.ReadAt(buf, at)
		if err != nil && err != io.EOF {
			return false, fmt.Errorf("store: wal: %w", err)
		}
		b := buf[:n]
		for i := 0; ; i++ {
			j := bytes.Index(b[i:], sig)
			if j < 0 {
				break
			}
			i += j
			if i >= chunk {
				break // the next chunk starts there
			}
			fr := b[i:]
			if len(fr) < walFrameLen+writeBodyLen {
				break
			}
			body := fr[walFrameLen : walFrameLen+writeBodyLen]
			if body[0] == frameWrite && (salt == nil || bytes.Equal(body[1:9], salt)) &&
				crc32.Checksum(body, castagnoli) == binary.BigEndian.Uint32(fr[4:]) &&
				int64(binary.BigEndian.Uint64(body[17:])) > x {
				return true, nil
			}
		}
	}
	return false, nil
}

// allZero reports whether bytes [from, to) of seg are all zero.
func (w *WAL) allZero(seg uint64, from, to int64) (bool, error) {
	f, err := w.fs.OpenFile(w.segPath(seg), os.O_RDONLY, 0)
	if err != nil {
		return false, fmt.Errorf("store: wal: %w", err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for from < to {
		n, err := f.ReadAt(buf[:min(int64(len(buf)), to-from)], from)
		if !bytes.Equal(buf[:n], walZeros[:n]) {
			return false, nil
		}
		from += int64(n)
		if err != nil {
			break
		}
	}
	return from >= to, nil
}

// scanV1 indexes a segment of format 1, which logged commands: a stream
// may skip them if its file already holds them, and fails otherwise.
func (w *WAL) scanV1(seg uint64, f File, size int64) error {
	// Format 1 ended its records with zeros or a torn tail: either ends them.
	_, _, err := readFrames(f, int64(len(walMagicV1)), size, func(off int64, body []byte) (bool, error) {
		if len(body) < 2 || len(body) < 2+int(binary.BigEndian.Uint16(body))+8 {
			return false, w.corrupt(seg, "format 1 record at %d", off)
		}
		nl := int(binary.BigEndian.Uint16(body))
		name := string(body[2 : 2+nl])
		w.rec[name] = append(w.rec[name], walLoc{seg: seg, off: off, legacy: binary.BigEndian.Uint64(body[2+nl:])})
		return true, nil
	})
	return err
}

// readFrames reads the frames of f from start, one at a time, and calls
// visit with each intact one's offset and body, valid until the next call.
// It returns where the intact frames end: size, or the offset of the first
// frame that is short, of length zero, too long or failing its CRC, or that
// visit refused; and whether that frame's header, or the body its length
// claims, runs past size.
func readFrames(f File, start, size int64, visit func(off int64, body []byte) (bool, error)) (int64, bool, error) {
	r := bufio.NewReaderSize(io.NewSectionReader(f, start, size-start), 1<<20)
	off := start
	var body []byte
	for off < size {
		var fh [walFrameLen]byte
		if _, err := io.ReadFull(r, fh[:]); err != nil {
			return off, !bytes.Equal(fh[:size-off], make([]byte, size-off)), nil
		}
		l := binary.BigEndian.Uint32(fh[:])
		if l == 0 || l > walMaxFrame {
			return off, false, nil
		}
		if int64(l) > size-off-walFrameLen {
			return off, true, nil
		}
		if cap(body) < int(l) {
			body = make([]byte, l)
		}
		body = body[:l]
		if _, err := io.ReadFull(r, body); err != nil || crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(fh[4:]) {
			return off, false, nil
		}
		if ok, err := visit(off, body); !ok || err != nil {
			return off, false, err
		}
		off += walFrameLen + int64(l)
	}
	return off, false, nil
}

// Recover calls fn with each record of stream left by the previous run, in
// log order, reading one at a time; fn may keep the record. It stops at
// fn's first error, and may be called again: its records stay until
// FinishRecovery.
// applied is the stream's position: records of format 1 at or below it are
// skipped, and one above it is ErrFormat.
func (w *WAL) Recover(stream string, applied uint64, fn func(rec []byte) error) error {
	w.mu.Lock()
	locs := w.rec[stream] // kept until FinishRecovery: a failed Recover may be retried
	w.mu.Unlock()
	for _, l := range locs {
		if l.n == 0 {
			if l.legacy > applied {
				return fmt.Errorf("%w: %s holds commands of stream %s logged by format 1 and not applied (index %d after %d): open it with the release that wrote it first",
					ErrFormat, w.segPath(l.seg), stream, l.legacy, applied)
			}
			continue
		}
		w.mu.Lock()
		f := w.files[l.seg]
		w.mu.Unlock()
		buf := make([]byte, l.n)
		if _, err := f.ReadAt(buf, l.off); err != nil {
			return fmt.Errorf("store: wal: %s: %w", w.segPath(l.seg), err)
		}
		body := buf[walFrameLen:]
		if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(buf[4:]) {
			return w.corrupt(l.seg, "record at %d changed since Open", l.off)
		}
		nl := int(binary.BigEndian.Uint16(body[1:]))
		if err := fn(body[3+nl:]); err != nil {
			return err
		}
	}
	return nil
}

// Streams returns the streams that hold records left by the previous run,
// sorted, until FinishRecovery: every one must Recover before it, or its
// records are gone.
func (w *WAL) Streams() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Sorted(maps.Keys(w.rec))
}

func (w *WAL) closeFiles() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for s, f := range w.files {
		f.Close()
		delete(w.files, s)
	}
}

// create starts segment seg: its size, header and zeros ahead, synced with
// its directory entry before any record is written to it. The size is set
// first: a crash cannot leave a header in a file shorter than the room
// after it, which would read as a truncation.
func (w *WAL) create(seg uint64) error {
	name := w.segPath(seg)
	f, err := w.fs.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("store: wal: %w", err)
	}
	var salt [8]byte
	_, _ = rand.Read(salt[:]) // crypto/rand never fails
	err = f.Truncate(walHeaderLen + walChunk)
	if err == nil {
		_, err = f.WriteAt(append([]byte(walMagic), salt[:]...), 0)
	}
	alloc := int64(walHeaderLen)
	if err == nil {
		alloc, err = extend(f, alloc, walChunk)
	}
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = w.fs.SyncDir(w.dir)
	}
	var ext File
	if err == nil {
		ext, err = w.fs.OpenFile(name, os.O_RDWR, 0)
	}
	if err != nil {
		f.Close()
		return fmt.Errorf("store: wal: new segment %s: %w", name, err)
	}
	w.mu.Lock()
	prev := w.cur
	w.cur = seg
	w.mu.Unlock()
	w.extMu.Lock()
	oldF, oldExt := w.f, w.ext
	w.f, w.ext, w.size, w.synced, w.salt = f, ext, walHeaderLen, walHeaderLen, salt
	w.alloc.Store(alloc)
	w.end.Store(walHeaderLen)
	w.extMu.Unlock()
	if oldF != nil {
		oldF.Close()
		oldExt.Close()
		w.release(prev, 0) // delete it if already fully released
	}
	return nil
}

// extender keeps the current segment allocated ahead of the writer, so that
// the writer's flushes cover data only and it seldom extends the file itself.
// It writes only past alloc, where the writer does not write, through a
// handle of its own: a failed write-back is then reported to the writer's
// next sync too, not only to the extender's. Its own failure fails the WAL.
func (w *WAL) extender() {
	defer close(w.extDone)
	for {
		select {
		case <-w.extWake:
		case <-w.stop:
			return
		}
		w.extMu.Lock()
		a := w.alloc.Load()
		if a-w.end.Load() >= 2*walChunk {
			// A wake-up queued while it extended: far enough ahead.
			w.extMu.Unlock()
			continue
		}
		na, err := extend(w.ext, a, walChunk)
		if err == nil {
			err = w.ext.Sync()
		}
		if err == nil {
			w.alloc.Store(na)
		}
		w.extMu.Unlock()
		if err != nil {
			w.failWith(err)
		}
	}
}

func (w *WAL) failWith(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = fmt.Errorf("%w: %w", ErrWALFailed, err) // errors.Is finds the errno too
	}
}

// extend writes n zero bytes to f at offset at and returns the new end. The
// caller syncs.
func extend(f File, at, n int64) (int64, error) {
	for n > 0 {
		z := walZeros[:min(n, int64(len(walZeros)))]
		if _, err := f.WriteAt(z, at); err != nil {
			return at, err
		}
		at += int64(len(z))
		n -= int64(len(z))
	}
	return at, nil
}

// FinishRecovery deletes the segments of the previous run. Call it once every
// stream has recovered: records of streams that did not are dropped.
func (w *WAL) FinishRecovery() error {
	w.mu.Lock()
	var old []uint64 // the segments no retained record holds
	for _, s := range w.old {
		if w.refs[s] > 0 {
			continue
		}
		old = append(old, s)
		delete(w.refs, s)
		if f := w.files[s]; f != nil {
			f.Close()
			delete(w.files, s)
		}
	}
	w.old, w.rec = nil, map[string][]walLoc{}
	w.mu.Unlock()
	for _, s := range old {
		if err := w.fs.Remove(w.segPath(s)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("store: wal: %w", err)
		}
	}
	if len(old) > 0 {
		if err := w.fs.SyncDir(w.dir); err != nil {
			return fmt.Errorf("store: wal: %w", err)
		}
	}
	return nil
}

// Append queues payload, a record of stream, for the next group write. done
// is called by the writer goroutine, in append order, once the record is
// durable, with a nil err and seg the segment holding it, to release; or
// once it failed.
// payload must not change until done is called.
func (w *WAL) Append(stream string, payload []byte, done func(seg uint64, err error)) {
	w.enqueue(&walReq{stream: stream, payload: payload, done: done})
}

// enqueue queues r for the next group write, or finishes it with ErrClosed.
func (w *WAL) enqueue(r *walReq) {
	w.closeMu.RLock()
	if w.closing {
		w.closeMu.RUnlock()
		r.finish(0, ErrClosed)
		return
	}
	w.qmu.Lock()
	w.queue = append(w.queue, r)
	w.qmu.Unlock()
	select {
	case w.queued <- struct{}{}:
	default:
	}
	w.closeMu.RUnlock()
}

// release records that n records of seg are no longer needed, and deletes
// seg once none is left and it is no longer written.
func (w *WAL) release(seg uint64, n int) {
	w.mu.Lock()
	w.refs[seg] -= n
	// A segment of the previous run is deleted by FinishRecovery: streams
	// that have not recovered yet still need it.
	del := w.refs[seg] <= 0 && seg != w.cur && !slices.Contains(w.old, seg)
	if del {
		delete(w.refs, seg)
		if f := w.files[seg]; f != nil {
			f.Close()
			delete(w.files, seg)
		}
	}
	w.mu.Unlock()
	if del && seg != 0 {
		_ = w.fs.Remove(w.segPath(seg)) // a leftover is replayed and skipped by index
	}
}

// Segments returns how many segment files the WAL holds, for tests.
func (w *WAL) Segments() int {
	segs, _ := w.segments()
	return len(segs)
}

func (w *WAL) run() {
	defer close(w.done)
	batch := make([]*walReq, 0, 256)
	var buf []byte
	var tick <-chan time.Time
	if w.every > 0 {
		t := time.NewTicker(w.every)
		defer t.Stop()
		tick = t.C
	}
	var prevDur time.Duration
	var prevRecs, queued, skip int
	for {
		select {
		case <-w.queued:
			batch = w.take(batch)
		case <-tick:
			w.syncNow()
			continue
		case <-w.stop:
			// Close holds closeMu: nothing more is queued.
			if batch = w.take(batch); len(batch) > 0 {
				w.write(batch, buf)
			}
			w.syncNow()
			return
		}
		for i := range maxYields {
			n := len(batch)
			batch = w.take(batch)
			if i > 0 && len(batch) == n {
				break
			}
			runtime.Gosched()
		}
		// The senders the last write acknowledged are on their way back:
		// wait for them a little, at most half a write, so that they join
		// this write instead of making the next one. Writers whose acks
		// travel further first, such as a replica's log answered after a
		// round trip, do not come back that soon: after a wait that
		// gained nothing the next waitSkips writes do not wait.
		if target := prevRecs + queued; len(batch) < target && prevDur > 0 && skip == 0 {
			deadline := time.Now().Add(min(prevDur/2, time.Millisecond))
			before := len(batch)
			for len(batch) < target && time.Now().Before(deadline) {
				n := len(batch)
				if batch = w.take(batch); len(batch) == n {
					runtime.Gosched()
				}
			}
			if len(batch) == before {
				skip = waitSkips
			}
		} else if skip > 0 {
			skip--
		}
		if len(batch) == 0 {
			continue
		}
		t0 := time.Now()
		recs := len(batch)
		buf = w.write(batch, buf)
		w.qmu.Lock()
		queued = len(w.queue)
		w.qmu.Unlock()
		prevDur, prevRecs = time.Since(t0), recs
		clear(batch)
		batch = batch[:0]
	}
}

// waitSkips is how many writes go without waiting for returning writers
// after a wait that gained none.
const waitSkips = 16

// take moves the queued appends to batch.
func (w *WAL) take(batch []*walReq) []*walReq {
	w.qmu.Lock()
	defer w.qmu.Unlock()
	batch = append(batch, w.queue...)
	clear(w.queue)
	w.queue = w.queue[:0]
	return batch
}

// syncNow syncs what SyncInterval left unsynced.
func (w *WAL) syncNow() {
	if !w.dirty {
		return
	}
	w.mu.Lock()
	failed := w.err != nil
	w.mu.Unlock()
	if failed {
		return
	}
	if err := w.f.Sync(); err != nil {
		w.failWith(err)
		return
	}
	w.dirty, w.synced = false, w.size
	w.seal()
}

// appendWriteHeader appends a write header saying the segment is synced
// below synced.
func (w *WAL) appendWriteHeader(buf []byte, synced int64) []byte {
	var h [writeBodyLen]byte
	h[0] = frameWrite
	copy(h[1:], w.salt[:])
	binary.BigEndian.PutUint64(h[9:], w.wseq)
	binary.BigEndian.PutUint64(h[17:], uint64(synced))
	return appendFrame(buf, h[:], nil, "")
}

// seal writes, after the records, a write header saying they are synced;
// the next write overwrites it with its own. Without it, damage in the last
// synced write would look like a torn tail. It is not synced itself: a
// power loss may take it, and the last write with it.
func (w *WAL) seal() {
	if w.size >= w.segSize {
		// The segment is full: the next write starts a new one, which
		// shows this one was synced. An unsynced seal left here could be
		// torn by a power loss, in a segment that is no longer the newest.
		return
	}
	h := w.appendWriteHeader(w.sealBuf[:0], w.synced)
	w.sealBuf = h
	// writeAt keeps walTailRoom allocated after the records: the seal
	// always fits below the synced size, even after a large write.
	_, _ = w.f.WriteAt(h, w.size) // a failure shows at the next sync
}

// write appends batch's records in one write and one fdatasync, then calls
// every done in order. With SyncInterval it syncs only when a record of the
// batch is kept.
func (w *WAL) write(batch []*walReq, buf []byte) []byte {
	w.mu.Lock()
	err := w.err
	seg := w.cur
	w.mu.Unlock()
	buf = buf[:0]
	if err == nil {
		w.wseq++
		synced := w.size
		if w.every > 0 {
			synced = w.synced
		}
		buf = w.appendWriteHeader(buf, synced)
		for _, r := range batch {
			at := len(buf)
			buf = appendFrame(buf, nil, r.payload, r.stream)
			r.off, r.n = w.size+int64(at), len(buf)-at
		}
		w.mu.Lock()
		w.refs[seg] += len(batch)
		w.mu.Unlock()
		err = w.writeAt(buf)
		if err == nil && w.ackEarly {
			for _, r := range batch {
				r.finish(seg, nil)
			}
			batch = nil
		}
		// A kept record, a raft log's, is acknowledged only once synced,
		// whatever SyncInterval: raft counts an entry once StoreLogs
		// returns.
		sync := w.every == 0 || slices.ContainsFunc(batch, func(r *walReq) bool { return r.doneAt != nil })
		if err == nil && sync {
			err = w.f.Sync()
		}
		if err != nil {
			w.failWith(err)
			w.mu.Lock()
			err = w.err
			w.mu.Unlock()
		} else {
			w.size += int64(len(buf))
			if sync {
				w.synced, w.dirty = w.size, false
				w.seal()
			} else {
				w.dirty = true
			}
		}
	}
	for _, r := range batch {
		r.finish(seg, err)
	}
	if err == nil && w.size >= w.segSize {
		w.syncNow() // an older segment is always synced whole
		if w.dirty {
			return buf
		}
		if cerr := w.create(seg + 1); cerr != nil {
			w.failWith(cerr)
		}
	}
	if cap(buf) > 4<<20 {
		buf = nil
	}
	return buf
}

// writeAt writes buf at the end of the records, extending the segment first
// when the zeros ahead run short: the file's synced size always holds the
// write and walTailRoom after it, as WAL's doc explains.
func (w *WAL) writeAt(buf []byte) (err error) {
	end := w.size + int64(len(buf))
	if need := end + walTailRoom; need <= w.alloc.Load() {
		_, err = w.f.WriteAt(buf, w.size)
	} else {
		w.extMu.Lock() // the extender writes past alloc too
		if a := w.alloc.Load(); need > a {
			// Extend and sync first, so that the flush covering the
			// records flushes data only, and a crash cannot cut them.
			var na int64
			if need-a < walChunk/2 {
				na, err = extend(w.f, a, walChunk)
			} else {
				// A large write is not zero-filled first, which would
				// write it twice: only its size is set, in chunks.
				na = a + (need-a+walChunk-1)/walChunk*walChunk
				err = w.f.Truncate(na)
			}
			if err == nil {
				err = w.f.Sync()
			}
			if err == nil {
				w.alloc.Store(na)
			}
		}
		if err == nil {
			_, err = w.f.WriteAt(buf, w.size)
		}
		w.extMu.Unlock()
	}
	w.end.Store(end)
	if w.alloc.Load()-end < 2*walChunk {
		select {
		case w.extWake <- struct{}{}:
		default:
		}
	}
	return err
}

// appendFrame appends a frame: a write header if head is not nil, or a
// record of stream holding payload.
func appendFrame(buf, head, payload []byte, stream string) []byte {
	start := len(buf)
	buf = append(buf, 0, 0, 0, 0, 0, 0, 0, 0)
	if head != nil {
		buf = append(buf, head...)
	} else {
		buf = append(buf, frameRecord)
		buf = binary.BigEndian.AppendUint16(buf, uint16(len(stream)))
		buf = append(buf, stream...)
		buf = append(buf, payload...)
	}
	body := buf[start+walFrameLen:]
	binary.BigEndian.PutUint32(buf[start:], uint32(len(body)))
	binary.BigEndian.PutUint32(buf[start+4:], crc32.Checksum(body, castagnoli))
	return buf
}

// Close stops the writer after the appends already queued, syncs and closes
// the segment. Close the streams' owners first: partitions write what they
// hold into their files.
func (w *WAL) Close() error {
	var err error
	w.once.Do(func() {
		w.closeMu.Lock()
		w.closing = true
		close(w.stop)
		w.closeMu.Unlock()
		<-w.done
		<-w.extDone
		w.closeFiles()
		w.mu.Lock()
		err = w.err
		w.mu.Unlock()
		if cerr := w.f.Close(); err == nil {
			err = cerr
		}
		w.ext.Close()
	})
	return err
}
