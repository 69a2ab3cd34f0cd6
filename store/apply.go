package store

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	bolt "go.etcd.io/bbolt"
)

var be = binary.BigEndian

func u64(v uint64) []byte {
	b := make([]byte, 8)
	be.PutUint64(b, v)
	return b
}

// writeTx applies commands inside one bbolt write transaction. st is the
// working copy of the partition state; it becomes the committed state only if
// the transaction commits.
type writeTx struct {
	tx   *bolt.Tx
	st   *state
	enc  *encoder
	grew bool

	log, half, txs, groups, delay, dedup, meta *bolt.Bucket
	scratch                                    Message
}

func (w *writeTx) open() {
	w.log = w.tx.Bucket(bucketLog)
	w.half = w.tx.Bucket(bucketHalf)
	w.txs = w.tx.Bucket(bucketTxs)
	w.groups = w.tx.Bucket(bucketGroups)
	w.delay = w.tx.Bucket(bucketDelay)
	w.dedup = w.tx.Bucket(bucketDedup)
	w.meta = w.tx.Bucket(bucketMeta)
	w.log.FillPercent = 1.0 // keys only ever grow: pack pages full
	w.delay.FillPercent = 0.9
}

func (w *writeTx) apply(c *Command) error {
	c.Count, c.More, c.Previous = 0, false, Undecided
	switch c.Op {
	case OpAppend:
		c.Acks = resize(c.Acks, len(c.Msgs))
		for i := range c.Msgs {
			if err := w.append(c, &c.Msgs[i], &c.Acks[i]); err != nil {
				return err
			}
		}
		return nil
	case OpCommitOffset:
		if c.Group == "" {
			return fmt.Errorf("%w: commit offset without group", ErrBadCommand)
		}
		return w.groups.Put(w.enc.bytes([]byte(c.Group)), w.enc.bytes(u64(c.Offset)))
	case OpDeleteGroup:
		if c.Group == "" {
			return fmt.Errorf("%w: delete group without group", ErrBadCommand)
		}
		return w.groups.Delete([]byte(c.Group))
	case OpTrim:
		return w.trim(c)
	case OpPrepare:
		return w.prepare(c)
	case OpCommitTx:
		return w.commitTx(c)
	case OpRollbackTx:
		return w.rollbackTx(c)
	case OpRelease:
		return w.release(c)
	case OpTxChecked:
		return w.txChecked(c)
	}
	return fmt.Errorf("%w: op %d", ErrBadCommand, c.Op)
}

func resize(a []Ack, n int) []Ack {
	if cap(a) < n {
		return make([]Ack, n)
	}
	a = a[:n]
	clear(a)
	return a
}

// append stores m: deduplicated by ID, held back when due later, else at the
// end of the log.
func (w *writeTx) append(c *Command, m *Message, ack *Ack) error {
	var idKey []byte // m.ID in the arena, shared by the lookup and the insert
	if m.ID != "" {
		idKey = w.enc.str(m.ID)
		if v := w.dedup.Get(idKey); len(v) == 16 {
			ack.Offset = be.Uint64(v)
			ack.Duplicate = true
			ack.Delayed = ack.Offset == noOffset
			return nil
		}
	}
	stored := c.Now
	if stored < w.st.LastStored {
		stored = w.st.LastStored
	}
	m.StoredAt = stored
	w.st.LastStored = stored
	if m.DeliverAt > c.Now {
		w.st.DelaySeq++
		var k [16]byte
		be.PutUint64(k[:8], uint64(m.DeliverAt))
		be.PutUint64(k[8:], w.st.DelaySeq)
		key := w.enc.bytes(k[:])
		v, err := w.enc.record(key, m)
		if err != nil {
			return err
		}
		if err := w.delay.Put(key, v); err != nil {
			return err
		}
		w.st.Delayed++
		w.grew = true
		ack.Delayed = true
		ack.Offset = noOffset
		return w.putDedupKey(idKey, noOffset, stored)
	}
	off, err := w.appendLog(m)
	if err != nil {
		return err
	}
	ack.Offset = off
	return w.putDedupKey(idKey, off, stored)
}

func (w *writeTx) appendLog(m *Message) (uint64, error) {
	off := w.st.Next
	var k [8]byte
	be.PutUint64(k[:], off)
	key := w.enc.bytes(k[:])
	v, err := w.enc.record(key, m)
	if err != nil {
		return 0, err
	}
	if err := w.log.Put(key, v); err != nil {
		return 0, err
	}
	w.st.Next++
	w.st.Bytes += int64(len(v))
	w.grew = true
	return off, nil
}

func (w *writeTx) putDedup(id string, off uint64, at int64) error {
	if id == "" {
		return nil
	}
	return w.putDedupKey(w.enc.str(id), off, at)
}

// putDedupKey records that the message whose ID is key (in the arena; nil
// for none) went to off at time at.
func (w *writeTx) putDedupKey(key []byte, off uint64, at int64) error {
	if key == nil {
		return nil
	}
	var v [16]byte
	be.PutUint64(v[:8], off)
	be.PutUint64(v[8:], uint64(at))
	return w.dedup.Put(key, w.enc.bytes(v[:]))
}

// trim deletes the head of the log by age and size, then prunes dedup entries
// and transaction decisions past their time to live.
//
// A damaged record does not fail the command (which would fail every command
// batched with it, sends included): it is deleted by size like any other, and
// by age when a later intact record is old enough (StoredAt never decreases
// along the log). Its dedup entry is found by offset.
func (w *writeTx) trim(c *Command) error {
	limit := c.Limit
	if limit <= 0 {
		limit = 100_000
	}
	cur := w.log.Cursor()
	for k, v := cur.First(); k != nil; k, v = cur.First() {
		byBytes := c.MaxBytes > 0 && w.st.Bytes > c.MaxBytes
		byAge := false
		if !byBytes && c.MaxAge > 0 {
			stored, _, _ := w.recordInfo(k, v)
			byAge = stored < c.Now-c.MaxAge
		}
		if !byBytes && !byAge {
			break
		}
		if c.Count >= limit {
			c.More = true
			break
		}
		if err := w.deleteDedupOf(k, v); err != nil {
			return err
		}
		if err := cur.Delete(); err != nil {
			return err
		}
		w.st.Bytes -= int64(len(v))
		w.st.Low = be.Uint64(k) + 1
		c.Count++
	}
	if k, _ := w.log.Cursor().First(); k == nil {
		w.st.Low = w.st.Next
	}
	if w.st.DedupLow < w.st.Low {
		w.st.DedupLow = w.st.Low
	}
	if c.DedupTTL > 0 {
		if err := w.pruneDedup(c, c.Now-c.DedupTTL, limit); err != nil {
			return err
		}
	}
	if c.DecideTTL > 0 {
		return w.pruneDecisions(c.Now - c.DecideTTL)
	}
	return nil
}

// recordInfo returns when the log record k, v was stored and its ID. For a
// record that fails its check, ok is false, the ID is unknown and stored is
// the StoredAt of the next intact record (the damaged one is no newer), or
// MaxInt64 when there is none.
func (w *writeTx) recordInfo(k, v []byte) (stored int64, id string, ok bool) {
	if err := decodeRecord(k, v, &w.scratch); err == nil {
		return w.scratch.StoredAt, w.scratch.ID, true
	}
	cur := w.log.Cursor()
	cur.Seek(k)
	for k2, v2 := cur.Next(); k2 != nil; k2, v2 = cur.Next() {
		if decodeRecord(k2, v2, &w.scratch) == nil {
			return w.scratch.StoredAt, "", false
		}
	}
	return math.MaxInt64, "", false
}

// deleteDedupOf deletes the dedup entry of the log record k, v.
func (w *writeTx) deleteDedupOf(k, v []byte) error {
	off := be.Uint64(k)
	if off < w.st.DedupLow {
		return nil
	}
	if err := decodeRecord(k, v, &w.scratch); err != nil {
		return w.deleteDedupAt(off)
	}
	if w.scratch.ID == "" {
		return nil
	}
	return w.dedup.Delete([]byte(w.scratch.ID))
}

// deleteDedupAt deletes the dedup entries pointing at offset off. It scans the
// whole index: it is only for a damaged record, whose ID cannot be read.
func (w *writeTx) deleteDedupAt(off uint64) error {
	var ids [][]byte
	err := w.dedup.ForEach(func(k, v []byte) error {
		if len(v) == 16 && be.Uint64(v[:8]) == off {
			ids = append(ids, bytes.Clone(k))
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, id := range ids {
		if err := w.dedup.Delete(id); err != nil {
			return err
		}
	}
	return nil
}

// pruneDedup walks the log from DedupLow and drops the dedup entries of
// records stored before cutoff, at most limit of them (setting c.More when it
// stops there). Delayed messages' entries are dropped when the message is
// released and later pruned the same way.
func (w *writeTx) pruneDedup(c *Command, cutoff int64, limit int) error {
	cur := w.log.Cursor()
	var start [8]byte
	be.PutUint64(start[:], w.st.DedupLow)
	n := 0
	for k, v := cur.Seek(start[:]); k != nil; k, v = cur.Next() {
		stored, id, ok := w.recordInfo(k, v)
		if stored >= cutoff {
			break
		}
		if n >= limit {
			c.More = true
			break
		}
		var err error
		switch {
		case !ok:
			err = w.deleteDedupAt(be.Uint64(k))
		case id != "":
			err = w.dedup.Delete([]byte(id))
		}
		if err != nil {
			return err
		}
		w.st.DedupLow = be.Uint64(k) + 1
		n++
	}
	return nil
}

func (w *writeTx) pruneDecisions(cutoff int64) error {
	cur := w.txs.Cursor()
	for k, v := cur.First(); k != nil; {
		if len(v) == 9 && int64(be.Uint64(v[1:])) < cutoff {
			if err := cur.Delete(); err != nil {
				return err
			}
			k, v = cur.Seek(k)
			continue
		}
		k, v = cur.Next()
	}
	return nil
}

// halfTx is the value of the half bucket: the undecided messages of one
// transaction in this partition.
type halfTx struct {
	Producer  string   `msgpack:"p"`
	FirstSeen int64    `msgpack:"f"`
	LastCheck int64    `msgpack:"l"`
	Checks    int      `msgpack:"c"`
	Records   [][]byte `msgpack:"r"` // encoded records (CRC'd under the txid key)
}

func (w *writeTx) decision(txid string) Decision {
	v := w.txs.Get([]byte(txid))
	if len(v) == 9 {
		return Decision(v[0])
	}
	return Undecided
}

func (w *writeTx) decide(c *Command, d Decision) error {
	var v [9]byte
	v[0] = byte(d)
	be.PutUint64(v[1:], uint64(c.Now))
	return w.txs.Put(w.enc.bytes([]byte(c.TxID)), w.enc.bytes(v[:]))
}

func (w *writeTx) loadHalf(txid string) (*halfTx, error) {
	v := w.half.Get([]byte(txid))
	if v == nil {
		return nil, nil
	}
	return decodeHalf(v)
}

func decodeHalf(v []byte) (*halfTx, error) {
	var h halfTx
	if err := msgpack.Unmarshal(v, &h); err != nil {
		return nil, fmt.Errorf("%w: half transaction: %v", ErrCorrupt, err)
	}
	return &h, nil
}

func (w *writeTx) putHalf(txid string, h *halfTx) error {
	v, err := msgpack.Marshal(h)
	if err != nil {
		return err
	}
	return w.half.Put(w.enc.bytes([]byte(txid)), v)
}

func (w *writeTx) prepare(c *Command) error {
	if c.TxID == "" {
		return fmt.Errorf("%w: prepare without txid", ErrBadCommand)
	}
	if d := w.decision(c.TxID); d != Undecided {
		c.Previous = d
		return fmt.Errorf("%w: %s is %s", ErrDecided, c.TxID, d)
	}
	h, err := w.loadHalf(c.TxID)
	if err != nil {
		return err
	}
	if h == nil {
		h = &halfTx{Producer: c.Producer, FirstSeen: c.Now}
	}
	key := []byte(c.TxID)
	for i := range c.Msgs {
		rec, err := w.enc.record(key, &c.Msgs[i])
		if err != nil {
			return err
		}
		h.Records = append(h.Records, append([]byte(nil), rec...))
	}
	c.Count = len(c.Msgs)
	return w.putHalf(c.TxID, h)
}

func (w *writeTx) commitTx(c *Command) error {
	if c.TxID == "" {
		return fmt.Errorf("%w: commit without txid", ErrBadCommand)
	}
	if d := w.decision(c.TxID); d != Undecided {
		c.Previous = d
		c.Acks = c.Acks[:0]
		return nil
	}
	h, err := w.loadHalf(c.TxID)
	if err != nil {
		return err
	}
	var n int
	if h != nil {
		n = len(h.Records)
	}
	c.Acks = resize(c.Acks, n+len(c.Msgs))
	for i := 0; i < n; i++ {
		if err := decodeRecord([]byte(c.TxID), h.Records[i], &w.scratch); err != nil {
			return err
		}
		m := w.scratch
		if err := w.append(c, &m, &c.Acks[i]); err != nil {
			return err
		}
	}
	for i := range c.Msgs {
		if err := w.append(c, &c.Msgs[i], &c.Acks[n+i]); err != nil {
			return err
		}
	}
	c.Count = n + len(c.Msgs)
	if h != nil {
		if err := w.half.Delete([]byte(c.TxID)); err != nil {
			return err
		}
	}
	return w.decide(c, Committed)
}

func (w *writeTx) rollbackTx(c *Command) error {
	if c.TxID == "" {
		return fmt.Errorf("%w: rollback without txid", ErrBadCommand)
	}
	if d := w.decision(c.TxID); d != Undecided {
		c.Previous = d
		return nil
	}
	h, err := w.loadHalf(c.TxID)
	if err != nil {
		return err
	}
	if h != nil {
		c.Count = len(h.Records)
		if err := w.half.Delete([]byte(c.TxID)); err != nil {
			return err
		}
	}
	return w.decide(c, RolledBack)
}

func (w *writeTx) txChecked(c *Command) error {
	h, err := w.loadHalf(c.TxID)
	if err != nil || h == nil {
		return err
	}
	h.Checks++
	h.LastCheck = c.Now
	c.Count = h.Checks
	return w.putHalf(c.TxID, h)
}

// release moves due delayed messages into the log in key order: by due time,
// then by arrival, so messages of one key due together keep their order.
func (w *writeTx) release(c *Command) error {
	limit := c.Limit
	if limit <= 0 {
		limit = 10_000
	}
	cur := w.delay.Cursor()
	for k, v := cur.First(); k != nil; k, v = cur.First() {
		if int64(be.Uint64(k[:8])) > c.Now {
			break
		}
		if c.Count >= limit {
			c.More = true
			break
		}
		if err := decodeRecord(k, v, &w.scratch); err != nil {
			// Failing would fail every command batched with this one, on
			// every try; dropping the record would lose a message silently.
			// It moves into the log as it is: its CRC covers its delay key,
			// so readers get ErrCorrupt at its offset.
			if err := w.moveDamaged(v); err != nil {
				return err
			}
			if err := cur.Delete(); err != nil {
				return err
			}
			w.st.Delayed--
			c.Count++
			continue
		}
		m := w.scratch
		m.StoredAt = max(c.Now, w.st.LastStored)
		w.st.LastStored = m.StoredAt
		off, err := w.appendLog(&m)
		if err != nil {
			return err
		}
		if m.ID != "" {
			if err := w.putDedup(m.ID, off, m.StoredAt); err != nil {
				return err
			}
		}
		if err := cur.Delete(); err != nil {
			return err
		}
		w.st.Delayed--
		c.Count++
	}
	return nil
}

// moveDamaged appends the undecodable record v to the log unchanged.
func (w *writeTx) moveDamaged(v []byte) error {
	var k [8]byte
	be.PutUint64(k[:], w.st.Next)
	if err := w.log.Put(w.enc.bytes(k[:]), w.enc.bytes(v)); err != nil {
		return err
	}
	w.st.Next++
	w.st.Bytes += int64(len(v))
	w.grew = true
	return nil
}

func encodeState(s *state) []byte {
	b, _ := msgpack.Marshal(s)
	return b
}

func decodeState(b []byte, s *state) error {
	if err := msgpack.Unmarshal(b, s); err != nil {
		return fmt.Errorf("%w: meta state: %v", ErrCorrupt, err)
	}
	return nil
}
