package store

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
)

// WALRecord is where a record of a stream lies in the WAL: its segment and
// its frame's offset and length. A stream that keeps its records in the
// WAL, as a raft log read long after it was written and across restarts
// does, holds each by its WALRecord until it releases it; a segment is
// deleted once every record in it was released.
type WALRecord struct {
	Seg uint64
	Off int64
	N   int
}

// AppendRecord is Append for a stream that keeps its records: done gets
// the record's place, for ReadRecord and Release.
func (w *WAL) AppendRecord(stream string, payload []byte, done func(r WALRecord, err error)) {
	w.enqueue(&walReq{stream: stream, payload: payload, doneAt: done})
}

// Retain keeps the records of stream left by the previous run past
// FinishRecovery, each until it is released, and returns them in log
// order. Call it once per stream, before FinishRecovery; Recover is then
// not needed.
func (w *WAL) Retain(stream string) ([]WALRecord, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.retained == nil {
		w.retained = map[string]bool{}
	}
	if w.retained[stream] {
		return nil, fmt.Errorf("store: wal: stream %q retained twice", stream)
	}
	locs := w.rec[stream]
	recs := make([]WALRecord, 0, len(locs))
	for _, l := range locs {
		if l.n == 0 {
			return nil, fmt.Errorf("%w: %s holds records of stream %s in format 1, which cannot be kept", ErrFormat, w.segPath(l.seg), stream)
		}
		recs = append(recs, WALRecord{Seg: l.seg, Off: l.off, N: l.n})
	}
	for _, r := range recs {
		w.refs[r.Seg]++
	}
	w.retained[stream] = true
	return recs, nil
}

// ReadRecord reads the record at r into buf, grown if short, and returns
// its payload. The record must not have been released.
func (w *WAL) ReadRecord(r WALRecord, buf []byte) ([]byte, error) {
	if r.N < walFrameLen+3 || r.N > walFrameLen+walMaxFrame {
		return nil, fmt.Errorf("store: wal: no record of %d bytes", r.N)
	}
	f, err := w.reader(r.Seg)
	if err != nil {
		return nil, err
	}
	if cap(buf) < r.N {
		buf = make([]byte, r.N)
	}
	buf = buf[:r.N]
	if _, err := f.ReadAt(buf, r.Off); err != nil {
		return nil, fmt.Errorf("store: wal: %s: %w", w.segPath(r.Seg), err)
	}
	body := buf[walFrameLen:]
	if int(binary.BigEndian.Uint32(buf)) != len(body) || crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(buf[4:]) || body[0] != frameRecord {
		return nil, w.corrupt(r.Seg, "record at %d changed since it was written", r.Off)
	}
	nl := int(binary.BigEndian.Uint16(body[1:]))
	if 3+nl > len(body) {
		return nil, w.corrupt(r.Seg, "record at %d changed since it was written", r.Off)
	}
	return body[3+nl:], nil
}

// reader returns a handle to read segment seg, opening it once.
func (w *WAL) reader(seg uint64) (File, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if f := w.files[seg]; f != nil {
		return f, nil
	}
	if w.refs[seg] <= 0 && seg != w.cur {
		return nil, fmt.Errorf("store: wal: segment %d holds no record", seg)
	}
	f, err := w.fs.OpenFile(w.segPath(seg), os.O_RDONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("store: wal: %w", err)
	}
	w.files[seg] = f
	return f, nil
}

// Release records that the record at r is no longer needed.
func (w *WAL) Release(r WALRecord) { w.release(r.Seg, 1) }
