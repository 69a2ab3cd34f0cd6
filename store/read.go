package store

import (
	"errors"
	"fmt"
	"sort"

	bolt "go.etcd.io/bbolt"
)

// Read appends to dst the messages from offset from on, at most max of them
// and, past the first, at most maxBytes in all, and returns dst. Offsets below
// the low watermark are gone (trimmed): reading starts at the first message
// still stored, and the caller compares offsets to notice the gap.
//
// Read stops before a record that fails its checksum, so the messages before
// it are returned without error; a Read that starts at such a record returns
// an error wrapping ErrCorrupt (and naming the offset) and dst unchanged.
func (p *Partition) Read(from uint64, max int, maxBytes int, dst []Message) ([]Message, error) {
	if max <= 0 {
		return dst, nil
	}
	p.readBarrier(from, from+uint64(max))
	err := p.view(func(tx *bolt.Tx) error {
		cur := tx.Bucket(bucketLog).Cursor()
		var start [8]byte
		be.PutUint64(start[:], from)
		bytes, n := 0, 0
		for k, v := cur.Seek(start[:]); k != nil && n < max; k, v = cur.Next() {
			if n > 0 && maxBytes > 0 && bytes+len(v) > maxBytes {
				break
			}
			dst = append(dst, Message{})
			m := &dst[len(dst)-1]
			if err := decodeRecord(k, v, m); err != nil {
				dst = dst[:len(dst)-1]
				if n > 0 {
					return nil // the next Read starts here and reports it
				}
				return fmt.Errorf("offset %d: %w", be.Uint64(k), err)
			}
			m.Offset = be.Uint64(k)
			bytes += len(v)
			n++
		}
		return nil
	})
	return dst, err
}

// Get returns the message at offset, or ok false if it is not stored.
func (p *Partition) Get(offset uint64) (m Message, ok bool, err error) {
	p.readBarrier(offset, offset+1)
	err = p.view(func(tx *bolt.Tx) error {
		key := u64(offset)
		v := tx.Bucket(bucketLog).Get(key)
		if v == nil {
			return nil
		}
		ok = true
		m.Offset = offset
		if err := decodeRecord(key, v, &m); err != nil {
			return fmt.Errorf("offset %d: %w", offset, err)
		}
		return nil
	})
	return m, ok, err
}

// GroupOffset returns group's committed offset, or ok false for a group that
// never committed.
func (p *Partition) GroupOffset(group string) (offset uint64, ok bool, err error) {
	p.barrier()
	err = p.view(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketGroups).Get([]byte(group))
		if len(v) == 8 {
			offset, ok = be.Uint64(v), true
		}
		return nil
	})
	return offset, ok, err
}

// Groups returns every group's committed offset.
func (p *Partition) Groups() (map[string]uint64, error) {
	out := map[string]uint64{}
	p.barrier()
	err := p.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketGroups).ForEach(func(k, v []byte) error {
			if len(v) == 8 {
				out[string(k)] = be.Uint64(v)
			}
			return nil
		})
	})
	return out, err
}

// SeekTime returns the offset of the first message stored at or after t
// (unix ns), or Next when there is none. StoredAt never decreases along the
// log, so this is a binary search over the offsets of one read transaction's
// snapshot (the committed Stats may already be ahead of it).
func (p *Partition) SeekTime(t int64) (uint64, error) {
	p.barrier()
	var out uint64
	err := p.view(func(tx *bolt.Tx) error {
		var st state
		if s := tx.Bucket(bucketMeta).Get(metaState); s != nil {
			if err := decodeState(s, &st); err != nil {
				return err
			}
		}
		b := tx.Bucket(bucketLog)
		var ferr error
		i := sort.Search(int(st.Next-st.Low), func(i int) bool {
			if ferr != nil {
				return true
			}
			key := u64(st.Low + uint64(i))
			v := b.Get(key)
			if v == nil { // the log is dense in [Low, Next): cannot happen
				ferr = fmt.Errorf("%w: offset %d missing from the log", ErrCorrupt, st.Low+uint64(i))
				return true
			}
			var m Message
			if err := decodeRecord(key, v, &m); err != nil {
				ferr = fmt.Errorf("offset %d: %w", st.Low+uint64(i), err)
				return true
			}
			return m.StoredAt >= t
		})
		out = st.Low + uint64(i)
		return ferr
	})
	return out, err
}

// NextDue returns the DeliverAt of the earliest delayed message, or ok false
// when none is waiting.
func (p *Partition) NextDue() (due int64, ok bool, err error) {
	err = p.view(func(tx *bolt.Tx) error {
		k, _ := tx.Bucket(bucketDelay).Cursor().First()
		if k != nil {
			due, ok = int64(be.Uint64(k[:8])), true
		}
		return nil
	})
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
// until fn returns false.
func (p *Partition) HalfTxs(fn func(HalfTx) bool) error {
	return p.view(func(tx *bolt.Tx) error {
		cur := tx.Bucket(bucketHalf).Cursor()
		for k, v := cur.First(); k != nil; k, v = cur.Next() {
			h, err := decodeHalf(v)
			if err != nil {
				return err
			}
			if !fn(HalfTx{TxID: string(k), Producer: h.Producer, FirstSeen: h.FirstSeen,
				LastCheck: h.LastCheck, Checks: h.Checks, Messages: len(h.Records)}) {
				return nil
			}
		}
		return nil
	})
}

// Decision returns the recorded decision for txid (Undecided if none, or if
// it was pruned after its time to live).
func (p *Partition) Decision(txid string) (Decision, error) {
	p.barrier() // a logged outbox commit records its decision on materializing
	d := Undecided
	err := p.view(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketTxs).Get([]byte(txid)); len(v) == 9 {
			d = Decision(v[0])
		}
		return nil
	})
	return d, err
}

func (p *Partition) view(fn func(*bolt.Tx) error) error {
	select {
	case <-p.stop:
		return ErrClosed
	default:
	}
	err := p.db.View(fn)
	if errors.Is(err, bolt.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	return err
}
