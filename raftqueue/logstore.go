package raftqueue

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/store"
)

// WALLog is a raft.LogStore that keeps a group's log as a stream of the
// node's write-ahead log, a store.WAL: every group of the node, and its
// Single partitions, share one group write and one fdatasync. StoreLogs
// returns once the write holding its entries is synced, as raft requires:
// the leader counts itself, and a follower answers, only after it.
//
// Records of the stream, each one WAL record:
//
//	'L' entries: uvarint count, then per entry uvarint index, uvarint
//	    term, type byte, uvarint len + data, uvarint len + extensions,
//	    varint appended-at (unix ns). Its first index drops every entry at
//	    or after it from the records before: raft appends after its last
//	    entry, or after deleting a conflicting tail.
//	'P' prefix: uvarint first, byte all. Drops every entry below first
//	    from the records before; with all set, every entry: raft removes
//	    the whole log after installing a snapshot.
//	'T' tail: uvarint from. Drops every entry at or after from: a
//	    follower's conflicting tail.
//
// Varints are in their shortest form, so that a record has one encoding.
// An entry's index is from 1 to 2^64-2: raft starts at 1, and an entry at
// the last index would leave none after the log.
//
// A record is kept in the WAL while one of its entries is in the
// log; the newest 'P' always; the newest 'T' until the next 'L', which
// starts where it cut, or the next 'P' with all, which drops everything. A
// compaction between a tail's deletion and its replacement keeps the
// entries below the tail, so the tail must stay cut. Dropping a record none
// of whose entries is live changes nothing a restart reads: an entry it
// wrote was dropped by a later 'P', or truncated by a later kept 'L' or
// 'T', or is below the kept 'P'.
//
// Lock order: wmu before mu.
type WALLog struct {
	w      *store.WAL
	stream string

	wmu sync.Mutex // serializes writes: records reach the WAL in the order applied

	mu     sync.RWMutex
	first  uint64 // index of ents[0]
	ents   []logLoc
	live   map[store.WALRecord]int // record -> entries of it in ents, and pins
	prefix store.WALRecord         // the newest 'P' record, pinned
	tail   store.WALRecord         // the newest 'T' record, pinned until the next 'L' or 'P'
	err    error                   // sticky: a write failed

	replayScanned int // what the replay at Open looked at (replayer.scanned), for tests

	cacheMu  sync.Mutex // one record read back, for runs of GetLog
	cacheRec store.WALRecord
	cacheBuf []byte
	cacheOK  bool
}

// logLoc is where an entry lies: its record and its bytes in the payload.
type logLoc struct {
	rec      store.WALRecord
	off, len uint32
	index    uint64
}

const (
	recEntries = 'L'
	recPrefix  = 'P'
	recTail    = 'T'
)

// ErrLogCorrupt is wrapped by the errors of a log whose records do not
// decode.
var ErrLogCorrupt = fmt.Errorf("raftqueue: log: %w", store.ErrCorrupt)

// OpenWALLog opens the group log kept as stream in w: it retains the
// stream's records left by the previous run and indexes them. Call it
// before w.FinishRecovery.
func OpenWALLog(w *store.WAL, stream string) (*WALLog, error) {
	l := &WALLog{w: w, stream: stream, live: map[store.WALRecord]int{}}
	rp := &replayer{l: l, ents: map[uint64]logLoc{}}
	recs, err := w.Retain(stream)
	if err != nil {
		return nil, err
	}
	var buf []byte
	for _, r := range recs {
		payload, err := w.ReadRecord(r, buf)
		if err != nil {
			return nil, err
		}
		buf = payload[:0]
		l.live[r] = 0
		if err := rp.replay(r, payload); err != nil {
			return nil, fmt.Errorf("%w: stream %s: %w", ErrLogCorrupt, stream, err)
		}
	}
	if err := rp.finish(); err != nil {
		return nil, fmt.Errorf("%w: stream %s: %w", ErrLogCorrupt, stream, err)
	}
	l.replayScanned = rp.scanned
	for r, n := range l.live {
		if n == 0 {
			delete(l.live, r)
			w.Release(r)
		}
	}
	return l, nil
}

// replayer rebuilds the log from its records at Open. An entry is kept
// by index, not in a run: a record dropped as dead may leave a gap that a
// later record closes or cuts.
type replayer struct {
	l       *WALLog
	ents    map[uint64]logLoc
	lo, hi  uint64 // bounds of the indexes in ents, loose once some are dropped
	scanned int    // indexes and entries drop looked at, for tests
}

// replay applies one record.
func (rp *replayer) replay(r store.WALRecord, p []byte) error {
	l := rp.l
	if len(p) == 0 {
		return errors.New("empty record")
	}
	switch p[0] {
	case recEntries:
		locs, err := scanEntries(r, p)
		if err != nil {
			return err
		}
		rp.drop(locs[0].index, math.MaxUint64)
		for _, loc := range locs {
			rp.ents[loc.index] = loc
			l.live[loc.rec]++
		}
		if len(rp.ents) == len(locs) {
			rp.lo = locs[0].index
		}
		rp.lo, rp.hi = min(rp.lo, locs[0].index), locs[len(locs)-1].index
		l.unpin(&l.tail)
		return nil
	case recPrefix:
		first, all, err := decodePrefix(p)
		if err != nil {
			return err
		}
		if all {
			rp.drop(0, math.MaxUint64)
		} else if first > 0 {
			rp.drop(0, first-1)
		}
		if all {
			l.unpin(&l.tail)
		}
		l.pin(&l.prefix, r)
		return nil
	case recTail:
		from, err := decodeTail(p)
		if err != nil {
			return err
		}
		rp.drop(from, math.MaxUint64)
		l.pin(&l.tail, r)
		return nil
	}
	return fmt.Errorf("record type %q", p[0])
}

// drop removes the entries of indexes a to b. It looks only at the
// indexes of that range within lo..hi, or, when those are many more than
// the entries, at the entries: each record of a stream drops what it
// replaces, usually nothing past the log's end, so replaying a stream
// costs in proportion to its entries (once it looked at every index of
// the log for each record, and a node with a long pair log took minutes
// to open).
func (rp *replayer) drop(a, b uint64) {
	lo, hi := max(a, rp.lo), min(b, rp.hi)
	if len(rp.ents) == 0 || lo > hi {
		return
	}
	defer func() { // what is left lies outside a..b: narrow the bounds
		if a <= rp.lo && b < math.MaxUint64 {
			rp.lo = max(rp.lo, b+1)
		}
		if b >= rp.hi && a > 0 {
			rp.hi = min(rp.hi, a-1)
		}
	}()
	if hi-lo < uint64(2*len(rp.ents)) {
		for i := lo; ; i++ {
			rp.scanned++
			if loc, ok := rp.ents[i]; ok {
				rp.l.unref(loc.rec)
				delete(rp.ents, i)
			}
			if i == hi {
				return
			}
		}
	}
	for i, loc := range rp.ents {
		rp.scanned++
		if i >= a && i <= b {
			rp.l.unref(loc.rec)
			delete(rp.ents, i)
		}
	}
}

// finish puts the entries left, which must be a run, into the log.
func (rp *replayer) finish() error {
	l := rp.l
	if len(rp.ents) == 0 {
		return nil
	}
	first := uint64(math.MaxUint64)
	for i := range rp.ents {
		first = min(first, i)
	}
	l.first = first
	l.ents = make([]logLoc, 0, len(rp.ents))
	for i := first; i < first+uint64(len(rp.ents)); i++ {
		loc, ok := rp.ents[i]
		if !ok {
			return fmt.Errorf("entry %d missing from a log of %d entries from %d", i, len(rp.ents), first)
		}
		l.ents = append(l.ents, loc)
	}
	return nil
}

// scanEntries returns where each entry of the 'L' record p lies.
func scanEntries(r store.WALRecord, p []byte) ([]logLoc, error) {
	b := p[1:]
	n, k := uvarint(b)
	if k <= 0 || n == 0 || n > uint64(len(b)) {
		return nil, errors.New("bad entry count")
	}
	b = b[k:]
	locs := make([]logLoc, 0, n)
	var prev uint64
	for i := uint64(0); i < n; i++ {
		start := len(p) - len(b)
		var e raft.Log
		rest, err := decodeLog(b, &e)
		if err != nil {
			return nil, err
		}
		if e.Index == 0 || e.Index == math.MaxUint64 {
			return nil, fmt.Errorf("entry index %d", e.Index)
		}
		if i > 0 && e.Index != prev+1 {
			return nil, fmt.Errorf("entry %d after %d in one record", e.Index, prev)
		}
		prev = e.Index
		locs = append(locs, logLoc{rec: r, off: uint32(start), len: uint32(len(b) - len(rest)), index: e.Index})
		b = rest
	}
	if len(b) != 0 {
		return nil, errors.New("bytes after the entries")
	}
	return locs, nil
}

// appendLocs puts consecutive entries, the first one's index decoded from
// its record, into the index: an entry at or before the last truncates.
// The caller holds mu, or is Open.
func (l *WALLog) appendLocs(locs []logLoc) {
	idx := locs[0].index
	last := l.first + uint64(len(l.ents)) - 1
	switch {
	case len(l.ents) == 0 || idx > last+1 || idx < l.first:
		// An empty log starts anywhere. A gap cannot come from raft,
		// which appends after its last entry and removes the whole log
		// before starting after a snapshot; nor can an entry before
		// the first, as compaction only drops committed entries. Both
		// restart the log, here and at Open alike.
		l.dropFrom(0)
		l.first = idx
	case idx <= last:
		l.dropFrom(int(idx - l.first))
	}
	for _, loc := range locs {
		l.ents = append(l.ents, loc)
		l.live[loc.rec]++
	}
}

// dropFrom removes ents[i:], releasing records left with no entry.
func (l *WALLog) dropFrom(i int) {
	for _, loc := range l.ents[i:] {
		l.unref(loc.rec)
	}
	clear(l.ents[i:])
	l.ents = l.ents[:i]
}

// dropPrefix removes the entries below first, or all of them with all.
func (l *WALLog) dropPrefix(first uint64, all bool) {
	n := 0
	if all {
		n = len(l.ents)
	} else if first > l.first {
		n = int(min(first-l.first, uint64(len(l.ents))))
	}
	for _, loc := range l.ents[:n] {
		l.unref(loc.rec)
	}
	l.ents = append(l.ents[:0], l.ents[n:]...)
	l.first += uint64(n)
	if len(l.ents) == 0 {
		l.first = first
	}
}

// unref counts one entry or pin of r gone, releasing r when none is left.
func (l *WALLog) unref(r store.WALRecord) {
	l.live[r]--
	if l.live[r] <= 0 {
		delete(l.live, r)
		l.w.Release(r)
	}
}

// pin makes r the record *at keeps, unpinning the one it kept.
func (l *WALLog) pin(at *store.WALRecord, r store.WALRecord) {
	l.live[r]++
	l.unpin(at)
	*at = r
}

// unpin lets go of the record *at keeps.
func (l *WALLog) unpin(at *store.WALRecord) {
	if at.N != 0 {
		l.unref(*at)
		*at = store.WALRecord{}
	}
}

// FirstIndex implements raft.LogStore: 0 for an empty log.
func (l *WALLog) FirstIndex() (uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if len(l.ents) == 0 {
		return 0, nil
	}
	return l.first, nil
}

// LastIndex implements raft.LogStore: 0 for an empty log.
func (l *WALLog) LastIndex() (uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if len(l.ents) == 0 {
		return 0, nil
	}
	return l.first + uint64(len(l.ents)) - 1, nil
}

// GetLog implements raft.LogStore.
func (l *WALLog) GetLog(index uint64, out *raft.Log) error {
	l.mu.RLock()
	if index < l.first || index-l.first >= uint64(len(l.ents)) {
		l.mu.RUnlock()
		return raft.ErrLogNotFound
	}
	loc := l.ents[index-l.first]
	l.mu.RUnlock()
	// The record stays while the entry is in the log. An entry dropped
	// meanwhile reads as it was, or fails as not found, since its segment
	// may be deleted, and the WAL's handle closed, under the read.
	l.cacheMu.Lock()
	defer l.cacheMu.Unlock()
	if !l.cacheOK || l.cacheRec != loc.rec {
		p, err := l.w.ReadRecord(loc.rec, l.cacheBuf)
		if err != nil {
			l.cacheOK = false
			if !l.holds(index, loc) {
				return raft.ErrLogNotFound
			}
			return fmt.Errorf("raftqueue: log %s: entry %d: %w", l.stream, index, err)
		}
		l.cacheRec, l.cacheBuf, l.cacheOK = loc.rec, p, true
	}
	end := int(loc.off) + int(loc.len)
	if end > len(l.cacheBuf) {
		return fmt.Errorf("%w: entry %d past its record", ErrLogCorrupt, index)
	}
	if _, err := decodeLog(l.cacheBuf[loc.off:end], out); err != nil {
		return fmt.Errorf("%w: entry %d: %w", ErrLogCorrupt, index, err)
	}
	if out.Index != index {
		return fmt.Errorf("%w: entry %d holds %d", ErrLogCorrupt, index, out.Index)
	}
	out.Data = append([]byte(nil), out.Data...) // the cache is reused
	if out.Extensions != nil {
		out.Extensions = append([]byte(nil), out.Extensions...)
	}
	return nil
}

// holds reports whether entry index is still in the log at loc.
func (l *WALLog) holds(index uint64, loc logLoc) bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return index >= l.first && index-l.first < uint64(len(l.ents)) && l.ents[index-l.first] == loc
}

// StoreLog implements raft.LogStore.
func (l *WALLog) StoreLog(e *raft.Log) error { return l.StoreLogs([]*raft.Log{e}) }

// StoreLogs implements raft.LogStore: it returns once the entries are in a
// synced write of the WAL.
func (l *WALLog) StoreLogs(logs []*raft.Log) error {
	if len(logs) == 0 {
		return nil
	}
	for i, e := range logs {
		if e.Index == 0 || e.Index == math.MaxUint64 {
			return fmt.Errorf("raftqueue: log %s: entry index %d", l.stream, e.Index)
		}
		if i > 0 && e.Index != logs[i-1].Index+1 {
			return fmt.Errorf("raftqueue: log %s: entries %d and %d not consecutive", l.stream, logs[i-1].Index, e.Index)
		}
	}
	p := []byte{recEntries}
	p = binary.AppendUvarint(p, uint64(len(logs)))
	offs := make([]uint32, len(logs)+1)
	for i, e := range logs {
		offs[i] = uint32(len(p))
		p = appendLog(p, e)
	}
	offs[len(logs)] = uint32(len(p))

	l.wmu.Lock()
	defer l.wmu.Unlock()
	r, err := l.write(p)
	if err != nil {
		return err
	}
	locs := make([]logLoc, len(logs))
	for i := range logs {
		locs[i] = logLoc{rec: r, off: offs[i], len: offs[i+1] - offs[i], index: logs[i].Index}
	}
	l.mu.Lock()
	l.live[r] = 0
	l.appendLocs(locs)
	l.unpin(&l.tail)
	l.mu.Unlock()
	return nil
}

// write appends payload as a record of the stream and waits until it is
// synced.
func (l *WALLog) write(payload []byte) (store.WALRecord, error) {
	l.mu.RLock()
	err := l.err
	l.mu.RUnlock()
	if err != nil {
		return store.WALRecord{}, err
	}
	type done struct {
		r   store.WALRecord
		err error
	}
	ch := make(chan done, 1)
	l.w.AppendRecord(l.stream, payload, func(r store.WALRecord, err error) { ch <- done{r, err} })
	d := <-ch
	if d.err != nil {
		d.err = fmt.Errorf("raftqueue: log %s: %w", l.stream, d.err)
		l.mu.Lock()
		if l.err == nil {
			l.err = d.err
		}
		l.mu.Unlock()
	}
	return d.r, d.err
}

// DeleteRange implements raft.LogStore. raft deletes a prefix after a
// snapshot to compact the log, the whole log after installing one, and a
// conflicting tail on a follower.
func (l *WALLog) DeleteRange(lo, hi uint64) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.mu.Lock()
	n := len(l.ents)
	first, last := l.first, l.first+uint64(n)-1
	if n == 0 || hi < first || lo > last {
		l.mu.Unlock()
		return nil
	}
	if lo > first {
		if hi < last {
			l.mu.Unlock()
			return fmt.Errorf("raftqueue: log %s: delete of %d-%d inside %d-%d", l.stream, lo, hi, first, last)
		}
		l.mu.Unlock()
		r, err := l.write(appendTail(nil, lo))
		if err != nil {
			return err
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		l.dropFrom(int(lo - first))
		l.pin(&l.tail, r)
		return nil
	}
	l.mu.Unlock()
	all := hi >= last
	r, err := l.write(appendPrefix(nil, hi+1, all))
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dropPrefix(hi+1, all)
	if all {
		l.unpin(&l.tail)
	}
	l.pin(&l.prefix, r)
	return nil
}

// IsMonotonic implements raft.MonotonicLogStore: raft removes the whole log
// after installing a snapshot rather than leave a gap.
func (l *WALLog) IsMonotonic() bool { return true }

// Close releases nothing: the records stay in the WAL for the next Open.
func (l *WALLog) Close() error { return nil }

// appendLog appends e's encoding.
func appendLog(b []byte, e *raft.Log) []byte {
	b = binary.AppendUvarint(b, e.Index)
	b = binary.AppendUvarint(b, e.Term)
	b = append(b, byte(e.Type))
	b = binary.AppendUvarint(b, uint64(len(e.Data)))
	b = append(b, e.Data...)
	b = binary.AppendUvarint(b, uint64(len(e.Extensions)))
	b = append(b, e.Extensions...)
	return binary.AppendVarint(b, e.AppendedAt.UnixNano())
}

// decodeLog decodes one entry from b into e, whose Data and Extensions
// alias b, and returns the rest.
func decodeLog(b []byte, e *raft.Log) ([]byte, error) {
	var k int
	if e.Index, k = uvarint(b); k <= 0 {
		return nil, errors.New("bad index")
	}
	b = b[k:]
	if e.Term, k = uvarint(b); k <= 0 {
		return nil, errors.New("bad term")
	}
	b = b[k:]
	if len(b) == 0 {
		return nil, errors.New("no type")
	}
	e.Type = raft.LogType(b[0])
	b = b[1:]
	var err error
	if e.Data, b, err = decodeBytes(b); err != nil {
		return nil, err
	}
	if e.Extensions, b, err = decodeBytes(b); err != nil {
		return nil, err
	}
	at, k := varint(b)
	if k <= 0 {
		return nil, errors.New("bad time")
	}
	e.AppendedAt = time.Unix(0, at)
	return b[k:], nil
}

func decodeBytes(b []byte) ([]byte, []byte, error) {
	n, k := uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return nil, nil, errors.New("bad length")
	}
	b = b[k:]
	if n == 0 {
		return nil, b, nil
	}
	return b[:n], b[n:], nil
}

// appendPrefix appends a 'P' record.
func appendPrefix(b []byte, first uint64, all bool) []byte {
	b = binary.AppendUvarint(append(b, recPrefix), first)
	if all {
		return append(b, 1)
	}
	return append(b, 0)
}

// decodePrefix decodes a 'P' record.
func decodePrefix(p []byte) (first uint64, all bool, err error) {
	first, k := uvarint(p[1:])
	if k <= 0 || len(p) != 1+k+1 || p[1+k] > 1 {
		return 0, false, errors.New("bad prefix record")
	}
	return first, p[1+k] == 1, nil
}

// appendTail appends a 'T' record.
func appendTail(b []byte, from uint64) []byte {
	return binary.AppendUvarint(append(b, recTail), from)
}

// decodeTail decodes a 'T' record.
func decodeTail(p []byte) (from uint64, err error) {
	from, k := uvarint(p[1:])
	if k <= 0 || len(p) != 1+k {
		return 0, errors.New("bad tail record")
	}
	return from, nil
}

// uvarint is binary.Uvarint of the shortest encoding only, so that a
// record has one encoding: a last byte of zero after the first is a longer
// one.
func uvarint(b []byte) (uint64, int) {
	v, k := binary.Uvarint(b)
	if k > 1 && b[k-1] == 0 {
		return 0, 0
	}
	return v, k
}

// varint is binary.Varint of the shortest encoding only.
func varint(b []byte) (int64, int) {
	u, k := uvarint(b)
	v := int64(u >> 1)
	if u&1 != 0 {
		v = ^v
	}
	return v, k
}

var (
	_ raft.LogStore          = (*WALLog)(nil)
	_ raft.MonotonicLogStore = (*WALLog)(nil)
)
