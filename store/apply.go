package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	bolt "go.etcd.io/bbolt"
)

var be = binary.BigEndian

const (
	noOffset      = ^uint64(0)
	defaultLimit  = 10_000  // OpRelease
	defaultTrim   = 100_000 // OpTrim
	decisionBytes = 9       // txs value: decision, decided-at (8)
	dedupBytes    = 16      // dedup value: offset (8), stored-at (8)
)

// view is what a command reads: the gen being built, g; the gens logged but
// not yet in the file, gens, oldest first; and the file as of a read
// transaction begun after gens was taken. That transaction begins on first
// use, so a batch of sends with fresh IDs never reads the file. Whatever a
// gen in gens holds is either still in gens or already in the file that tx
// reads.
type view struct {
	db   *bolt.DB
	g    *gen
	gens []*gen
	tx   *bolt.Tx
	bk   [nBuckets]*bolt.Bucket

	scratch Message
}

// bucket returns bucket b of the view's read transaction, beginning it.
func (v *view) bucket(b int) *bolt.Bucket {
	if v.tx == nil {
		tx, err := v.db.Begin(false)
		if err != nil {
			panic(fmt.Sprintf("begin a read transaction: %v", err)) // contained by the writer: the partition fails
		}
		v.tx = tx
		for i, name := range bucketNames {
			v.bk[i] = tx.Bucket(name)
		}
	}
	return v.bk[b]
}

// end ends the view's read transaction, if it began one.
func (v *view) end() {
	if v.tx != nil {
		_ = v.tx.Rollback()
	}
	*v = view{}
}

// get returns the current value of key in bucket b, nil when absent.
func (v *view) get(b int, key string) []byte {
	if val, ok := v.g.lookup(b, key); ok {
		return val
	}
	for i := len(v.gens) - 1; i >= 0; i-- {
		if val, ok := v.gens[i].lookup(b, key); ok {
			return val
		}
	}
	return v.bucket(b).Get(bytesOf(key))
}

// scans reports whether c reads a bucket in key order, the log, the delay
// index, the groups or the decisions: the partition runs it only when the file holds
// everything, with no gen pending and g empty.
func scans(c *Command) bool { return c.Op == OpTrim || c.Op == OpRelease || c.Op == OpFence }

// apply runs c against the view, adding its effects to v.g, and returns its
// result. An error wrapping ErrBadCommand, ErrDecided, ErrStaleGeneration,
// ErrClaimed, ErrFrozen, ErrTooLarge or ErrCorrupt is the command's own: it is found before c
// writes anything, so v.g is as before.
func (v *view) apply(c *Command) (Result, error) {
	var res Result
	if err := c.check(); err != nil {
		return res, err
	}
	if v.g.st.Frozen != 0 && c.Op != OpFreeze && c.Op != OpThaw {
		return res, fmt.Errorf("%w: at %d", ErrFrozen, v.g.st.Frozen)
	}
	switch c.Op {
	case OpFreeze:
		v.g.st.Frozen = c.Offset
	case OpThaw:
		v.g.st.Frozen = 0
	case OpAppend:
		if err := v.checkDedup(c.Msgs); err != nil {
			return res, err
		}
		res.Acks = make([]Ack, len(c.Msgs))
		for i := range c.Msgs {
			v.append(c.Now, c.Msgs[i], &res.Acks[i])
		}
	case OpCommitOffset, OpUnclaim, OpRenew:
		return res, v.commitOffset(c, &res)
	case OpClaim:
		return res, v.claim(c, &res)
	case OpResetOffset:
		res.Found = v.get(bGroups, c.Group) != nil // a damaged record is reset too
		g := GroupState{Offset: c.Offset}
		if old, found, err := v.group(c.Group); err == nil && found && old.Leased(c.Now, 0) {
			// The owner's lease is kept: another claim waits for it, as the
			// owner may still deliver: see GroupState.Lease.
			g.Updated, g.Lease = old.Updated, old.Lease
		}
		return res, v.fence(c, g, &res)
	case OpFence:
		return res, v.fenceAll(c, &res)
	case OpDeleteGroup:
		res.Found = v.get(bGroups, c.Group) != nil
		if c.MaxAge > 0 { // only an idle record: one of unknown age, 0, is kept
			g, found, err := v.group(c.Group)
			if err != nil || !found || g.Updated == 0 || g.Updated >= c.Now-c.MaxAge {
				return res, err
			}
		}
		if res.Found {
			res.Count = 1
		}
		v.g.del(bGroups, c.Group)
	case OpTrim:
		v.trim(c, &res)
	case OpPrepare:
		return res, v.prepare(c, &res)
	case OpCommitTx:
		return res, v.commitTx(c, &res)
	case OpRollbackTx:
		return res, v.rollbackTx(c, &res)
	case OpRelease:
		v.release(c, &res)
	case OpTxChecked:
		h, err := v.half(c.TxID)
		if err != nil || h == nil {
			return res, err
		}
		h.Checks++
		h.LastCheck = c.Now
		res.Count = h.Checks
		v.g.putWith(bHalf, c.TxID, func(dst []byte) []byte { return appendHalf(dst, h) })
	}
	return res, nil
}

// group returns the record of group name, with ok false when there is
// none; a damaged one is the command's ErrCorrupt.
func (v *view) group(name string) (GroupState, bool, error) {
	return decodeGroup(name, v.get(bGroups, name))
}

// putGroup stores g as the record of c's group and reports it in res.
func (v *view) putGroup(c *Command, g GroupState, res *Result) {
	v.g.putWith(bGroups, c.Group, func(dst []byte) []byte { return appendGroup(dst, c.Group, &g) })
	res.Offset, res.Generation = g.Offset, g.Generation
}

// commitOffset sets the offset of a group whose generation c carries, for
// every op but OpRenew, and its Updated time.
func (v *view) commitOffset(c *Command, res *Result) error {
	g, found, err := v.group(c.Group)
	if err != nil {
		return err
	}
	res.Found = found
	if c.Generation != g.Generation { // a group without a record is at 0
		res.Offset, res.Generation = g.Offset, g.Generation
		return fmt.Errorf("%w: commit to group %q with generation %d, the group is at %d",
			ErrStaleGeneration, c.Group, c.Generation, g.Generation)
	}
	if c.Op != OpRenew {
		g.Offset = c.Offset
	}
	g.Updated, g.Released = c.Now, c.Op == OpUnclaim
	v.putGroup(c, g, res)
	return nil
}

// claim gives c's group a new generation; a group without a record starts
// where c.Start says, from the state as this command finds it.
func (v *view) claim(c *Command, res *Result) error {
	g, found, err := v.group(c.Group)
	if err != nil {
		return err
	}
	res.Found = found
	if found && c.MaxAge > 0 && g.Leased(c.Now, c.MaxAge) && c.Generation != g.Generation {
		res.Offset, res.Generation = g.Offset, g.Generation
		return fmt.Errorf("%w: group %q, generation %d, changed %v before this claim (lease %v)",
			ErrClaimed, c.Group, g.Generation, time.Duration(c.Now-g.Updated), time.Duration(c.MaxAge))
	}
	if !found {
		switch c.Start {
		case StartFirst:
			g.Offset = v.g.st.Low
		case StartLast:
			g.Offset = v.g.st.Next
		default:
			g.Offset = c.Offset
			if f, ok, err := v.group(FenceRecord); err == nil && ok && c.Generation != 0 && c.Generation < f.Generation {
				// An owner from before the fence resumes where it was,
				// maybe in the tail given up: not past the fence's end.
				g.Offset = min(g.Offset, f.Offset)
			}
		}
	}
	return v.fence(c, g, res)
}

// fence stores g as the record of c's group with the partition's next
// generation, marked Reset when a reset took it. Generations are never reused: at the last one it refuses.
func (v *view) fence(c *Command, g GroupState, res *Result) error {
	st := &v.g.st
	if st.GroupGen == math.MaxUint64 {
		return fmt.Errorf("%w: op %d: the partition has handed out every group generation", ErrBadCommand, c.Op)
	}
	st.GroupGen++
	kept := g // a reset's: the owner's lease it keeps, if any
	g.Generation, g.Updated, g.Reset, g.Released, g.Lease = st.GroupGen, c.Now, c.Op == OpResetOffset, false, 0
	switch {
	case c.Op == OpClaim:
		g.Lease = c.MaxAge
	case kept.Lease > 0:
		g.Updated, g.Lease = kept.Updated, kept.Lease
	}
	v.putGroup(c, g, res)
	return nil
}

// fenceShift places the generations of OpFence at epoch e past e<<32:
// past every one a copy handed out under an earlier epoch's fence, or
// none, unless it made 2^32 claims since, so that no owner's generation
// from a copy given up matches one handed out here.
const fenceShift = 32

// maxFenceEpoch bounds OpFence's epoch, so that e<<fenceShift leaves room
// for generations.
const maxFenceEpoch = 1<<31 - 1

// fenceAll is OpFence: every intact group record is reset to its offset,
// or to the log's next offset when past it, under generations past the
// epoch's (fenceShift). It reads the file alone, as scans do.
func (v *view) fenceAll(c *Command, res *Result) error {
	var groups []GroupState
	var names []string
	_ = v.bucket(bGroups).ForEach(func(k, val []byte) error {
		if string(k) == FenceRecord {
			return nil
		}
		if g, ok, err := decodeGroup(string(k), val); err == nil && ok {
			groups, names = append(groups, g), append(names, string(k))
		}
		return nil
	})
	if v.g.st.GroupGen >= math.MaxUint64-uint64(len(groups))-1 {
		return fmt.Errorf("%w: op %d: the partition has handed out every group generation", ErrBadCommand, c.Op)
	}
	v.g.st.GroupGen = max(v.g.st.GroupGen, c.Offset<<fenceShift)
	for i, old := range groups {
		g := GroupState{Offset: min(old.Offset, v.g.st.Next)}
		if old.Leased(c.Now, 0) {
			g.Updated, g.Lease = old.Updated, old.Lease
		}
		reset := Command{Op: OpResetOffset, Now: c.Now, Group: names[i]}
		var r Result
		if err := v.fence(&reset, g, &r); err != nil {
			return err
		}
	}
	mark := Command{Op: OpResetOffset, Now: c.Now, Group: FenceRecord}
	var r Result
	if err := v.fence(&mark, GroupState{Offset: v.g.st.Next}, &r); err != nil {
		return err
	}
	res.Count = len(groups)
	return nil
}

// checkDedup fails, before anything is written, when the dedup entry of a
// message to be looked up is damaged.
func (v *view) checkDedup(msgs []Message) error {
	for i := range msgs {
		if id := msgs[i].ID; id != "" && !msgs[i].FreshID {
			if _, err := unseal(id, v.get(bDedup, id), dedupBytes); err != nil {
				return err
			}
		}
	}
	return nil
}

// dedup returns the dedup entry of id, checked by checkDedup, or nil.
func (v *view) dedup(id string) []byte {
	d, _ := unseal(id, v.get(bDedup, id), dedupBytes)
	return d
}

// append stores m: deduplicated by ID, held back when due later, else at the
// end of the log.
func (v *view) append(now int64, m Message, ack *Ack) {
	st := &v.g.st
	if m.ID != "" && !m.FreshID {
		if d := v.dedup(m.ID); d != nil {
			ack.Offset = be.Uint64(d)
			ack.Duplicate = true
			ack.Delayed = ack.Offset == noOffset
			return
		}
	}
	m.StoredAt = max(now, st.LastStored)
	st.LastStored = m.StoredAt
	if m.DeliverAt > now {
		st.DelaySeq++
		var k [16]byte
		be.PutUint64(k[:8], uint64(m.DeliverAt))
		be.PutUint64(k[8:], st.DelaySeq)
		v.g.op(bDelay, false, k[:])
		v.g.value(func(dst []byte) []byte { return appendRecord(dst, k[:], &m) })
		if !v.g.hasDue || m.DeliverAt < v.g.minDue {
			v.g.minDue, v.g.hasDue = m.DeliverAt, true
		}
		v.g.grew = true
		st.Delayed++
		ack.Delayed = true
		ack.Offset = noOffset
		v.putDedup(m.ID, noOffset, m.StoredAt)
		return
	}
	ack.Offset = v.appendLog(&m)
	v.putDedup(m.ID, ack.Offset, m.StoredAt)
}

func (v *view) appendLog(m *Message) uint64 {
	st := &v.g.st
	off := st.Next
	st.Bytes += int64(v.g.appendLog(off, m))
	st.Next++
	return off
}

// putDedup records that the message with ID id went to off at time at. An
// empty id records nothing.
func (v *view) putDedup(id string, off uint64, at int64) {
	if id == "" {
		return
	}
	var d [dedupBytes + sealLen]byte
	be.PutUint64(d[:8], off)
	be.PutUint64(d[8:], uint64(at))
	v.g.put(bDedup, id, appendSealed(d[:0], id, d[:dedupBytes]))
}

// consumed returns the lowest committed offset of the partition's groups: 0
// when it has none, or when a record is damaged, since its group may need
// all. It reads the file alone, as trim scans.
func (v *view) consumed() uint64 {
	low, found := uint64(math.MaxUint64), false
	err := v.bucket(bGroups).ForEach(func(k, val []byte) error {
		if string(k) == FenceRecord { // no group's
			return nil
		}
		g, ok, err := decodeGroup(string(k), val)
		if err != nil || !ok {
			return errDamagedGroup
		}
		low, found = min(low, g.Offset), true
		return nil
	})
	if err != nil || !found {
		return 0
	}
	return low
}

var errDamagedGroup = errors.New("damaged group record")

// trim deletes the head of the log by age, by size and, with Consumed, what
// every group has committed past, then prunes dedup entries and transaction
// decisions past their time to live. It runs on the file alone, as a scan.
//
// A damaged record does not fail the command, which would fail every
// command batched with it, sends included: it is deleted by size like any
// other, and by age when a later intact record is old enough, since
// StoredAt never decreases along the log. Its dedup entry is found by
// offset.
func (v *view) trim(c *Command, res *Result) {
	st := &v.g.st
	limit := c.Limit
	if limit == 0 {
		limit = defaultTrim
	}
	var consumed uint64 // every group has committed past the records below it
	if c.Consumed {
		consumed = v.consumed()
	}
	cur := v.bucket(bLog).Cursor()
	k, val := cur.First()
	for ; k != nil; k, val = cur.Next() {
		byBytes := c.MaxBytes > 0 && st.Bytes > c.MaxBytes
		byAge, byConsumed := false, false
		if !byBytes && (c.MaxAge > 0 || be.Uint64(k) < consumed) {
			stored, _, _ := v.recordInfo(k, val)
			byAge = c.MaxAge > 0 && stored < c.Now-c.MaxAge
			// A consumed record goes with its dedup entry, so only once
			// that entry has expired: a resend within the window is
			// still found.
			byConsumed = be.Uint64(k) < consumed && stored < c.Now-c.DedupTTL
		}
		if !byBytes && !byAge && !byConsumed {
			break
		}
		if res.Count >= limit {
			res.More = true
			break
		}
		v.deleteDedupOf(k, val)
		v.g.delBin(bLog, k)
		st.Bytes -= int64(len(val))
		st.Low = be.Uint64(k) + 1
		res.Count++
	}
	if k == nil {
		st.Low = st.Next
	}
	st.DedupLow = max(st.DedupLow, st.Low)
	if c.DedupTTL > 0 {
		v.pruneDedup(c, res, c.Now-c.DedupTTL, limit)
	}
	if c.DecideTTL > 0 {
		v.pruneDecisions(c.Now - c.DecideTTL)
	}
}

// recordInfo returns when the log record k, val was stored and its ID. For a
// record that fails its check, ok is false, the ID is unknown and stored is
// the StoredAt of the next intact record, than which the damaged one is no
// newer, or MaxInt64 when there is none.
func (v *view) recordInfo(k, val []byte) (stored int64, id string, ok bool) {
	if err := decodeRecord(k, val, &v.scratch); err == nil {
		return v.scratch.StoredAt, v.scratch.ID, true
	}
	cur := v.bucket(bLog).Cursor()
	cur.Seek(k)
	for k2, v2 := cur.Next(); k2 != nil; k2, v2 = cur.Next() {
		if decodeRecord(k2, v2, &v.scratch) == nil {
			return v.scratch.StoredAt, "", false
		}
	}
	return math.MaxInt64, "", false
}

// deleteDedupOf deletes the dedup entry of the log record k, val.
func (v *view) deleteDedupOf(k, val []byte) {
	off := be.Uint64(k)
	if off < v.g.st.DedupLow {
		return
	}
	if err := decodeRecord(k, val, &v.scratch); err != nil {
		v.deleteDedupAt(off)
		return
	}
	if v.scratch.ID != "" {
		v.g.del(bDedup, v.scratch.ID)
	}
}

// deleteDedupAt deletes the dedup entries pointing at offset off. It scans the
// whole index: it is only for a damaged record, whose ID cannot be read.
func (v *view) deleteDedupAt(off uint64) {
	_ = v.bucket(bDedup).ForEach(func(k, d []byte) error {
		if len(d) >= 8 && be.Uint64(d[:8]) == off { // damaged or not: its record is

			v.g.del(bDedup, string(k))
		}
		return nil
	})
}

// pruneDedup walks the log from DedupLow and drops the dedup entries of
// records stored before cutoff, at most limit of them, setting More when it
// stops there. Delayed messages' entries are replaced when the message is
// released and later pruned the same way.
func (v *view) pruneDedup(c *Command, res *Result, cutoff int64, limit int) {
	st := &v.g.st
	cur := v.bucket(bLog).Cursor()
	n := 0
	for k, val := cur.Seek(u64(st.DedupLow)); k != nil; k, val = cur.Next() {
		stored, id, ok := v.recordInfo(k, val)
		if stored >= cutoff {
			break
		}
		if n >= limit {
			res.More = true
			break
		}
		switch {
		case !ok:
			v.deleteDedupAt(be.Uint64(k))
		case id != "":
			v.g.del(bDedup, id)
		}
		st.DedupLow = be.Uint64(k) + 1
		n++
	}
}

func (v *view) pruneDecisions(cutoff int64) {
	_ = v.bucket(bTxs).ForEach(func(k, d []byte) error {
		if d, err := unseal(string(k), d, decisionBytes); err == nil && d != nil && int64(be.Uint64(d[1:])) < cutoff {
			v.g.del(bTxs, string(k))
		}
		return nil
	})
}

// decision returns the decision recorded for txid; a damaged one is the
// command's ErrCorrupt.
func (v *view) decision(txid string) (Decision, error) {
	d, err := unseal(txid, v.get(bTxs, txid), decisionBytes)
	if d == nil || err != nil {
		return Undecided, err
	}
	return Decision(d[0]), nil
}

func (v *view) decide(c *Command, d Decision) {
	v.g.putWith(bTxs, c.TxID, func(dst []byte) []byte {
		return appendSealed(dst, c.TxID, be.AppendUint64([]byte{byte(d)}, uint64(c.Now)))
	})
}

// half returns the half messages of txid, or nil.
func (v *view) half(txid string) (*halfTx, error) {
	b := v.get(bHalf, txid)
	if b == nil {
		return nil, nil
	}
	h, err := decodeHalf(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", txid, err)
	}
	return h, nil
}

func (v *view) prepare(c *Command, res *Result) error {
	if d, err := v.decision(c.TxID); err != nil || d != Undecided {
		if err != nil {
			return err
		}
		res.Previous = d
		return fmt.Errorf("%w: %s is %s", ErrDecided, c.TxID, d)
	}
	h, err := v.half(c.TxID)
	if err != nil {
		return err
	}
	if h == nil {
		h = &halfTx{Producer: c.Producer, FirstSeen: c.Now}
	} else if h.Producer != c.Producer {
		return fmt.Errorf("%w: %s is %q's, not %q's", ErrOtherProducer, c.TxID, h.Producer, c.Producer)
	}
	if n := v.cost(c); n > MaxCommandBytes {
		return fmt.Errorf("%w: the half messages of %s would take about %d bytes (max %d)", ErrTooLarge, c.TxID, n, MaxCommandBytes)
	}
	key := bytesOf(c.TxID)
	var recs []byte
	ends := make([]int, len(c.Msgs))
	for i := range c.Msgs {
		m := c.Msgs[i]
		m.FreshID = false
		recs = appendRecord(recs, key, &m)
		ends[i] = len(recs)
	}
	start := 0
	for _, end := range ends {
		h.Records = append(h.Records, recs[start:end:end])
		start = end
	}
	res.Count = len(c.Msgs)
	v.g.putWith(bHalf, c.TxID, func(dst []byte) []byte { return appendHalf(dst, h) })
	return nil
}

func (v *view) commitTx(c *Command, res *Result) error {
	if d, err := v.decision(c.TxID); err != nil || d != Undecided {
		res.Previous = d
		return err
	}
	h, err := v.half(c.TxID)
	if err != nil {
		return err
	}
	var halves []Message
	if h != nil {
		halves = make([]Message, len(h.Records))
		for i, r := range h.Records {
			if err := decodeRecord(bytesOf(c.TxID), r, &halves[i]); err != nil {
				return fmt.Errorf("half message %d of %s: %w", i, c.TxID, err)
			}
		}
	}
	if err := v.checkDedup(halves); err != nil {
		return err
	}
	if err := v.checkDedup(c.Msgs); err != nil {
		return err
	}
	if n := v.cost(c) + len(v.get(bHalf, c.TxID)); n > MaxCommandBytes {
		return fmt.Errorf("%w: commit of %s adds about %d bytes (max %d)", ErrTooLarge, c.TxID, n, MaxCommandBytes)
	}
	res.Acks = make([]Ack, len(halves)+len(c.Msgs))
	for i := range halves {
		v.append(c.Now, halves[i], &res.Acks[i])
	}
	for i := range c.Msgs {
		v.append(c.Now, c.Msgs[i], &res.Acks[len(halves)+i])
	}
	res.Count = len(res.Acks)
	if h != nil {
		v.g.del(bHalf, c.TxID)
	}
	v.decide(c, Committed)
	return nil
}

func (v *view) rollbackTx(c *Command, res *Result) error {
	if d, err := v.decision(c.TxID); err != nil || d != Undecided {
		res.Previous = d
		return err
	}
	h, err := v.half(c.TxID)
	if err != nil {
		return err
	}
	if h != nil {
		res.Count = len(h.Records)
		v.g.del(bHalf, c.TxID)
	}
	v.decide(c, RolledBack)
	return nil
}

// release moves due delayed messages into the log in key order: by due time,
// then by arrival, so messages of one key due together keep their order. It
// runs on the file alone, as a scan.
func (v *view) release(c *Command, res *Result) {
	st := &v.g.st
	limit := c.Limit
	if limit == 0 {
		limit = defaultLimit
	}
	cur := v.bucket(bDelay).Cursor()
	for k, val := cur.First(); k != nil; k, val = cur.Next() {
		if len(k) != 16 || int64(be.Uint64(k[:8])) > c.Now {
			break
		}
		if res.Count >= limit {
			res.More = true
			break
		}
		v.g.delBin(bDelay, k)
		v.g.delayDel = true
		st.Delayed--
		res.Count++
		if err := decodeRecord(k, val, &v.scratch); err != nil {
			// Failing would fail every command batched with this one, on
			// every try; dropping the record would lose a message silently.
			// It moves into the log as it is: its CRC covers its delay key,
			// so readers get ErrCorrupt at its offset.
			v.g.appendLogRaw(st.Next, val)
			st.Bytes += int64(len(val))
			st.Next++
			continue
		}
		m := v.scratch
		m.StoredAt = max(c.Now, st.LastStored)
		st.LastStored = m.StoredAt
		off := v.appendLog(&m)
		v.putDedup(m.ID, off, m.StoredAt)
	}
}

func u64(v uint64) []byte {
	b := make([]byte, 8)
	be.PutUint64(b, v)
	return b
}
