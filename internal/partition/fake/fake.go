// Package fake is an in-memory partition for fast tests of what drives
// partitions, such as the delivery engine. It applies every command of
// store/storetest's Partition with store.Partition's semantics, which
// running that suite against it checks, and adds test hooks: FailNext, and
// Pause and Resume.
//
// It starts no goroutines and keeps everything in memory: nothing outlives
// the Partition, so storetest.RunDurable does not apply to it.
package fake

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"

	"github.com/zeze-go/mq/store"
)

// Limits of store's commands that the store keeps unexported.
const (
	defaultRelease = 10_000        // OpRelease without Limit
	defaultTrim    = 100_000       // OpTrim without Limit
	maxOp          = store.OpRenew // the fake runs no freeze
	noOffset       = ^uint64(0)    // Ack.Offset of a delayed message
	crcLen         = 4             // a record's CRC32C
)

// Partition is an in-memory partition. It is safe for concurrent use;
// commands are applied one at a time, in the order they take its lock.
type Partition struct {
	done chan struct{} // closed by Close

	mu       sync.Mutex    // guards the fields below
	closed   bool          // Close was called
	changed  chan struct{} // closed, and replaced, when the log grows
	failNext error         // the next Apply's error, set by FailNext
	resume   chan struct{} // non-nil while paused; closed by Resume

	low, next  uint64 // the log holds [low, next)
	log        []record
	bytes      int64 // of the records in the log
	lastStored int64 // StoredAt never decreases along the log
	dedupLow   uint64
	delay      []delayed // by due time, then arrival
	delaySeq   uint64
	dedup      map[string]uint64 // message ID -> offset, or noOffset while delayed
	half       map[string]*halfTx
	txs        map[string]decided
	groups     map[string]store.GroupState
	generation uint64 // the last generation given out
}

// record is a stored message: its copy, which nothing modifies, and the
// bytes its record takes in a store.
type record struct {
	m    store.Message
	size int
}

type delayed struct {
	record
	seq uint64
}

type halfTx struct {
	producer  string
	firstSeen int64
	lastCheck int64
	checks    int
	msgs      []record
}

type decided struct {
	d  store.Decision
	at int64
}

// New returns an empty partition.
func New() *Partition {
	return &Partition{
		done:    make(chan struct{}),
		changed: make(chan struct{}),
		dedup:   map[string]uint64{},
		half:    map[string]*halfTx{},
		txs:     map[string]decided{},
		groups:  map[string]store.GroupState{},
	}
}

// FailNext makes the next Apply return err, changing nothing; nil cancels
// an earlier FailNext. An Apply refused before it reaches the partition,
// because its ctx ended or Close came first, leaves it pending.
func (p *Partition) FailNext(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failNext = err
}

// Pause makes Apply block until Resume, until its ctx ends, with ctx.Err(),
// or until Close, with store.ErrClosed. Reads go on.
func (p *Partition) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resume == nil {
		p.resume = make(chan struct{})
	}
}

// Resume lets the Applys blocked by Pause go on, in no set order.
func (p *Partition) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resume != nil {
		close(p.resume)
		p.resume = nil
	}
}

// Close makes every later call return store.ErrClosed and ends the calls
// blocked in Fetch and Apply with it. It is idempotent.
func (p *Partition) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.closed = true
		close(p.done)
	}
	return nil
}

// Apply applies cmd as store.Partition.Apply does and returns its result.
// It returns ctx.Err(), changing nothing, for a ctx that ended before, and
// blocks while the partition is paused.
func (p *Partition) Apply(ctx context.Context, cmd *store.Command) (store.Result, error) {
	if err := ctx.Err(); err != nil {
		return store.Result{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.resume != nil && !p.closed {
		resume := p.resume
		p.mu.Unlock()
		select {
		case <-resume:
		case <-p.done:
		case <-ctx.Done():
		}
		p.mu.Lock()
		if err := ctx.Err(); err != nil && !p.closed {
			return store.Result{}, err
		}
	}
	if p.closed {
		return store.Result{}, store.ErrClosed
	}
	if err := p.failNext; err != nil {
		p.failNext = nil
		return store.Result{}, err
	}
	next := p.next
	res, err := p.apply(cmd)
	if p.next != next {
		close(p.changed)
		p.changed = make(chan struct{})
	}
	return res, err
}

// apply runs c. An error is found before anything changes.
func (p *Partition) apply(c *store.Command) (res store.Result, err error) {
	sizes, err := check(c)
	if err != nil {
		return res, err
	}
	switch c.Op {
	case store.OpAppend:
		res.Acks = make([]store.Ack, len(c.Msgs))
		for i := range c.Msgs {
			p.append(c.Now, record{c.Msgs[i], sizes[i]}, &res.Acks[i])
		}
	case store.OpCommitOffset, store.OpUnclaim, store.OpRenew:
		g := p.groups[c.Group] // generation 0 without a record
		if c.Generation != g.Generation {
			return res, fmt.Errorf("%w: group %s is at generation %d, not %d", store.ErrStaleGeneration, c.Group, g.Generation, c.Generation)
		}
		if c.Op != store.OpRenew {
			g.Offset = c.Offset
		}
		g.Updated, g.Released = c.Now, c.Op == store.OpUnclaim
		p.groups[c.Group] = g
	case store.OpDeleteGroup:
		g, ok := p.groups[c.Group]
		res.Found = ok
		if ok && (c.MaxAge == 0 || g.Updated != 0 && g.Updated < c.Now-c.MaxAge) {
			delete(p.groups, c.Group)
			res.Count = 1
		}
	case store.OpClaim:
		g, ok := p.groups[c.Group]
		if ok && c.MaxAge > 0 && g.Leased(c.Now, c.MaxAge) && c.Generation != g.Generation {
			res.Offset, res.Generation = g.Offset, g.Generation
			return res, fmt.Errorf("%w: group %s at generation %d", store.ErrClaimed, c.Group, g.Generation)
		}
		if !ok {
			g.Offset = p.start(c)
		}
		res.Offset, res.Generation, res.Found = g.Offset, p.newGroup(c, g.Offset, false), ok
	case store.OpResetOffset:
		res.Offset, res.Generation = c.Offset, p.newGroup(c, c.Offset, true)
	case store.OpTrim:
		p.trim(c, &res)
	case store.OpPrepare:
		return res, p.prepare(c, sizes, &res)
	case store.OpCommitTx:
		p.commitTx(c, sizes, &res)
	case store.OpRollbackTx:
		p.rollbackTx(c, &res)
	case store.OpRelease:
		p.release(c, &res)
	case store.OpTxChecked:
		if h := p.half[c.TxID]; h != nil {
			h.checks++
			h.lastCheck = c.Now
			res.Count = h.checks
		}
	}
	return res, nil
}

// start is where c, an OpClaim, starts a group without a record.
func (p *Partition) start(c *store.Command) uint64 {
	switch c.Start {
	case store.StartFirst:
		return p.low
	case store.StartLast:
		return p.next
	}
	return c.Offset
}

// newGroup gives c.Group the record at offset under a new generation,
// taken by a reset or a claim.
func (p *Partition) newGroup(c *store.Command, offset uint64, reset bool) uint64 {
	p.generation++
	old := p.groups[c.Group]
	g := store.GroupState{Offset: offset, Generation: p.generation, Updated: c.Now, Reset: reset}
	switch {
	case c.Op == store.OpClaim:
		g.Lease = c.MaxAge
	case old.Leased(c.Now, 0): // a reset keeps the owner's lease, as the store's
		g.Updated, g.Lease = old.Updated, old.Lease
	}
	p.groups[c.Group] = g
	return p.generation
}

// check validates c as the store does and returns the record size of each
// of its messages.
func check(c *store.Command) ([]int, error) {
	bad := func(format string, args ...any) ([]int, error) {
		return nil, fmt.Errorf("%w: op %d: "+format, append([]any{store.ErrBadCommand, c.Op}, args...)...)
	}
	switch {
	case c.Op == 0 || c.Op > maxOp:
		return bad("unknown")
	case c.Now <= 0:
		return bad("Now %d (unix ns after 1970 required)", c.Now)
	case len(c.Group) > store.MaxKeyBytes || len(c.TxID) > store.MaxKeyBytes || len(c.Producer) > store.MaxKeyBytes:
		return bad("group, txid or producer over %d bytes", store.MaxKeyBytes)
	case c.Limit < 0 || c.MaxAge < 0 || c.MaxBytes < 0 || c.DedupTTL < 0 || c.DecideTTL < 0:
		return bad("negative limit")
	case c.Op == store.OpClaim && c.Start > store.StartLast:
		return bad("start %d", c.Start)
	}
	switch c.Op {
	case store.OpCommitOffset, store.OpUnclaim, store.OpRenew, store.OpDeleteGroup, store.OpClaim, store.OpResetOffset:
		if c.Group == "" {
			return bad("without group")
		}
	case store.OpPrepare, store.OpCommitTx, store.OpRollbackTx, store.OpTxChecked:
		if c.TxID == "" {
			return bad("without txid")
		}
	}
	switch c.Op {
	case store.OpAppend, store.OpPrepare, store.OpCommitTx:
	default:
		if len(c.Msgs) > 0 {
			return bad("with messages")
		}
	}
	sizes := make([]int, len(c.Msgs))
	total := 0
	for i := range c.Msgs {
		m := &c.Msgs[i]
		if len(m.ID) > store.MaxKeyBytes {
			return bad("message %d: ID of %d bytes (max %d)", i, len(m.ID), store.MaxKeyBytes)
		}
		if m.FreshID && m.ID == "" {
			return bad("message %d: FreshID without ID", i)
		}
		sizes[i] = recordLen(m)
		total += sizes[i] + len(m.ID)
	}
	if total > store.MaxCommandBytes { // the store's bound is a little stricter
		return nil, fmt.Errorf("%w: %d messages of about %d bytes", store.ErrTooLarge, len(c.Msgs), total)
	}
	return sizes, nil
}

// emptyCommand is the length of a command without messages in store's
// encoding.
var emptyCommand = len(store.AppendCommand(nil, &store.Command{}))

// recordLen returns the bytes m's record takes in a store's log, which its
// Stats.Bytes, OpTrim's MaxBytes and Read's maxBytes count: a CRC and the
// message's payload. The payload's length is read off store's command
// encoding, where a message is a uvarint length, the payload and a flags
// byte, and one message is counted in a byte as none is.
func recordLen(m *store.Message) int {
	n := len(store.AppendCommand(nil, &store.Command{Msgs: []store.Message{*m}})) - emptyCommand - 1
	for k := 1; k <= binary.MaxVarintLen64; k++ {
		if payload := n - k; payload >= 0 && len(binary.AppendUvarint(nil, uint64(payload))) == k {
			return crcLen + payload
		}
	}
	panic(fmt.Sprintf("fake: no payload length fits a message of %d encoded bytes", n))
}

// stored returns the copy of m the partition keeps: what a store's record
// decodes to.
func stored(m store.Message) store.Message {
	m.Tags = clip(m.Tags)
	if len(m.Properties) == 0 {
		m.Properties = nil
	}
	m.Properties = maps.Clone(m.Properties)
	m.Body = bytes.Clone(m.Body)
	m.Offset, m.FreshID = 0, false
	return m
}

func clip(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return slices.Clone(s)
}

// out returns the reader's copy of r at offset off.
func (r *record) out(off uint64) store.Message {
	m := r.m
	m.Tags = clip(m.Tags)
	m.Properties = maps.Clone(m.Properties)
	m.Body = bytes.Clone(m.Body)
	m.Offset = off
	return m
}

// append stores r's message: deduplicated by ID, held back when due after
// now, else at the end of the log.
func (p *Partition) append(now int64, r record, ack *store.Ack) {
	if r.m.ID != "" && !r.m.FreshID {
		if off, ok := p.dedup[r.m.ID]; ok {
			*ack = store.Ack{Offset: off, Delayed: off == noOffset, Duplicate: true}
			return
		}
	}
	r.m = stored(r.m)
	r.m.StoredAt = max(now, p.lastStored)
	p.lastStored = r.m.StoredAt
	if r.m.DeliverAt > now {
		p.delaySeq++
		due := r.m.DeliverAt
		i := sort.Search(len(p.delay), func(i int) bool { return p.delay[i].m.DeliverAt > due })
		p.delay = slices.Insert(p.delay, i, delayed{r, p.delaySeq})
		*ack = store.Ack{Offset: noOffset, Delayed: true}
		p.putDedup(r.m.ID, noOffset)
		return
	}
	ack.Offset = p.appendLog(r)
	p.putDedup(r.m.ID, ack.Offset)
}

func (p *Partition) appendLog(r record) uint64 {
	off := p.next
	p.log = append(p.log, r)
	p.bytes += int64(r.size)
	p.next++
	return off
}

func (p *Partition) putDedup(id string, off uint64) {
	if id != "" {
		p.dedup[id] = off
	}
}

// trim deletes the head of the log by age and size, then prunes dedup
// entries and decisions past their time to live, as the store does: a
// trimmed record takes its ID's entry with it, wherever that entry points.
func (p *Partition) trim(c *store.Command, res *store.Result) {
	limit := c.Limit
	if limit == 0 {
		limit = defaultTrim
	}
	n := 0
	for ; n < len(p.log); n++ {
		r := &p.log[n]
		byBytes := c.MaxBytes > 0 && p.bytes > c.MaxBytes
		byAge := !byBytes && c.MaxAge > 0 && r.m.StoredAt < c.Now-c.MaxAge
		if !byBytes && !byAge {
			break
		}
		if res.Count >= limit {
			res.More = true
			break
		}
		if p.low+uint64(n) >= p.dedupLow && r.m.ID != "" {
			delete(p.dedup, r.m.ID)
		}
		p.bytes -= int64(r.size)
		res.Count++
	}
	clear(p.log[:n])
	p.log = p.log[n:]
	p.low += uint64(n)
	p.dedupLow = max(p.dedupLow, p.low)
	if c.DedupTTL > 0 {
		p.pruneDedup(c.Now-c.DedupTTL, limit, res)
	}
	if c.DecideTTL > 0 {
		maps.DeleteFunc(p.txs, func(_ string, d decided) bool { return d.at < c.Now-c.DecideTTL })
	}
}

// pruneDedup drops the dedup entries of the log's records stored before
// cutoff, from dedupLow on, at most limit of them.
func (p *Partition) pruneDedup(cutoff int64, limit int, res *store.Result) {
	for n := 0; p.dedupLow < p.next; n++ {
		r := &p.log[p.dedupLow-p.low]
		if r.m.StoredAt >= cutoff {
			break
		}
		if n >= limit {
			res.More = true
			break
		}
		if r.m.ID != "" {
			delete(p.dedup, r.m.ID)
		}
		p.dedupLow++
	}
}

// release moves the delayed messages due at c.Now into the log, by due
// time, then arrival.
func (p *Partition) release(c *store.Command, res *store.Result) {
	limit := c.Limit
	if limit == 0 {
		limit = defaultRelease
	}
	for len(p.delay) > 0 && p.delay[0].m.DeliverAt <= c.Now {
		if res.Count >= limit {
			res.More = true
			break
		}
		r := p.delay[0].record
		p.delay[0] = delayed{}
		p.delay = p.delay[1:]
		res.Count++
		r.m.StoredAt = max(c.Now, p.lastStored)
		p.lastStored = r.m.StoredAt
		p.putDedup(r.m.ID, p.appendLog(r))
	}
}

func (p *Partition) prepare(c *store.Command, sizes []int, res *store.Result) error {
	if d, ok := p.txs[c.TxID]; ok {
		res.Previous = d.d
		return fmt.Errorf("%w: %s is %s", store.ErrDecided, c.TxID, d.d)
	}
	h := p.half[c.TxID]
	if h == nil {
		h = &halfTx{producer: c.Producer, firstSeen: c.Now}
		p.half[c.TxID] = h
	} else if h.producer != c.Producer {
		return fmt.Errorf("%w: %s is %q's, not %q's", store.ErrOtherProducer, c.TxID, h.producer, c.Producer)
	}
	for i := range c.Msgs {
		h.msgs = append(h.msgs, record{stored(c.Msgs[i]), sizes[i]})
	}
	res.Count = len(c.Msgs)
	return nil
}

func (p *Partition) commitTx(c *store.Command, sizes []int, res *store.Result) {
	if d, ok := p.txs[c.TxID]; ok {
		res.Previous = d.d
		return
	}
	var halves []record
	if h := p.half[c.TxID]; h != nil {
		halves = h.msgs
	}
	res.Acks = make([]store.Ack, len(halves)+len(c.Msgs))
	for i, r := range halves {
		p.append(c.Now, r, &res.Acks[i])
	}
	for i := range c.Msgs {
		p.append(c.Now, record{c.Msgs[i], sizes[i]}, &res.Acks[len(halves)+i])
	}
	res.Count = len(res.Acks)
	delete(p.half, c.TxID)
	p.txs[c.TxID] = decided{store.Committed, c.Now}
}

func (p *Partition) rollbackTx(c *store.Command, res *store.Result) {
	if d, ok := p.txs[c.TxID]; ok {
		res.Previous = d.d
		return
	}
	if h := p.half[c.TxID]; h != nil {
		res.Count = len(h.msgs)
		delete(p.half, c.TxID)
	}
	p.txs[c.TxID] = decided{store.RolledBack, c.Now}
}

// Fetch appends to dst the messages from offset from on, or from the first
// one kept when from is below it, at most limit of them and, past the
// first, at most maxBytes in all, no limit if 0, as store.Partition.Read
// does. When the log holds none at or after from it waits for one, for ctx
// to end, with ctx.Err(), or for Close, with store.ErrClosed.
func (p *Partition) Fetch(ctx context.Context, from uint64, limit, maxBytes int, dst []store.Message) ([]store.Message, error) {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return dst, store.ErrClosed
		}
		if limit <= 0 || max(from, p.low) < p.next {
			dst = p.read(from, limit, maxBytes, dst)
			p.mu.Unlock()
			return dst, nil
		}
		changed := p.changed
		p.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return dst, ctx.Err()
		case <-p.done:
			return dst, store.ErrClosed
		}
	}
}

// read is Read. p.mu is held.
func (p *Partition) read(from uint64, limit, maxBytes int, dst []store.Message) []store.Message {
	bytes := 0
	for off, n := max(from, p.low), 0; off < p.next && n < limit; off, n = off+1, n+1 {
		r := &p.log[off-p.low]
		if n > 0 && maxBytes > 0 && bytes+r.size > maxBytes {
			break
		}
		dst = append(dst, r.out(off))
		bytes += r.size
	}
	return dst
}

// Get returns the message at offset, or ok false if it is not in the log.
func (p *Partition) Get(offset uint64) (store.Message, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return store.Message{}, false, store.ErrClosed
	}
	if offset < p.low || offset >= p.next {
		return store.Message{}, false, nil
	}
	return p.log[offset-p.low].out(offset), true, nil
}

// Stats returns the partition's state.
func (p *Partition) Stats() store.Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return store.Stats{Low: p.low, Next: p.next, Bytes: p.bytes, Delayed: int64(len(p.delay)), LastStored: p.lastStored}
}

// Group returns group's record, or ok false for a group without one.
func (p *Partition) Group(name string) (store.GroupState, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return store.GroupState{}, false, store.ErrClosed
	}
	g, ok := p.groups[name]
	return g, ok, nil
}

// SeekTime returns the offset of the first message stored at or after t,
// in unix ns, or Next when there is none.
func (p *Partition) SeekTime(t int64) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, store.ErrClosed
	}
	return p.low + uint64(sort.Search(len(p.log), func(i int) bool { return p.log[i].m.StoredAt >= t })), nil
}

// NextDue returns the DeliverAt of the earliest delayed message, or ok
// false when none is waiting.
func (p *Partition) NextDue() (int64, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, false, store.ErrClosed
	}
	if len(p.delay) == 0 {
		return 0, false, nil
	}
	return p.delay[0].m.DeliverAt, true, nil
}

// HalfTxs calls fn for each undecided transaction with half messages here,
// in txid order, until fn returns false. fn runs without the partition's
// lock: it may call the partition.
func (p *Partition) HalfTxs(fn func(store.HalfTx) bool) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return store.ErrClosed
	}
	list := make([]store.HalfTx, 0, len(p.half))
	for _, txid := range slices.Sorted(maps.Keys(p.half)) {
		h := p.half[txid]
		list = append(list, store.HalfTx{TxID: txid, Producer: h.producer, FirstSeen: h.firstSeen,
			LastCheck: h.lastCheck, Checks: h.checks, Messages: len(h.msgs)})
	}
	p.mu.Unlock()
	for _, h := range list {
		if !fn(h) {
			break
		}
	}
	return nil
}

// Decision returns the recorded decision for txid: store.Undecided if
// there is none, or if it was pruned after its time to live.
func (p *Partition) Decision(txid string) (store.Decision, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return store.Undecided, store.ErrClosed
	}
	return p.txs[txid].d, nil
}
