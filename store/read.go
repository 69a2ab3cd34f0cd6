package store

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"

	bolt "go.etcd.io/bbolt"
)

// Readers see what is durable: the file, with the durable gens not yet in it
// laid over it. A reader takes the gens first and begins its read
// transaction after, so a gen the materializer drops meanwhile is in the
// transaction's file.

// snapshot is a reader's view of the durable gens.
type snapshot struct {
	gens []*gen // durable, not yet in the file when taken; oldest first
	st   state  // the acknowledged state
}

// low returns the first offset a reader of tx may find: the snapshot's Low,
// or the file's when a trim reached the file after the snapshot was taken.
func (s *snapshot) low(tx *bolt.Tx) uint64 {
	var st state
	if err := decodeState(tx.Bucket(bucketMeta).Get(metaState), &st); err == nil {
		return max(s.st.Low, st.Low)
	}
	return s.st.Low
}

func (p *Partition) snapshot() snapshot {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for n < len(p.gens) && p.gens[n].acked {
		n++
	}
	return snapshot{gens: p.gens[:n:n], st: p.ackedSt}
}

// record returns the log record at off: from the gens, else from b, else
// nil.
func (s *snapshot) record(b *bolt.Bucket, off uint64) []byte {
	for i := len(s.gens) - 1; i >= 0; i-- {
		if rec, ok := s.gens[i].logRecord(off); ok {
			return rec
		}
	}
	if b == nil {
		return nil
	}
	return b.Get(u64(off))
}

// lookup returns the current value of key in bucket b.
func (s *snapshot) lookup(tx *bolt.Tx, b int, key string) []byte {
	for i := len(s.gens) - 1; i >= 0; i-- {
		if v, ok := s.gens[i].lookup(b, key); ok {
			return v
		}
	}
	return tx.Bucket(bucketNames[b]).Get(bytesOf(key))
}

// Read appends to dst the messages from offset from on, at most limit of them
// and, past the first, at most maxBytes in all, and returns dst. Offsets below
// the low watermark were trimmed: reading starts at the first message still
// stored, and the caller compares offsets to notice the gap.
//
// Read stops before a record that fails its checksum, so the messages before
// it are returned without error; a Read that starts at such a record returns
// dst unchanged and an error wrapping ErrCorrupt that names the offset.
func (p *Partition) Read(from uint64, limit int, maxBytes int, dst []Message) ([]Message, error) {
	if limit <= 0 {
		return dst, nil
	}
	s := p.snapshot()
	from = max(from, s.st.Low)
	err := p.view(func(tx *bolt.Tx) error {
		bytes, n := 0, 0
		// emit adds the record v at off; more false stops the read.
		emit := func(off uint64, k, v []byte) (more bool, err error) {
			if n > 0 && maxBytes > 0 && bytes+len(v) > maxBytes {
				return false, nil
			}
			dst = append(dst, Message{})
			m := &dst[len(dst)-1]
			if err := decodeRecord(k, v, m); err != nil {
				dst = dst[:len(dst)-1]
				if n > 0 {
					return false, nil // the next Read starts here and reports it
				}
				return false, fmt.Errorf("%s: offset %d: %w", p.path, off, err)
			}
			m.Offset = off
			bytes += len(v)
			n++
			return n < limit, nil
		}
		missing := func(off uint64) error {
			return fmt.Errorf("%w: %s: offset %d missing from the log [%d, %d)", ErrCorrupt, p.path, off, s.st.Low, s.st.Next)
		}
		// Offsets below the oldest gen's first are in the file: scan them
		// with a cursor; the rest are in the gens.
		inFile := s.st.Next
		if len(s.gens) > 0 {
			inFile = min(inFile, s.gens[0].logBase)
		}
		off := max(from, s.low(tx))
		if off < inFile {
			cur := tx.Bucket(bucketLog).Cursor()
			for k, v := cur.Seek(u64(off)); off < inFile; k, v = cur.Next() {
				if len(k) != 8 || be.Uint64(k) != off {
					return missing(off)
				}
				more, err := emit(off, k, v)
				if !more || err != nil {
					return err
				}
				off++
			}
		}
		for ; off < s.st.Next; off++ {
			v := s.record(nil, off)
			if v == nil {
				return missing(off)
			}
			var k [8]byte
			be.PutUint64(k[:], off)
			more, err := emit(off, k[:], v)
			if !more || err != nil {
				return err
			}
		}
		return nil
	})
	return dst, err
}

// Fetch is Read that waits: when no message at or after from is stored
// yet, it waits until one is, ctx ends, with ctx.Err(), or the partition
// closes, with ErrClosed. Delayed messages are not stored until released.
// It returns at once, like Read, when max is not positive; and with its
// failure, ErrFailed or ErrCorrupt, when the partition has failed and
// nothing is stored, as nothing can be appended until it is reopened.
func (p *Partition) Fetch(ctx context.Context, from uint64, max, maxBytes int, dst []Message) ([]Message, error) {
	n := len(dst)
	for {
		changed := p.Changed() // before the read: a later append closes it
		out, err := p.Read(from, max, maxBytes, dst)
		if err != nil || len(out) > n || max <= 0 {
			return out, err
		}
		if err := p.failure(); err != nil {
			return dst, err // failed before the read: nothing more comes
		}
		if next := p.snapshot().st.Next; from > next {
			return dst, fmt.Errorf("%w: fetch from %d, the partition ends at %d", ErrPastEnd, from, next)
		}
		select {
		case <-p.down: // read once more, then return the failure
		case <-changed:
		case <-ctx.Done():
			return dst, ctx.Err()
		case <-p.stop:
			return dst, ErrClosed
		}
	}
}

// Get returns the message at offset, or ok false if it is not stored: not
// written yet, or trimmed. A record missing from the range the log holds is
// ErrCorrupt.
func (p *Partition) Get(offset uint64) (m Message, ok bool, err error) {
	s := p.snapshot()
	if offset < s.st.Low || offset >= s.st.Next {
		return m, false, p.closedErr()
	}
	err = p.view(func(tx *bolt.Tx) error {
		if offset < s.low(tx) {
			return nil
		}
		v := s.record(tx.Bucket(bucketLog), offset)
		if v == nil { // the log is dense from its low watermark to Next
			return fmt.Errorf("%w: %s: offset %d missing from the log [%d, %d)", ErrCorrupt, p.path, offset, s.st.Low, s.st.Next)
		}
		ok = true
		m.Offset = offset
		if err := decodeRecord(u64(offset), v, &m); err != nil {
			return fmt.Errorf("%s: offset %d: %w", p.path, offset, err)
		}
		return nil
	})
	return m, ok, err
}

func (p *Partition) closedErr() error {
	select {
	case <-p.stop:
		return ErrClosed
	default:
		return nil
	}
}

// Group returns the record of group name, or ok false for a group without
// one.
func (p *Partition) Group(name string) (g GroupState, ok bool, err error) {
	s := p.snapshot()
	err = p.view(func(tx *bolt.Tx) error {
		var err error
		if g, ok, err = decodeGroup(name, s.lookup(tx, bGroups, name)); err != nil {
			return fmt.Errorf("%s: group %w", p.path, err)
		}
		return nil
	})
	return g, ok, err
}

// GroupOffset returns group's committed offset, or ok false for a group that
// never committed.
func (p *Partition) GroupOffset(group string) (offset uint64, ok bool, err error) {
	g, ok, err := p.Group(group)
	return g.Offset, ok, err
}

// GroupStates returns every group's record (FenceRecord is none). A damaged record, one the log
// has not replaced since, is left out, and the error, wrapping ErrCorrupt,
// names the first of them: the good records are returned with it.
func (p *Partition) GroupStates() (map[string]GroupState, error) {
	out := map[string]GroupState{}
	damaged := map[string]error{}
	s := p.snapshot()
	err := p.view(func(tx *bolt.Tx) error {
		put := func(k string, v []byte) {
			if k == FenceRecord {
				return
			}
			g, _, err := decodeGroup(k, v)
			if err != nil {
				delete(out, k)
				damaged[k] = err
				return
			}
			out[k] = g
			delete(damaged, k)
		}
		tx.Bucket(bucketGroups).ForEach(func(k, v []byte) error { put(string(k), v); return nil })
		for _, g := range s.gens {
			for k, sp := range g.kv[bGroups] {
				if sp.del {
					delete(out, k)
					delete(damaged, k)
				} else {
					put(k, g.buf[sp.off:sp.off+sp.n])
				}
			}
		}
		return nil
	})
	if err == nil && len(damaged) > 0 {
		first := slices.Min(slices.Collect(maps.Keys(damaged)))
		err = fmt.Errorf("%s: group %w (%d damaged records)", p.path, damaged[first], len(damaged))
	}
	return out, err
}

// Groups returns every group's committed offset.
func (p *Partition) Groups() (map[string]uint64, error) {
	states, err := p.GroupStates()
	out := make(map[string]uint64, len(states))
	for k, g := range states {
		out[k] = g.Offset
	}
	return out, err
}

// SeekTime returns the offset of the first message stored at or after t, in
// unix ns, or Next when there is none. StoredAt never decreases along the
// log, so this is a binary search over the acknowledged offsets.
func (p *Partition) SeekTime(t int64) (uint64, error) {
	s := p.snapshot()
	var out uint64
	err := p.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLog)
		low := s.low(tx)
		var ferr error
		i := sort.Search(int(s.st.Next-min(low, s.st.Next)), func(i int) bool {
			if ferr != nil {
				return true
			}
			off := low + uint64(i)
			v := s.record(b, off)
			if v == nil { // the log is dense in [Low, Next): cannot happen
				ferr = fmt.Errorf("%w: %s: offset %d missing from the log", ErrCorrupt, p.path, off)
				return true
			}
			var m Message
			if err := decodeRecord(u64(off), v, &m); err != nil {
				ferr = fmt.Errorf("%s: offset %d: %w", p.path, off, err)
				return true
			}
			return m.StoredAt >= t
		})
		out = low + uint64(i)
		return ferr
	})
	return out, err
}

// NextDue returns the DeliverAt of the earliest delayed message, or ok false
// when none is waiting.
func (p *Partition) NextDue() (due int64, ok bool, err error) {
	s := p.snapshot()
	for _, g := range s.gens {
		if g.delayDel { // a release not yet in the file: read the file after it
			if err := p.barrier(); err != nil {
				return 0, false, err
			}
			s = p.snapshot()
			break
		}
	}
	err = p.view(func(tx *bolt.Tx) error {
		k, _ := tx.Bucket(bucketDelay).Cursor().First()
		if len(k) == 16 {
			due, ok = int64(be.Uint64(k[:8])), true
		}
		return nil
	})
	for _, g := range s.gens {
		if g.hasDue && (!ok || g.minDue < due) {
			due, ok = g.minDue, true
		}
	}
	return due, ok, err
}

// HalfTx describes the undecided half messages of one transaction.
type HalfTx struct {
	TxID      string
	Producer  string
	FirstSeen int64
	LastCheck int64
	Checks    int
	Messages  int
}

// HalfTxs calls fn for each undecided transaction with half messages here,
// in txid order, until fn returns false.
func (p *Partition) HalfTxs(fn func(HalfTx) bool) error {
	if err := p.barrier(); err != nil {
		return err
	}
	// fn runs after the read transaction: an Apply from fn would otherwise
	// wait for it, through bbolt's remap when the file grows, and it for fn.
	var all []HalfTx
	err := p.view(func(tx *bolt.Tx) error {
		cur := tx.Bucket(bucketHalf).Cursor()
		for k, v := cur.First(); k != nil; k, v = cur.Next() {
			h, err := decodeHalf(v)
			if err != nil {
				return fmt.Errorf("%s: %s: %w", p.path, k, err)
			}
			all = append(all, HalfTx{TxID: string(k), Producer: h.Producer, FirstSeen: h.FirstSeen,
				LastCheck: h.LastCheck, Checks: h.Checks, Messages: len(h.Records)})
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, h := range all {
		if !fn(h) {
			break
		}
	}
	return nil
}

// HalfProducer returns the producer recorded with the undecided half
// messages of txid here, and whether there are any.
func (p *Partition) HalfProducer(txid string) (producer string, ok bool, err error) {
	s := p.snapshot()
	err = p.view(func(tx *bolt.Tx) error {
		v := s.lookup(tx, bHalf, txid)
		if v == nil {
			return nil
		}
		h, err := decodeHalf(v)
		if err != nil {
			return fmt.Errorf("%s: %s: %w", p.path, txid, err)
		}
		producer, ok = h.Producer, true
		return nil
	})
	return producer, ok, err
}

// Decision returns the recorded decision for txid: Undecided if there is
// none, or if it was pruned after its time to live.
func (p *Partition) Decision(txid string) (Decision, error) {
	s := p.snapshot()
	d := Undecided
	err := p.view(func(tx *bolt.Tx) error {
		v, err := unseal(txid, s.lookup(tx, bTxs, txid), decisionBytes)
		if v != nil {
			d = Decision(v[0])
		}
		if err != nil {
			return fmt.Errorf("%s: decision %w", p.path, err)
		}
		return nil
	})
	return d, err
}
