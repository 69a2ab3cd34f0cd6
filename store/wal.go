package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// WAL is a node-level write-ahead log shared by partitions: one writer
// goroutine gathers the appends of every partition into one write and one
// fdatasync, so one flush covers the sends of all partitions. Partitions then
// materialize the logged commands into their bbolt files in deep batches,
// with bbolt's normal fsync, and release the segments holding them.
//
// Segment file: header (walMagic, 8 bytes) then records, each
//
//	length uint32 BE | crc32c(payload) uint32 BE | payload
//
// A record that is short or fails its CRC ends the segment: it is the torn
// tail of a write that was never acknowledged, and Open cuts it. Records are
// only acknowledged after the fdatasync that covers them, and a new segment
// is only started after the previous one is synced, so damage before the
// tail of the newest segment is reported as ErrCorrupt.
type WAL struct {
	dir     string
	segSize int64

	reqs chan *walReq
	stop chan struct{}
	done chan struct{}
	once sync.Once

	closeMu sync.RWMutex
	closing bool

	mu   sync.Mutex             // guards refs, cur, err, old
	refs map[uint64]int         // segment -> records not yet materialized
	cur  uint64                 // segment being written
	err  error                  // sticky: after a failed write or sync nothing is appended
	old  []uint64               // segments found at Open, deleted by FinishRecovery
	rec  map[string][]walRecord // recovered records by partition name, until FinishRecovery

	// The current segment. The writer goroutine owns size; extMu guards
	// swapping f and extending it; alloc is read without it.
	extMu   sync.Mutex
	f       *os.File
	size    int64        // bytes of header and records in f
	alloc   atomic.Int64 // bytes of f written (zeros past size)
	extWake chan struct{}
	extDone chan struct{}
}

// walRecord is one logged command of a partition.
type walRecord struct {
	Index   uint64
	Payload []byte // encoded command (encodeWALCommand), partition name removed
}

type walReq struct {
	buf  []byte
	n    int // records in buf
	done func(seg uint64, err error)
}

const (
	walMagic       = "ZZMQWAL\x01"
	walHeaderLen   = len(walMagic)
	walFrameLen    = 8
	walSegmentSize = 64 << 20
	walMaxRecord   = 1 << 30
	walQueue       = 1024
	// walChunk is how far a segment is extended with zeros at a time. An
	// fdatasync after an append that grows the file must also commit the
	// file system's journal (the size and the new blocks); writing into
	// blocks already written and synced costs only the data flush.
	walChunk = 4 << 20
)

var walZeros = make([]byte, 1<<20)

// ErrWALFailed is returned for appends after the WAL could not write or sync.
var ErrWALFailed = errors.New("store: write-ahead log failed")

// OpenWAL opens (creating if needed) the write-ahead log in dir, reads every
// record left by the previous run (cutting a torn tail) and starts a new
// segment. Partitions opened with it replay their recovered records; after
// all partitions are open, FinishRecovery deletes the old segments.
func OpenWAL(dir string) (*WAL, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("store: wal %s: %w", dir, err)
	}
	w := &WAL{
		dir:     dir,
		segSize: walSegmentSize,
		reqs:    make(chan *walReq, walQueue),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		refs:    map[uint64]int{},
		extWake: make(chan struct{}, 1),
		extDone: make(chan struct{}),
		rec:     map[string][]walRecord{},
	}
	segs, err := w.segments()
	if err != nil {
		return nil, err
	}
	for i, s := range segs {
		if err := w.readSegment(s, i == len(segs)-1); err != nil {
			return nil, err
		}
	}
	w.old = segs
	next := uint64(1)
	if len(segs) > 0 {
		next = segs[len(segs)-1] + 1
	}
	if err := w.create(next); err != nil {
		return nil, err
	}
	go w.run()
	go w.extender()
	return w, nil
}

func (w *WAL) segPath(seg uint64) string {
	return filepath.Join(w.dir, fmt.Sprintf("%016x.wal", seg))
}

func (w *WAL) segments() ([]uint64, error) {
	ents, err := os.ReadDir(w.dir)
	if err != nil {
		return nil, fmt.Errorf("store: wal %s: %w", w.dir, err)
	}
	var segs []uint64
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".wal")
		if !ok || len(name) != 16 {
			continue
		}
		n, err := strconv.ParseUint(name, 16, 64)
		if err != nil {
			continue
		}
		segs = append(segs, n)
	}
	slices.Sort(segs)
	return segs, nil
}

// readSegment collects the records of seg. In the newest segment a torn tail
// is cut (truncated and synced); elsewhere it is corruption.
func (w *WAL) readSegment(seg uint64, last bool) error {
	path := w.segPath(seg)
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("store: wal: %w", err)
	}
	good := 0
	if len(b) >= walHeaderLen && string(b[:walHeaderLen]) == walMagic {
		// Records are followed by zeros (allocated ahead) or, in the
		// newest segment, by the torn tail of an unacknowledged write.
		good = walHeaderLen
		for {
			payload, n := walFrame(b[good:])
			if n == 0 {
				break
			}
			name, idx, rest, err := splitWALRecord(payload)
			if err != nil {
				return fmt.Errorf("%w: wal %s at %d: %v", ErrCorrupt, path, good, err)
			}
			w.rec[name] = append(w.rec[name], walRecord{Index: idx, Payload: rest})
			good += n
		}
	} else if len(b) >= walHeaderLen || !last {
		// A header is written and synced before any record: a bad one is
		// either a segment torn at creation (newest, short) or corruption.
		return fmt.Errorf("%w: wal %s: bad header", ErrCorrupt, path)
	}
	if good == len(b) || allZero(b[good:]) && !last {
		return nil // trailing zeros: space allocated ahead of the records
	}
	if !last {
		return fmt.Errorf("%w: wal %s: damaged record at %d of %d bytes", ErrCorrupt, path, good, len(b))
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("store: wal: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(int64(good)); err != nil {
		return fmt.Errorf("store: wal: cut torn tail: %w", err)
	}
	return f.Sync()
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// walFrame returns the payload of the record at the start of b and the
// record's length, or n == 0 when b holds no complete, intact record.
func walFrame(b []byte) (payload []byte, n int) {
	if len(b) < walFrameLen {
		return nil, 0
	}
	l := binary.BigEndian.Uint32(b)
	if l == 0 || l > walMaxRecord || int64(len(b)-walFrameLen) < int64(l) {
		return nil, 0
	}
	payload = b[walFrameLen : walFrameLen+int(l)]
	if crc32.Checksum(payload, castagnoli) != binary.BigEndian.Uint32(b[4:]) {
		return nil, 0
	}
	return payload, walFrameLen + int(l)
}

// appendWALFrame appends a framed record holding payload to buf.
func appendWALFrame(buf, payload []byte) []byte {
	var h [walFrameLen]byte
	binary.BigEndian.PutUint32(h[:], uint32(len(payload)))
	binary.BigEndian.PutUint32(h[4:], crc32.Checksum(payload, castagnoli))
	buf = append(buf, h[:]...)
	return append(buf, payload...)
}

// A record's payload: name length (uint16 BE), name, index (uint64 BE), then
// the encoded command.
func splitWALRecord(p []byte) (name string, idx uint64, rest []byte, err error) {
	if len(p) < 2 {
		return "", 0, nil, errors.New("short record")
	}
	nl := int(binary.BigEndian.Uint16(p))
	if len(p) < 2+nl+8 {
		return "", 0, nil, errors.New("short record")
	}
	name = string(p[2 : 2+nl])
	idx = binary.BigEndian.Uint64(p[2+nl:])
	return name, idx, p[2+nl+8:], nil
}

func (w *WAL) create(seg uint64) error {
	f, err := os.OpenFile(w.segPath(seg), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("store: wal: %w", err)
	}
	_, err = f.Write([]byte(walMagic))
	alloc := int64(walHeaderLen)
	if err == nil {
		alloc, err = extend(f, alloc, walChunk)
	}
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = syncDir(w.dir)
	}
	if err != nil {
		f.Close()
		return fmt.Errorf("store: wal: new segment: %w", err)
	}
	w.mu.Lock()
	prev := w.cur
	w.cur = seg
	w.mu.Unlock()
	w.extMu.Lock()
	old := w.f
	w.f, w.size = f, int64(walHeaderLen)
	w.alloc.Store(alloc)
	w.extMu.Unlock()
	if old != nil {
		old.Close()
		w.release(prev, 0) // delete it if already fully materialized
	}
	return nil
}

// extender keeps the current segment allocated ahead of the writer, so that
// the writer's flushes cover data only and it seldom extends the file itself.
// It only writes past alloc, where the writer does not write.
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
		na, err := extend(w.f, a, walChunk)
		if err == nil {
			err = fdatasync(w.f)
		}
		if err == nil {
			w.alloc.Store(na)
		}
		w.extMu.Unlock()
	}
}

// extend writes n zero bytes to f at offset at and returns the new end. The
// caller syncs.
func extend(f *os.File, at, n int64) (int64, error) {
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

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// recovered hands over (once) the records of partition name left by the
// previous run, in log order.
func (w *WAL) recovered(name string) []walRecord {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.rec[name]
	delete(w.rec, name)
	return r
}

// FinishRecovery deletes the segments of the previous run. Call it once every
// partition is open: opening replays (and syncs) their records. Records of
// partitions that were not opened are dropped with the segments.
func (w *WAL) FinishRecovery() error {
	w.mu.Lock()
	old := w.old
	w.old, w.rec = nil, map[string][]walRecord{}
	w.mu.Unlock()
	for _, s := range old {
		if err := os.Remove(w.segPath(s)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("store: wal: %w", err)
		}
	}
	if len(old) > 0 {
		return syncDir(w.dir)
	}
	return nil
}

// append queues buf (n framed records) for the next group write. done is
// called by the writer goroutine, in append order, once the records are
// synced (err nil, seg the segment holding them) or failed.
func (w *WAL) append(buf []byte, n int, done func(seg uint64, err error)) {
	w.closeMu.RLock()
	if w.closing {
		w.closeMu.RUnlock()
		done(0, ErrClosed)
		return
	}
	w.reqs <- &walReq{buf: buf, n: n, done: done}
	w.closeMu.RUnlock()
}

// release records that n records of seg are materialized, and deletes seg
// once none is left and it is no longer written.
func (w *WAL) release(seg uint64, n int) {
	w.mu.Lock()
	w.refs[seg] -= n
	del := w.refs[seg] <= 0 && seg != w.cur
	if del {
		delete(w.refs, seg)
	}
	w.mu.Unlock()
	if del && seg != 0 {
		_ = os.Remove(w.segPath(seg)) // a leftover is replayed and skipped by index
	}
}

// Segments returns how many segment files the WAL holds (for tests).
func (w *WAL) Segments() int {
	segs, _ := w.segments()
	return len(segs)
}

func (w *WAL) run() {
	defer close(w.done)
	batch := make([]*walReq, 0, 256)
	var buf []byte
	var prevDur time.Duration
	var prevRecs, queued int
	for {
		select {
		case r := <-w.reqs:
			batch = append(batch, r)
		case <-w.stop:
			for {
				select {
				case r := <-w.reqs:
					batch = append(batch, r)
					continue
				default:
				}
				break
			}
			if len(batch) > 0 {
				w.write(batch, buf)
			}
			return
		}
		recs := batch[0].n
		for i := range maxYields {
			n := len(batch)
		drain:
			for {
				select {
				case r := <-w.reqs:
					batch = append(batch, r)
					recs += r.n
				default:
					break drain
				}
			}
			if i > 0 && len(batch) == n {
				break
			}
			runtime.Gosched()
		}
		// The senders the last write acknowledged are on their way back:
		// wait for them a little (at most half a write), so that they join
		// this write instead of making the next one.
		if target := prevRecs + queued; recs < target && prevDur > 0 {
			deadline := time.Now().Add(min(prevDur/2, time.Millisecond))
			for recs < target && time.Now().Before(deadline) {
				select {
				case r := <-w.reqs:
					batch = append(batch, r)
					recs += r.n
				default:
					runtime.Gosched()
				}
			}
		}
		t0 := time.Now()
		buf = w.write(batch, buf)
		// Requests (at least one record each) that arrived during the write.
		prevDur, prevRecs, queued = time.Since(t0), recs, len(w.reqs)
		clear(batch)
		batch = batch[:0]
	}
}

// write appends batch's records in one write and one fdatasync, then calls
// every done in order.
func (w *WAL) write(batch []*walReq, buf []byte) []byte {
	w.mu.Lock()
	err := w.err
	seg := w.cur
	w.mu.Unlock()
	buf = buf[:0]
	n := 0
	for _, r := range batch {
		buf = append(buf, r.buf...)
		n += r.n
	}
	if err == nil {
		w.mu.Lock()
		w.refs[seg] += n
		w.mu.Unlock()
		end := w.size + int64(len(buf))
		if end <= w.alloc.Load() {
			_, err = w.f.WriteAt(buf, w.size)
		} else {
			w.extMu.Lock() // the extender writes past alloc too
			if a := w.alloc.Load(); end-a < walChunk/2 {
				// Extend and sync first, so that the flush covering
				// the records flushes data only.
				var na int64
				if na, err = extend(w.f, a, walChunk); err == nil {
					err = fdatasync(w.f)
				}
				if err == nil {
					w.alloc.Store(na)
				}
			}
			if err == nil {
				// A large write is not zero-filled first: that would
				// write it twice; its flush also commits the new size.
				_, err = w.f.WriteAt(buf, w.size)
			}
			if err == nil && end > w.alloc.Load() {
				w.alloc.Store(end) // synced below, before anyone relies on it
			}
			w.extMu.Unlock()
		}
		if w.alloc.Load()-end < 2*walChunk {
			select {
			case w.extWake <- struct{}{}:
			default:
			}
		}
		if err == nil {
			err = fdatasync(w.f)
		}
		if err != nil {
			err = fmt.Errorf("%w: %v", ErrWALFailed, err)
			w.mu.Lock()
			w.err = err
			w.mu.Unlock()
		}
	}
	w.size += int64(len(buf))
	for _, r := range batch {
		r.done(seg, err)
	}
	if err == nil && w.size >= w.segSize {
		if cerr := w.create(seg + 1); cerr != nil {
			w.mu.Lock()
			w.err = fmt.Errorf("%w: %v", ErrWALFailed, cerr)
			w.mu.Unlock()
		}
	}
	if cap(buf) > maxArena {
		buf = nil
	}
	return buf
}

// Close stops the writer after the appends already queued and closes the
// segment. Close the partitions first: they materialize what they hold.
func (w *WAL) Close() error {
	var err error
	w.once.Do(func() {
		w.closeMu.Lock()
		w.closing = true
		close(w.stop)
		w.closeMu.Unlock()
		<-w.done
		<-w.extDone
		if w.f != nil {
			err = w.f.Close()
		}
	})
	return err
}

// encodeWALHeader starts a record of command c of partition name at index
// idx: name length (2), name, index (8), op (1), now (8), message count (4);
// the messages follow, each as encodeMessage writes it.
func encodeWALHeader(e *encoder, name string, idx uint64, c *Command) {
	var h [2]byte
	binary.BigEndian.PutUint16(h[:], uint16(len(name)))
	e.buf.Write(h[:])
	e.buf.WriteString(name)
	var b [21]byte
	binary.BigEndian.PutUint64(b[:], idx)
	b[8] = byte(c.Op)
	binary.BigEndian.PutUint64(b[9:], uint64(c.Now))
	binary.BigEndian.PutUint32(b[17:], uint32(len(c.Msgs)))
	e.buf.Write(b[:])
}

// decodeWALCommand decodes the command part of a record (after name and
// index) into a fresh Command.
func decodeWALCommand(idx uint64, p []byte) (*Command, error) {
	if len(p) < 13 {
		return nil, fmt.Errorf("%w: wal command of %d bytes", ErrCorrupt, len(p))
	}
	c := &Command{Op: Op(p[0]), Index: idx, Now: int64(binary.BigEndian.Uint64(p[1:]))}
	n := binary.BigEndian.Uint32(p[9:])
	dec := msgpack.NewDecoder(bytes.NewReader(p[13:]))
	if int(n) > len(p) {
		return nil, fmt.Errorf("%w: wal command with %d messages", ErrCorrupt, n)
	}
	c.Msgs = make([]Message, n)
	for i := range c.Msgs {
		if err := decodeMessage(dec, &c.Msgs[i]); err != nil {
			return nil, fmt.Errorf("%w: wal command: %v", ErrCorrupt, err)
		}
	}
	if walGroupOp(c.Op) {
		var err error
		if c.Group, err = dec.DecodeString(); err == nil {
			c.Offset, err = dec.DecodeUint64()
		}
		if err != nil {
			return nil, fmt.Errorf("%w: wal command: %v", ErrCorrupt, err)
		}
	}
	if c.Op == OpCommitTx {
		var err error
		if c.TxID, err = dec.DecodeString(); err != nil {
			return nil, fmt.Errorf("%w: wal command: %v", ErrCorrupt, err)
		}
	}
	return c, nil
}

// walGroupOp reports whether op's record carries Group and Offset (after
// its messages, of which it has none).
func walGroupOp(op Op) bool { return op == OpCommitOffset || op == OpDeleteGroup }

// encodeWALTrailer ends c's record: Group and Offset for a group command,
// TxID for a transaction commit.
func encodeWALTrailer(e *encoder, c *Command) {
	if walGroupOp(c.Op) {
		_ = e.enc.EncodeString(c.Group)
		_ = e.enc.EncodeUint64(c.Offset)
	}
	if c.Op == OpCommitTx {
		_ = e.enc.EncodeString(c.TxID)
	}
}
