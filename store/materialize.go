package store

import (
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/zeze-go/mq/internal/boltsafe"
)

// The materializer writes durable gens into the file: when MaxPendingBytes/4
// are waiting, when the oldest has waited MaterializeAfter, or at once when a
// reader, a command that scans the file or Close asks with kick. It writes
// them in one bbolt transaction with bbolt's normal fsync, never NoSync,
// then drops them from the overlay and releases their WAL records.

const (
	matMaxGens = 256 // gens in one bbolt transaction
	// matMaxBytes bounds the gens in one bbolt transaction, and so what it
	// holds in memory: the gens, and as much again in bbolt's dirty pages.
	matMaxBytes = 16 << 20
)

func (p *Partition) materializer() {
	debug.SetPanicOnFault(true) // see run
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		p.mu.Lock()
		gs, wait := p.due()
		if gs == nil && wait == 0 {
			p.matDone = true
			p.cond.Broadcast()
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		if gs == nil {
			timer.Reset(wait)
			select {
			case <-p.wake:
			case <-timer.C:
			}
			continue
		}
		if err := p.materialize(gs); err != nil {
			p.mu.Lock()
			p.matDone = true
			p.cond.Broadcast()
			p.mu.Unlock()
			return
		}
	}
}

// due returns the durable gens to write now, or how long to wait for more,
// 0 to exit. p.mu is held.
func (p *Partition) due() ([]*gen, time.Duration) {
	n, bytes := 0, 0
	for n < len(p.gens) && p.gens[n].acked && n < matMaxGens && bytes < matMaxBytes {
		bytes += len(p.gens[n].buf)
		n++
	}
	switch {
	case p.failed != nil && (n == 0 || p.matStop):
		return nil, 0 // a failed partition stops; what is durable is replayed at the next Open
	case n == 0 && p.matStop:
		return nil, 0
	case n == 0:
		return nil, time.Hour
	}
	if wait := p.opts.MaterializeAfter - time.Since(p.gens[0].at); !p.kick && !p.matStop &&
		p.pending < p.opts.MaxPendingBytes/4 && n < matMaxGens && wait > 0 {
		return nil, wait
	}
	p.kick = false
	return append([]*gen(nil), p.gens[:n]...), 0
}

// materialize writes gs, the oldest gens not in the file, into it in one
// transaction, then drops them from the overlay. A failure fails the
// partition: nothing is retried and acknowledged.
func (p *Partition) materialize(gs []*gen) error {
	recs := make([][]byte, len(gs))
	var pos Position
	for i, g := range gs {
		recs[i] = g.buf
		if g.pos != (Position{}) {
			pos = g.pos
		}
	}
	st, err := p.writeRecords(recs, pos)
	if err != nil {
		return p.fail(err)
	}
	p.mu.Lock()
	p.gens = append([]*gen(nil), p.gens[len(gs):]...)
	p.fileSt = st
	if pos != (Position{}) {
		p.filePos = pos
	}
	for _, g := range gs {
		p.pending -= len(g.buf)
	}
	p.commits++
	p.cond.Broadcast()
	p.mu.Unlock()
	if p.wal != nil {
		for _, g := range gs {
			if g.seg != 0 {
				p.wal.release(g.seg, 1)
			}
		}
	}
	return nil
}

// writeRecords writes the effect records recs, in index order and each one
// after the file's Applied, into the file in one transaction and returns
// the state after them. A non-zero pos is stored as the position in the
// replicated log that the file holds, in the same transaction.
func (p *Partition) writeRecords(recs [][]byte, pos Position) (state, error) {
	var st state
	err := p.update(func(tx *bolt.Tx) error {
		var bks [nBuckets]*bolt.Bucket
		for i, name := range bucketNames {
			bks[i] = tx.Bucket(name)
		}
		bks[bLog].FillPercent = 1.0 // keys only ever grow: pack pages full
		bks[bDelay].FillPercent = 0.9
		meta := tx.Bucket(bucketMeta)
		if err := decodeState(meta.Get(metaState), &st); err != nil {
			return err
		}
		for _, rec := range recs {
			idx, after, err := writeEffects(&bks, rec)
			if err != nil {
				return err
			}
			if idx != st.Applied+1 {
				return fmt.Errorf("%w: effect record %d after %d", ErrCorrupt, idx, st.Applied)
			}
			st = after
		}
		if pos != (Position{}) {
			if err := meta.Put(metaPosition, appendPosition(nil, pos)); err != nil {
				return err
			}
		}
		return meta.Put(metaState, appendState(nil, &st))
	})
	if err != nil {
		return st, fmt.Errorf("%w: %s: %w", ErrFailed, p.path, err)
	}
	return st, nil
}

// replay writes the partition's records that the previous run left in the
// WAL after the file's Applied into the file, in batches of bounded size,
// before the writer starts.
func (p *Partition) replay() error {
	var recs [][]byte
	bytes := 0
	flush := func() error {
		if len(recs) == 0 {
			return nil
		}
		st, err := p.writeRecords(recs, Position{})
		if err != nil {
			return err
		}
		p.fileSt = st
		clear(recs) // let the collector have them before the next batch
		recs, bytes = recs[:0], 0
		return nil
	}
	applied := p.fileSt.Applied
	err := p.wal.Recover(p.opts.Stream, applied, func(rec []byte) error {
		id, idx, _, _, err := splitEffects(rec)
		if err != nil {
			return err
		}
		if id != p.id || idx <= applied {
			return nil // an earlier file's of the same stream, or already in this one
		}
		if idx != applied+1 {
			return fmt.Errorf("%w: record %d follows %d: the log lost records", ErrCorrupt, idx, applied)
		}
		applied = idx
		recs = append(recs, rec)
		bytes += len(rec)
		if bytes >= matMaxBytes || len(recs) >= matMaxGens {
			return flush()
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	if err != nil {
		return fmt.Errorf("store: %s: replay: %w", p.path, err)
	}
	return nil
}

// drain waits until every gen is in the file. The writer calls it before a
// command that scans the file.
func (p *Partition) drain() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.gens) > 0 && p.failed == nil {
		p.kickLocked()
		p.cond.Wait()
	}
	return p.failed
}

// barrier waits until what is durable now is in the file, for reads that
// scan the file.
func (p *Partition) barrier() error {
	if p.wal == nil && !p.opts.Replicated {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	target := p.ackedSt.Applied
	for p.fileSt.Applied < target && p.failed == nil && !p.matDone {
		p.kickLocked()
		p.cond.Wait()
	}
	if p.fileSt.Applied < target {
		if p.failed != nil {
			return p.failed
		}
		return ErrClosed
	}
	return nil
}

// update runs fn in a write transaction; a bbolt panic or fault on a
// damaged page, which boltsafe contains, fails the partition.
func (p *Partition) update(fn func(*bolt.Tx) error) error {
	return p.corrupted(boltsafe.Update(p.db, fn))
}

// view runs fn in a read transaction, containing bbolt's panics.
func (p *Partition) view(fn func(*bolt.Tx) error) (err error) {
	select {
	case <-p.stop:
		return ErrClosed
	default:
	}
	err = boltsafe.View(p.db, fn)
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	return p.corrupted(err)
}

// corrupted fails the partition when err is damage boltsafe met inside
// bbolt, and returns it as this package's ErrCorrupt.
func (p *Partition) corrupted(err error) error {
	if errors.Is(err, boltsafe.ErrCorrupt) {
		return p.fail(fmt.Errorf("%w: %v", ErrCorrupt, err))
	}
	return err
}

// A partition file is mapped at boltMapSize from the start, address space
// only, so bbolt does not remap it at each doubling while it grows: a
// remap copies every key and value the writing transaction holds, in
// bbolt's dereference, which took 13% of a three-replica node's CPU while
// its files filled. Beyond the mapping bbolt's grow extends the file
// boltGrowBy past what it needs, with one truncate and fsync per step, so
// a new file is small and never sized to the mapping.
const (
	boltMapSize = 1 << 30 * (strconv.IntSize / 64) // 0 (bbolt's doubling) where the address space is 32-bit
	boltGrowBy  = 1 << 20
)

// openBolt opens a partition file after internal/boltsafe checked it,
// refusing a damaged one with ErrCorrupt instead of letting bbolt panic. The
// file's freelist is synced on each commit, so bbolt never rebuilds it in a
// goroutine of its own at Open, where a panic could not be contained.
func openBolt(path string) (*bolt.DB, error) {
	db, err := boltsafe.Open(path, &bolt.Options{Timeout: time.Second, FreelistType: bolt.FreelistMapType,
		InitialMmapSize: boltMapSize})
	switch {
	case err == nil:
		db.AllocSize = boltGrowBy
		return db, nil
	case errors.Is(err, boltsafe.ErrCorrupt), errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum),
		errors.Is(err, berrors.ErrVersionMismatch), errors.Is(err, berrors.ErrInvalidMapping):
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	return nil, fmt.Errorf("store: open %s: %w", path, err)
}
