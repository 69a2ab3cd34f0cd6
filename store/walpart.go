package store

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"
)

// With a WAL (Options.WAL) a partition numbers every command itself (Index,
// a per-partition sequence; meta's Applied is the highest one in the file).
// A run of plain appends (no message due later) takes the fast path: the
// writer computes the acks from the in-memory view (next offset, newest
// StoredAt, dedup: the IDs logged but not yet materialized, then the file's
// dedup index), logs the commands to the WAL and acknowledges them once the
// WAL's group fdatasync covers them. The partition's materializer then
// applies the logged commands to the bbolt file with the same apply code, in
// deep batches and with bbolt's normal fsync, and checks that they produce
// the acknowledged results. Any other command first waits until everything
// logged is materialized, then commits on the synchronous path. Reads wait
// until what was acknowledged when they start is materialized, so a reader
// sees its own acknowledged writes.
//
// After a crash, Open replays the partition's logged commands above Applied:
// apply is deterministic, so they land at the acknowledged offsets with the
// acknowledged dedup answers.

const (
	matMaxCmds  = 16384    // logged commands waiting to be materialized; the writer blocks beyond
	matMaxBytes = 64 << 20 // their bytes
	matMinCmds  = 4096     // materialize at once from this many waiting
	matDelay    = 50 * time.Millisecond
	// walMaxFastMsgs: a larger append already amortizes its bbolt commit
	// (and fsync) over its messages; logging it first would only write and
	// encode it twice, so it takes the synchronous path.
	walMaxFastMsgs = 16
)

// walStallEnv, when set, stops materialization (tests: a crash between the
// WAL's acknowledgement and materialization).
const walStallEnv = "ZEZE_MQ_TEST_STALL_MATERIALIZE"

var errDiverged = errors.New("store: materialized results differ from the acknowledged ones")

type matItem struct {
	idx     uint64
	payload []byte // the command part of the WAL record
	acks    []Ack  // what was acknowledged; nil on replay
	seg     uint64 // WAL segment holding it; 0 on replay
	at      time.Time
}

// ackedView is the log as acknowledged, materialized or not: Stats reports
// it while it is ahead of the file.
type ackedView struct {
	idx   uint64 // the last acknowledged command
	next  uint64
	last  int64
	bytes int64
}

// readBarrier waits for materialization when a read of offsets [from, to)
// would miss acknowledged messages.
func (p *Partition) readBarrier(from, to uint64) {
	if p.wal == nil {
		return
	}
	if to < from {
		to = ^uint64(0)
	}
	p.mu.Lock()
	need := p.av.idx > p.st.Applied && to > p.st.Next && from < p.av.next
	p.mu.Unlock()
	if need {
		p.barrier()
	}
}

type ovEntry struct {
	off uint64
	idx uint64
}

// fastOK reports whether c can take the WAL fast path: a plain append, a
// group offset change (which reads nothing, so its result is known), or the
// commit of a transaction with no half messages here (an outbox publication:
// its result depends only on the dedup index and the recorded decision,
// both of which the fast path tracks). Half messages are only ever added by
// OpPrepare on the synchronous path, so the file is authoritative for them.
func (p *Partition) fastOK(c *Command) bool {
	if walGroupOp(c.Op) {
		return c.Group != "" && len(c.Msgs) == 0
	}
	if (c.Op != OpAppend && c.Op != OpCommitTx) || len(c.Msgs) > walMaxFastMsgs {
		return false
	}
	if c.Op == OpCommitTx && (c.TxID == "" || p.hasHalf(c.TxID)) {
		return false
	}
	for i := range c.Msgs {
		if c.Msgs[i].DeliverAt > c.Now {
			return false
		}
	}
	return true
}

// hasHalf reports whether the file holds half messages of txid (or cannot
// tell: then the synchronous path decides).
func (p *Partition) hasHalf(txid string) bool {
	found := true
	_ = p.db.View(func(tx *bolt.Tx) error {
		found = tx.Bucket(bucketHalf).Get([]byte(txid)) != nil
		return nil
	})
	return found
}

// process runs batch on the WAL paths, in order.
func (p *Partition) process(batch []*request) {
	if p.wal == nil {
		p.commit(batch)
		return
	}
	for i := 0; i < len(batch); {
		j := i
		for j < len(batch) && p.fastOK(batch[j].cmd) {
			j++
		}
		if j > i {
			p.fast(batch[i:j])
			i = j
			continue
		}
		for j < len(batch) && !p.fastOK(batch[j].cmd) {
			j++
		}
		if err := p.drain(); err != nil {
			fail(batch[i:j], err)
		} else {
			for _, r := range batch[i:j] {
				r.cmd.Index = p.nextIdx
				p.nextIdx++
			}
			p.commit(batch[i:j])
			p.mu.Lock()
			p.vNext, p.vLast, p.vBytes = p.st.Next, p.st.LastStored, p.st.Bytes
			p.mu.Unlock()
		}
		i = j
	}
}

func fail(reqs []*request, err error) {
	for _, r := range reqs {
		r.err = err
		r.done <- struct{}{}
	}
}

// drain waits until every logged command is materialized.
func (p *Partition) drain() error {
	p.mmu.Lock()
	defer p.mmu.Unlock()
	for p.matIdx < p.submitted && p.mErr == nil {
		p.kick = true
		p.wakeMat()
		p.mcond.Wait()
	}
	return p.mErr
}

// barrier waits until what was acknowledged so far is materialized.
func (p *Partition) barrier() {
	if p.wal == nil {
		return
	}
	p.mmu.Lock()
	defer p.mmu.Unlock()
	target := p.acked
	for p.matIdx < target && p.mErr == nil && !p.mDone {
		p.kick = true
		p.wakeMat()
		p.mcond.Wait()
	}
}

// wakeMat wakes the materializer; p.mmu is held.
func (p *Partition) wakeMat() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// fast acknowledges run (plain appends) from the in-memory view once the WAL
// has synced them, and queues them for materialization.
func (p *Partition) fast(run []*request) {
	p.mmu.Lock()
	for (p.mPending >= matMaxCmds || p.mBytes >= matMaxBytes) && p.mErr == nil {
		p.kick = true
		p.wakeMat()
		p.mcond.Wait()
	}
	if err := p.mErr; err != nil {
		p.mmu.Unlock()
		fail(run, err)
		return
	}
	hits := p.hits
	clear(hits)
	var miss []string
	decided := map[string]Decision{} // commits of this run and of logged commands
	var txMiss []string
	for _, r := range run {
		if r.cmd.Op == OpCommitTx {
			if _, ok := p.txDone[r.cmd.TxID]; ok {
				decided[r.cmd.TxID] = Committed
			} else {
				txMiss = append(txMiss, r.cmd.TxID)
			}
		}
		for i := range r.cmd.Msgs {
			id := r.cmd.Msgs[i].ID
			if id == "" || r.cmd.Msgs[i].NewID {
				continue
			}
			if e, ok := p.overlay[id]; ok {
				hits[id] = Ack{Offset: e.off, Duplicate: true}
			} else {
				miss = append(miss, id)
			}
		}
	}
	p.mmu.Unlock()
	// The overlay loses an ID only after the materializer committed it, so
	// a view begun after the overlay check sees every ID the overlay missed.
	if len(miss) > 0 || len(txMiss) > 0 {
		err := p.db.View(func(tx *bolt.Tx) error {
			b := tx.Bucket(bucketDedup)
			for _, id := range miss {
				if v := b.Get([]byte(id)); len(v) == 16 {
					off := be.Uint64(v)
					hits[id] = Ack{Offset: off, Duplicate: true, Delayed: off == noOffset}
				}
			}
			txs := tx.Bucket(bucketTxs)
			for _, txid := range txMiss {
				if v := txs.Get([]byte(txid)); len(v) == 9 {
					decided[txid] = Decision(v[0])
				}
			}
			return nil
		})
		if err != nil {
			fail(run, err)
			return
		}
	}
	type newID struct {
		id  string
		off uint64
		idx uint64
	}
	var news []newID
	var commits []newID // txids committed by this run
	items := make([]matItem, len(run))
	p.walEnc.reset()
	payloads := make([][]byte, len(run))
	total := 0
	for k, r := range run {
		c := r.cmd
		c.Count, c.More, c.Previous = 0, false, Undecided
		c.Acks = resize(c.Acks, len(c.Msgs))
		idx := p.nextIdx
		p.nextIdx++
		c.Index = idx
		start := p.walEnc.buf.Len()
		encodeWALHeader(p.walEnc, p.name, idx, c)
		if c.Op == OpCommitTx {
			if d := decided[c.TxID]; d != Undecided {
				// A late repeat: apply will change nothing and report d.
				c.Previous = d
				c.Acks = c.Acks[:0]
				for i := range c.Msgs {
					_ = encodeMessage(p.walEnc.enc, &c.Msgs[i])
				}
				encodeWALTrailer(p.walEnc, c)
				payloads[k] = p.walEnc.buf.Bytes()[start:]
				total += len(payloads[k]) + walFrameLen
				items[k] = matItem{idx: idx}
				continue
			}
			decided[c.TxID] = Committed
			commits = append(commits, newID{id: c.TxID, idx: idx})
			c.Count = len(c.Msgs)
		}
		for i := range c.Msgs {
			m := &c.Msgs[i]
			if m.ID != "" {
				if a, ok := hits[m.ID]; ok {
					c.Acks[i] = a
					_ = encodeMessage(p.walEnc.enc, m)
					continue
				}
			}
			stored := max(c.Now, p.vLast)
			m.StoredAt = stored
			p.vLast = stored
			c.Acks[i] = Ack{Offset: p.vNext}
			if m.ID != "" {
				hits[m.ID] = Ack{Offset: p.vNext, Duplicate: true}
				news = append(news, newID{m.ID, p.vNext, idx})
			}
			p.vNext++
			n := p.walEnc.buf.Len()
			_ = encodeMessage(p.walEnc.enc, m)
			p.vBytes += int64(crcLen + p.walEnc.buf.Len() - n) // the log record's size
		}
		encodeWALTrailer(p.walEnc, c)
		payloads[k] = p.walEnc.buf.Bytes()[start:]
		total += len(payloads[k]) + walFrameLen
		items[k] = matItem{idx: idx, acks: append([]Ack(nil), c.Acks...)}
	}
	view := ackedView{idx: items[len(items)-1].idx, next: p.vNext, last: p.vLast, bytes: p.vBytes}
	buf := make([]byte, 0, total)
	for k, pl := range payloads {
		buf = appendWALFrame(buf, pl)
		// the command part: after the frame, name length, name and index
		items[k].payload = buf[len(buf)-len(pl)+2+len(p.name)+8:]
	}
	p.walEnc.reset()
	last := items[len(items)-1].idx
	p.submitted = last
	p.mmu.Lock()
	for _, n := range news {
		p.overlay[n.id] = ovEntry{off: n.off, idx: n.idx}
	}
	for _, n := range commits {
		p.txDone[n.id] = n.idx
	}
	p.mPending += len(items)
	for _, it := range items {
		p.mBytes += len(it.payload)
	}
	p.mmu.Unlock()
	reqs := append([]*request(nil), run...)
	p.wal.append(buf, len(items), func(seg uint64, err error) {
		p.logged(reqs, items, view, seg, err)
	})
}

// logged runs on the WAL's writer once items are synced (or failed).
func (p *Partition) logged(reqs []*request, items []matItem, view ackedView, seg uint64, err error) {
	p.mmu.Lock()
	if err != nil {
		if p.mErr == nil {
			p.mErr = err
		}
		p.mcond.Broadcast()
		p.wakeMat()
		p.mmu.Unlock()
		fail(reqs, err)
		return
	}
	now := time.Now()
	for i := range items {
		items[i].seg = seg
		items[i].at = now
	}
	p.mq = append(p.mq, items...)
	p.acked = items[len(items)-1].idx
	if len(p.mq) >= matMinCmds || len(p.mq) == len(items) {
		p.wakeMat()
	}
	p.mmu.Unlock()
	p.mu.Lock()
	p.av = view
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
	for _, r := range reqs {
		r.err = nil
		r.done <- struct{}{}
	}
}

// materializer applies logged commands to the file in deep batches: when
// matMinCmds are waiting, when the oldest has waited matDelay, or at once
// when a reader, a synchronous command or Close asks (kick).
func (p *Partition) materializer() {
	defer p.wg.Done()
	stall := os.Getenv(walStallEnv) != ""
	for {
		p.mmu.Lock()
		n := len(p.mq)
		stop := p.mStop
		if n == 0 || (stall && !stop) {
			// Stopping, it exits once all the writer logged is materialized.
			if stop && (p.matIdx >= p.submitted || p.mErr != nil) {
				p.mDone = true
				p.mcond.Broadcast()
				p.mmu.Unlock()
				return
			}
			p.mmu.Unlock()
			<-p.wake
			continue
		}
		wait := matDelay - time.Since(p.mq[0].at)
		if !p.kick && !stop && n < matMinCmds && wait > 0 {
			p.mmu.Unlock()
			t := time.NewTimer(wait)
			select {
			case <-p.wake:
			case <-t.C:
			}
			t.Stop()
			p.mmu.Lock()
			if !p.kick && !p.mStop && len(p.mq) < matMinCmds && time.Since(p.mq[0].at) < matDelay {
				p.mmu.Unlock()
				continue
			}
		}
		items := p.mq
		p.mq = nil
		p.kick = false
		p.mmu.Unlock()
		if err := p.materialize(items); err != nil {
			p.mmu.Lock()
			if p.mErr == nil {
				p.mErr = err
			}
			p.mDone = true
			p.mcond.Broadcast()
			p.mmu.Unlock()
			return
		}
	}
}

// materialize applies items in one bbolt transaction (normal fsync), then
// releases their IDs from the overlay and their records from the WAL.
func (p *Partition) materialize(items []matItem) error {
	cmds := make([]*Command, len(items))
	for i, it := range items {
		c, err := decodeWALCommand(it.idx, it.payload)
		if err != nil {
			return err
		}
		cmds[i] = c
	}
	err := p.update(p.matEnc, len(items), func(w *writeTx) error {
		for i, c := range cmds {
			if c.Index <= w.st.Applied {
				continue
			}
			if err := w.apply(c); err != nil {
				return err
			}
			if want := items[i].acks; want != nil && !slices.Equal(want, c.Acks) {
				return fmt.Errorf("%w: index %d: %+v, acknowledged %+v", errDiverged, c.Index, c.Acks, want)
			}
			w.st.Applied = c.Index
		}
		return nil
	})
	if err != nil {
		return err
	}
	last := items[len(items)-1].idx
	segs := map[uint64]int{}
	p.mmu.Lock()
	for i, c := range cmds {
		for j := range c.Msgs {
			if id := c.Msgs[j].ID; id != "" {
				if e, ok := p.overlay[id]; ok && e.idx <= last {
					delete(p.overlay, id)
				}
			}
		}
		if c.Op == OpCommitTx {
			if idx, ok := p.txDone[c.TxID]; ok && idx <= last {
				delete(p.txDone, c.TxID)
			}
		}
		if items[i].seg != 0 {
			segs[items[i].seg]++
		}
	}
	if last > p.matIdx {
		p.matIdx = last
	}
	p.mPending -= len(items)
	for _, it := range items {
		p.mBytes -= len(it.payload)
	}
	if p.mPending <= 0 {
		p.mPending, p.mBytes = 0, 0
	}
	p.mcond.Broadcast()
	p.mmu.Unlock()
	for s, n := range segs {
		p.wal.release(s, n)
	}
	return nil
}

// replay applies the partition's records left in the WAL by the previous run
// above Applied, in batches, before the writer starts.
func (p *Partition) replay() error {
	recs := p.wal.recovered(p.name)
	var items []matItem
	flush := func() error {
		if len(items) == 0 {
			return nil
		}
		err := p.materialize(items)
		items = items[:0]
		return err
	}
	for _, r := range recs {
		if r.Index <= p.st.Applied {
			continue
		}
		items = append(items, matItem{idx: r.Index, payload: r.Payload})
		if len(items) == maxBatchCmds {
			if err := flush(); err != nil {
				return fmt.Errorf("store: %s: replay: %w", p.path, err)
			}
		}
	}
	if err := flush(); err != nil {
		return fmt.Errorf("store: %s: replay: %w", p.path, err)
	}
	p.mmu.Lock()
	p.matIdx, p.acked, p.submitted = 0, 0, 0
	p.mPending, p.mBytes = 0, 0
	p.mmu.Unlock()
	p.nextIdx = p.st.Applied + 1
	p.vNext, p.vLast, p.vBytes = p.st.Next, p.st.LastStored, p.st.Bytes
	return nil
}

// stopMaterializer, called by the writer as it exits, lets the materializer
// apply what is logged and waits for it. The WAL must still be open: the
// writer's last appends are acknowledged by it.
func (p *Partition) stopMaterializer() {
	if p.wal == nil {
		return
	}
	p.mmu.Lock()
	defer p.mmu.Unlock()
	p.mStop = true
	p.wakeMat()
	for !p.mDone {
		p.mcond.Wait()
	}
}

// closeErr is the sticky error that stopped the WAL path, if any.
func (p *Partition) closeErr() error {
	if p.wal == nil {
		return nil
	}
	p.mmu.Lock()
	defer p.mmu.Unlock()
	return p.mErr
}
