package mq

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/internal/wire"
	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/store"
)

// Transactional messages (DESIGN.md section 5).
//
// PrepareMessage stores half messages under the host transaction's id and
// writes a marker into the host transaction; CommitMessage writes the
// messages themselves into the host transaction (an outbox). Both register
// hooks on the transaction: after its commit, the half messages and the
// outbox messages of each partition become visible in one OpCommitTx; after
// a rollback, the half messages are discarded. A commit that failed without
// the host learning its outcome (localtx's WhileUnknown) decides nothing:
// the check-back and the sweep read it from the host store later. Once
// every partition's decision is durable, the marker and outbox rows are
// forgotten (in batches, in the background).
//
// A crash between the host's commit and the queue's is repaired from the
// host store: at start and every sweep the node commits the transactions
// whose marker is still present (the outbox rides along), and the check-back
// asks the host store about half messages left undecided after TxCheckAfter.
// Decisions are recorded per partition and the first one wins, so every
// repair may run twice.
//
// A partition's decision on a transaction is what makes a repeat of the
// commit change nothing, so it must outlive every host marker of the
// transaction: the upkeep prunes decisions only as pruneGuard allows, which
// is never one a marker may still need.
//
// Lock order: txNode.mu before openTx.mu (never both held at once in
// practice), and txNode.mu before pruneGuard.mu.

// LocalTx is the host's local transaction as the queue sees it; see
// package localtx for the contract and the bbolt and database/sql adapters.
type LocalTx = localtx.Tx

// TxDecision is an operator's decision on a parked transaction, and what
// ResolveTx reports as the decision that stands.
type TxDecision int

// Decisions.
const (
	// TxUndecided: the node knows no decision (nor half messages) of the
	// transaction.
	TxUndecided TxDecision = iota
	// TxCommit delivers the transaction's messages.
	TxCommit
	// TxRollback discards them.
	TxRollback
)

func (d TxDecision) String() string {
	switch d {
	case TxCommit:
		return "commit"
	case TxRollback:
		return "rollback"
	}
	return "undecided"
}

// TopicPartition names one partition of one topic.
type TopicPartition struct {
	Topic     string
	Partition int
}

// UnresolvedTx is a parked transaction: its half messages got no answer
// from the check-back TxMaxChecks times. It stays until ResolveTx decides
// it or its own commit or rollback finally arrives.
type UnresolvedTx struct {
	TxID       string
	Partitions []TopicPartition // where its half messages are, sorted
	Messages   int              // half messages in all
	FirstSeen  time.Time        // when its first half message was stored
	Age        time.Duration    // since FirstSeen
	Checks     int              // check-backs without an answer (the most of its partitions)
}

// txConfig holds the transaction settings of a node and, once the node is
// open, its transaction state.
type txConfig struct {
	checkAfter time.Duration
	maxChecks  int
	stores     []localtx.Store
	// testHook, set only by tests (export_test.go), is called at the named
	// points of a transaction's life: "sent" (PrepareMessage or
	// CommitMessage is about to return), "local-committed" (commit hook
	// entered), "partition-committing" (one partition's OpCommitTx is about
	// to be applied), "partition-committed" (it is durable).
	testHook func(point, txid string)

	prune *pruneGuard // read by the upkeep (maintenance.go) from the start
	node  *txNode     // set by startTxChecker
}

func defaultTxConfig() txConfig {
	return txConfig{checkAfter: 6 * time.Second, maxChecks: 15, prune: &pruneGuard{held: map[string]txHold{}}}
}

// WithTxCheckAfter sets how long half messages may stay undecided before
// the node asks the host store about their transaction (the check-back);
// later checks back off from there (doubling, at most a minute apart unless
// d is longer). Default 6s.
func WithTxCheckAfter(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: tx check after %v", ErrInvalidOption, d)
		}
		c.tx.checkAfter = d
		return nil
	}
}

// WithTxMaxChecks sets how many check-backs may answer "still running"
// before the transaction is parked: listed by UnresolvedTxs, checked no
// more, and left for ResolveTx. Default 15.
func WithTxMaxChecks(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("%w: tx max checks %d", ErrInvalidOption, n)
		}
		c.tx.maxChecks = n
		return nil
	}
}

// WithLocalTx gives the node the host store whose transactions send
// messages (a *localtx.Bolt or *localtx.SQL), for the check-back and to
// publish, at start, the messages of transactions that committed just
// before a crash. Give every such store, once each; a store used by a
// transaction is also learned for the rest of the run. Without it, half
// messages left by a crash are parked for the operator.
func WithLocalTx(s localtx.Store) Option {
	return func(c *config) error {
		if s == nil {
			return fmt.Errorf("%w: nil local tx store", ErrInvalidOption)
		}
		c.tx.stores = append(c.tx.stores, s)
		return nil
	}
}

// partRef names a partition in a transaction's plan.
type partRef struct {
	Topic string
	Part  int
}

// txNode is a node's transaction state.
type txNode struct {
	m *MQ

	mu     sync.Mutex         // guards open and stores
	open   map[string]*openTx // transactions of this process that sent, until their hooks end
	stores []localtx.Store    // configured, then learned from transactions

	forgets chan forgetReq // to the forgetter
}

// openTx is what the node knows of a transaction that sent messages.
type openTx struct {
	id    string
	store localtx.Store // the transaction's own store; nil if it does not say

	mu     sync.Mutex // guards the fields below
	halves []partRef  // partitions holding half messages, in first-use order
	outbox map[partRef][]store.Message
	seq    uint64 // next outbox row
	marked int    // len(halves) when the marker was last written; -1: never
}

type forgetReq struct {
	store localtx.Store
	txid  string
	at    time.Time // when the decision was acknowledged
}

// txPlan is what committing a transaction does: per partition, the outbox
// messages to publish with the half messages (nil when only halves).
type txPlan map[partRef][]store.Message

// startTxChecker starts the check-back of half messages left undecided and
// the sweep of the host stores' markers (one goroutine), and the forgetter
// that cleans markers once decisions are durable (another).
func (m *MQ) startTxChecker() {
	n := &txNode{
		m:       m,
		open:    map[string]*openTx{},
		stores:  append([]localtx.Store(nil), m.cfg.tx.stores...),
		forgets: make(chan forgetReq, 4096),
	}
	m.cfg.tx.node = n
	m.goFunc(n.checkLoop)
	m.goFunc(n.forgetter)
}

func (m *MQ) txn() *txNode { return m.cfg.tx.node }

// hook calls the test hook, if a test set one.
func (n *txNode) hook(point, txid string) {
	if h := n.m.cfg.tx.testHook; h != nil {
		h(point, txid)
	}
}

// PrepareMessage stores msgs as half messages of the host transaction
// carried by ctx (see package localtx): durable, invisible to consumers.
// They become visible when that transaction commits, together with its
// CommitMessage messages and in commit order, and are discarded when it
// rolls back or is redone. It may be called many times in one transaction,
// for any partitions and topics. It returns when the half messages are
// durable or ctx ends.
//
// It returns ErrNotInTransaction when ctx carries no transaction, and the
// errors of SendMessage. After an error the transaction should roll back: if
// it commits anyway, whatever half messages were stored are delivered.
// PrepareMessage fills ID, Topic, PartitionIndex and Timestamp like
// SendMessage; Offset is -1 (offsets are given at commit).
func (p *Producer) PrepareMessage(ctx context.Context, msgs ...*Message) error {
	tx, ok := localtx.FromContext(ctx)
	if !ok {
		return ErrNotInTransaction
	}
	ot, parts, err := p.beginTx(tx, msgs)
	if err != nil || len(msgs) == 0 {
		return err
	}
	now := p.m.cfg.clock.Now()
	byPart := map[int][]store.Message{}
	var order []int
	for _, m := range msgs {
		if m.Timestamp.IsZero() {
			m.Timestamp = now
		}
		m.Offset = -1
		if _, ok := byPart[m.PartitionIndex]; !ok {
			order = append(order, m.PartitionIndex)
		}
		byPart[m.PartitionIndex] = append(byPart[m.PartitionIndex], toStore(m))
	}
	// The marker first: whatever partition may hold halves is in it when
	// the transaction commits.
	ot.mu.Lock()
	for _, i := range order {
		ot.addHalf(partRef{Topic: p.topic, Part: i})
	}
	ot.mu.Unlock()
	if err := ot.writeMarker(tx); err != nil {
		return err
	}
	err = forEachPart(order, func(i int) error {
		cmd := &store.Command{Op: store.OpPrepare, Now: now.UnixNano(), TxID: ot.id, Producer: txProducer, Msgs: byPart[i]}
		if _, err := parts[i].Apply(ctx, cmd); err != nil {
			return fmt.Errorf("prepare to %s/%d: %w", p.topic, i, translate(err))
		}
		return nil
	})
	if err != nil {
		return err
	}
	p.m.txn().hook("sent", ot.id)
	return nil
}

// CommitMessage writes msgs into the host transaction carried by ctx (an
// outbox, see package localtx) and publishes them when that transaction
// commits, together with its half messages and in commit order; a rollback
// or a redo discards them with the rest of the transaction. It costs no
// round trip to the queue before the commit. It returns
// ErrNotInTransaction when ctx carries no transaction, the errors of
// SendMessage's checks, and the host store's write errors.
// CommitMessage fills ID, Topic, PartitionIndex and Timestamp like
// SendMessage; Offset is -1.
func (p *Producer) CommitMessage(ctx context.Context, msgs ...*Message) error {
	tx, ok := localtx.FromContext(ctx)
	if !ok {
		return ErrNotInTransaction
	}
	ot, _, err := p.beginTx(tx, msgs)
	if err != nil || len(msgs) == 0 {
		return err
	}
	now := p.m.cfg.clock.Now()
	ot.mu.Lock()
	first := ot.seq
	ot.seq += uint64(len(msgs))
	ot.mu.Unlock()
	if err := ot.writeMarker(tx); err != nil {
		return err
	}
	sms := make([]store.Message, len(msgs))
	for i, m := range msgs {
		if m.Timestamp.IsZero() {
			m.Timestamp = now
		}
		m.Offset = -1
		sms[i] = toStore(m)
		row := encodeOutboxRow(partRef{Topic: p.topic, Part: m.PartitionIndex}, &sms[i])
		if err := tx.Put(localtx.OutboxBucket, localtx.OutboxKey(ot.id, first+uint64(i)), row); err != nil {
			return fmt.Errorf("mq: outbox of %s: %w", ot.id, err)
		}
	}
	ot.mu.Lock()
	for i, m := range msgs {
		ref := partRef{Topic: p.topic, Part: m.PartitionIndex}
		ot.outbox[ref] = append(ot.outbox[ref], sms[i])
	}
	ot.mu.Unlock()
	p.m.txn().hook("sent", ot.id)
	return nil
}

// txProducer is recorded as the producer of half messages. A standalone
// node checks back all of them; a cluster will name its nodes.
const txProducer = "local"

// beginTx checks and routes msgs and binds the producer's node to tx.
func (p *Producer) beginTx(tx localtx.Tx, msgs []*Message) (*openTx, []partition.Partition, error) {
	if p.closed.Load() {
		return nil, nil, ErrClosed
	}
	_, parts, err := p.m.router.partitions(p.topic)
	if err != nil {
		return nil, nil, err
	}
	if err := p.route(msgs, len(parts)); err != nil {
		return nil, nil, err
	}
	ot, err := p.m.txn().bind(tx)
	return ot, parts, err
}

// bind returns the node's state of tx, registering the commit and rollback
// hooks on first use.
func (n *txNode) bind(tx localtx.Tx) (*openTx, error) {
	id := tx.ID()
	if id == "" || len(id) > 128 {
		return nil, fmt.Errorf("mq: bad transaction id %q", id)
	}
	for i := 0; i < len(id); i++ {
		if id[i] == 0 {
			return nil, fmt.Errorf("mq: bad transaction id %q", id)
		}
	}
	n.mu.Lock()
	ot := n.open[id]
	if ot != nil {
		n.mu.Unlock()
		return ot, nil
	}
	ot = &openTx{id: id, outbox: map[partRef][]store.Message{}, marked: -1}
	if s, ok := tx.(interface{ Store() localtx.Store }); ok {
		ot.store = s.Store()
		n.learn(ot.store)
	}
	n.open[id] = ot
	n.mu.Unlock()
	tx.WhileCommit(func() { n.committed(ot) })
	tx.WhileRollback(func() { n.rolledBack(ot) })
	if u, ok := tx.(interface{ WhileUnknown(func()) }); ok {
		u.WhileUnknown(func() { n.unknown(ot) })
	}
	return ot, nil
}

// learn adds s to the stores asked by the check-back. n.mu is held.
func (n *txNode) learn(s localtx.Store) {
	for _, x := range n.stores {
		if x == s {
			return
		}
	}
	n.stores = append(n.stores, s)
	n.m.cfg.tx.prune.learned() // its old markers are unknown until swept
}

func (n *txNode) isOpen(txid string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.open[txid] != nil
}

func (n *txNode) storeList() []localtx.Store {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]localtx.Store(nil), n.stores...)
}

// addHalf records that ref holds half messages. ot.mu is held.
func (ot *openTx) addHalf(ref partRef) {
	for _, h := range ot.halves {
		if h == ref {
			return
		}
	}
	ot.halves = append(ot.halves, ref)
}

// writeMarker writes the transaction's marker when it is missing or its list
// of half partitions grew.
func (ot *openTx) writeMarker(tx localtx.Tx) error {
	ot.mu.Lock()
	if ot.marked == len(ot.halves) {
		ot.mu.Unlock()
		return nil
	}
	halves := len(ot.halves)
	v := encodeMarker(ot.halves)
	ot.mu.Unlock()
	if err := tx.Put(localtx.MarkerBucket, []byte(ot.id), v); err != nil {
		return fmt.Errorf("mq: marker of %s: %w", ot.id, err)
	}
	ot.mu.Lock()
	if halves > ot.marked {
		ot.marked = halves
	}
	ot.mu.Unlock()
	return nil
}

// committed is the WhileCommit hook: it publishes the transaction.
func (n *txNode) committed(ot *openTx) {
	n.hook("local-committed", ot.id)
	ot.mu.Lock()
	plan := txPlan{}
	for _, h := range ot.halves {
		plan[h] = nil
	}
	for ref, msgs := range ot.outbox {
		plan[ref] = msgs
	}
	ot.mu.Unlock()
	// The transaction is of this run: any decision it has is this commit's
	// or one whose own hold is older.
	now := n.m.cfg.tx.prune.hold(ot.id, n.m.cfg.clock, decidedFromNow)
	_, err := n.commit(n.m.ctx, ot.id, plan, now)
	n.mu.Lock()
	delete(n.open, ot.id)
	n.mu.Unlock()
	if err != nil {
		n.m.cfg.logger.Warn("transaction committed by the host but not yet by the queue; the check-back or the next sweep will",
			"tx", ot.id, "err", err)
		return
	}
	n.forgetLater(ot.store, ot.id)
}

// rolledBack is the WhileRollback hook: it discards the half messages.
func (n *txNode) rolledBack(ot *openTx) {
	ot.mu.Lock()
	halves := append([]partRef(nil), ot.halves...)
	ot.mu.Unlock()
	_, err := n.rollback(n.m.ctx, ot.id, halves)
	n.mu.Lock()
	delete(n.open, ot.id)
	n.mu.Unlock()
	if err != nil {
		n.m.cfg.logger.Warn("transaction rolled back by the host but not yet by the queue; the check-back will",
			"tx", ot.id, "err", err)
	}
}

// unknown is the WhileUnknown hook: the host's commit failed and its
// outcome could not be read. Nothing is decided: the half messages wait for
// the check-back and the outbox rows for the sweep, which read the outcome
// from the host store (marker present: committed).
func (n *txNode) unknown(ot *openTx) {
	n.mu.Lock()
	delete(n.open, ot.id)
	n.mu.Unlock()
	n.m.cfg.logger.Warn("the host's commit failed and its outcome is unknown; the check-back and the sweep will read it from the host store",
		"tx", ot.id)
}

// commit publishes txid in every partition of plan, in parallel, at now
// (the time its decisions record), and returns the decision that stands:
// TxCommit, or TxRollback when an earlier rollback won in some partition
// (reported in the log). Its callers hold txid in the pruneGuard first,
// which gives now.
func (n *txNode) commit(ctx context.Context, txid string, plan txPlan, now time.Time) (TxDecision, error) {
	refs := make([]partRef, 0, len(plan))
	for ref := range plan {
		refs = append(refs, ref)
	}
	var (
		mu       sync.Mutex
		standing = TxCommit
	)
	err := forEachPart(refs, func(ref partRef) error {
		part, err := n.partition(ref)
		if err != nil {
			return err
		}
		cmd := &store.Command{Op: store.OpCommitTx, Now: now.UnixNano(), TxID: txid, Msgs: plan[ref]}
		n.hook("partition-committing", txid)
		res, err := part.Apply(ctx, cmd)
		if err != nil {
			return fmt.Errorf("commit %s in %s/%d: %w", txid, ref.Topic, ref.Part, translate(err))
		}
		if res.Previous == store.RolledBack {
			n.m.cfg.logger.Error("commit arrived after a rollback and changed nothing",
				"tx", txid, "topic", ref.Topic, "partition", ref.Part)
			mu.Lock()
			standing = TxRollback
			mu.Unlock()
		}
		n.hook("partition-committed", txid)
		return nil
	})
	return standing, err
}

// rollback discards the half messages of txid in refs and returns the
// decision that stands: TxRollback, or TxCommit when an earlier commit won.
func (n *txNode) rollback(ctx context.Context, txid string, refs []partRef) (TxDecision, error) {
	var (
		mu       sync.Mutex
		standing = TxRollback
	)
	err := forEachPart(refs, func(ref partRef) error {
		part, err := n.partition(ref)
		if err != nil {
			return err
		}
		cmd := &store.Command{Op: store.OpRollbackTx, Now: n.m.cfg.clock.Now().UnixNano(), TxID: txid}
		res, err := part.Apply(ctx, cmd)
		if err != nil {
			return fmt.Errorf("rollback %s in %s/%d: %w", txid, ref.Topic, ref.Part, translate(err))
		}
		if res.Previous == store.Committed {
			n.m.cfg.logger.Error("rollback arrived after a commit and changed nothing",
				"tx", txid, "topic", ref.Topic, "partition", ref.Part)
			mu.Lock()
			standing = TxCommit
			mu.Unlock()
		}
		return nil
	})
	return standing, err
}

func (n *txNode) partition(ref partRef) (partition.Partition, error) {
	_, parts, err := n.m.router.partitions(ref.Topic)
	if err != nil {
		return nil, err
	}
	if ref.Part < 0 || ref.Part >= len(parts) {
		return nil, fmt.Errorf("%w: %s/%d", ErrInvalidPartition, ref.Topic, ref.Part)
	}
	return parts[ref.Part], nil
}

// planOf decodes a host store's record into what committing it does.
func planOf(rec localtx.Record) (txPlan, error) {
	halves, err := decodeMarker(rec.TxID, rec.Marker)
	if err != nil {
		return nil, err
	}
	plan := txPlan{}
	for _, h := range halves {
		plan[h] = nil
	}
	for _, b := range rec.Outbox {
		ref, msg, err := decodeOutboxRow(rec.TxID, b)
		if err != nil {
			return nil, err
		}
		plan[ref] = append(plan[ref], msg)
	}
	return plan, nil
}

// The marker and outbox rows the node writes through LocalTx.Put live in the
// host's store, maybe longer than this build: each starts with a magic and
// a version. Version 2 is this layout, where n is a uvarint, str a uvarint
// length and that many bytes, and i64 8 bytes big-endian:
//
//	marker:     "ZMQM" 2 count:n {topic:str partition:n}...
//	            (the partitions holding half messages)
//	outbox row: "ZMQO" 2 topic:str partition:n id:str key:str
//	            tags:n {tag:str}... properties:n {key:str value:str}...
//	            body:str timestamp:i64 deliverAt:i64
//
// with properties in key order. Version 1 rows, written before the magic,
// are msgpack arrays whose first element is 1 (markerV1, outboxRowV1); they
// are still read. Anything else is ErrCorrupt.
const (
	txMarkerMagic = "ZMQM"
	txOutboxMagic = "ZMQO"
	txFormat      = 2 // the version written
	txFormatV1    = 1 // msgpack arrays, read only
)

func encodeMarker(halves []partRef) []byte {
	b := append([]byte(txMarkerMagic), txFormat)
	b = binary.AppendUvarint(b, uint64(len(halves)))
	for _, h := range halves {
		b = appendStr(b, h.Topic)
		b = binary.AppendUvarint(b, uint64(h.Part))
	}
	return b
}

func encodeOutboxRow(ref partRef, m *store.Message) []byte {
	b := append([]byte(txOutboxMagic), txFormat)
	b = appendStr(b, ref.Topic)
	b = binary.AppendUvarint(b, uint64(ref.Part))
	b = appendStr(b, m.ID)
	b = appendStr(b, m.Key)
	b = binary.AppendUvarint(b, uint64(len(m.Tags)))
	for _, t := range m.Tags {
		b = appendStr(b, t)
	}
	b = binary.AppendUvarint(b, uint64(len(m.Properties)))
	for _, k := range slices.Sorted(maps.Keys(m.Properties)) {
		b = appendStr(b, k)
		b = appendStr(b, m.Properties[k])
	}
	b = binary.AppendUvarint(b, uint64(len(m.Body)))
	b = append(b, m.Body...)
	b = binary.BigEndian.AppendUint64(b, uint64(m.Timestamp))
	return binary.BigEndian.AppendUint64(b, uint64(m.DeliverAt))
}

func appendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// markerV1 and outboxRowV1 are the version 1 rows.
type markerV1 struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	V        int
	Halves   []partRefV1
}

type partRefV1 struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Topic    string
	Part     int
}

type outboxRowV1 struct {
	_msgpack   struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	V          int
	Topic      string
	Part       int
	ID         string
	Key        string
	Tags       []string
	Properties map[string]string
	Body       []byte
	Timestamp  int64
	DeliverAt  int64
}

// decodeMarker returns the partitions listed by the marker b of txid.
func decodeMarker(txid string, b []byte) ([]partRef, error) {
	what := "marker of " + txid
	r, err := openRow(what, txMarkerMagic, b)
	if err != nil {
		return nil, err
	}
	if r == nil {
		var mk markerV1
		if err := decodeV1(what, b, &mk, &mk.V); err != nil {
			return nil, err
		}
		halves := make([]partRef, len(mk.Halves))
		for i, h := range mk.Halves {
			if h.Part < 0 {
				return nil, fmt.Errorf("%w: %s: partition %d", ErrCorrupt, what, h.Part)
			}
			halves[i] = partRef{Topic: h.Topic, Part: h.Part}
		}
		return halves, nil
	}
	halves := make([]partRef, r.count())
	for i := range halves {
		halves[i].Topic = r.str()
		halves[i].Part = r.part()
	}
	return halves, r.end(what)
}

// decodeOutboxRow returns the partition and message of the outbox row b of
// txid.
func decodeOutboxRow(txid string, b []byte) (partRef, store.Message, error) {
	what := "outbox of " + txid
	r, err := openRow(what, txOutboxMagic, b)
	if err != nil {
		return partRef{}, store.Message{}, err
	}
	if r == nil {
		var o outboxRowV1
		if err := decodeV1(what, b, &o, &o.V); err != nil {
			return partRef{}, store.Message{}, err
		}
		if o.Part < 0 {
			return partRef{}, store.Message{}, fmt.Errorf("%w: %s: partition %d", ErrCorrupt, what, o.Part)
		}
		m := store.Message{ID: o.ID, Key: o.Key, Timestamp: o.Timestamp, DeliverAt: o.DeliverAt}
		if len(o.Tags) > 0 {
			m.Tags = o.Tags
		}
		if len(o.Properties) > 0 {
			m.Properties = o.Properties
		}
		if len(o.Body) > 0 {
			m.Body = o.Body
		}
		return partRef{Topic: o.Topic, Part: o.Part}, m, nil
	}
	var (
		ref partRef
		m   store.Message
	)
	ref.Topic = r.str()
	ref.Part = r.part()
	m.ID = r.str()
	m.Key = r.str()
	if n := r.count(); n > 0 {
		m.Tags = make([]string, n)
		for i := range m.Tags {
			m.Tags[i] = r.str()
		}
	}
	if n := r.count(); n > 0 {
		m.Properties = make(map[string]string, n)
		for range n {
			k := r.str()
			m.Properties[k] = r.str()
		}
	}
	if body := r.bytes(); len(body) > 0 {
		m.Body = bytes.Clone(body)
	}
	m.Timestamp = r.int64()
	m.DeliverAt = r.int64()
	return ref, m, r.end(what)
}

// openRow checks the magic and version of row b, named what in errors. It
// returns a reader of the fields of a version 2 row, or nil for a row
// without the magic, which may be of version 1.
func openRow(what, magic string, b []byte) (*rowReader, error) {
	rest, ok := bytes.CutPrefix(b, []byte(magic))
	if !ok {
		return nil, nil
	}
	if len(rest) == 0 {
		return nil, fmt.Errorf("%w: %s: no format version after the magic", ErrCorrupt, what)
	}
	if rest[0] != txFormat {
		return nil, unknownFormat(what, int(rest[0]))
	}
	return &rowReader{b: rest[1:]}, nil
}

// decodeV1 decodes the version 1 row b into v, whose version field is ver.
func decodeV1(what string, b []byte, v any, ver *int) error {
	if err := wire.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: %s: neither magic nor a version 1 row: %v", ErrCorrupt, what, err)
	}
	if *ver != txFormatV1 {
		return unknownFormat(what, *ver)
	}
	return nil
}

func unknownFormat(what string, v int) error {
	return fmt.Errorf("%w: %s: format version %d, this build reads %d and %d", ErrCorrupt, what, v, txFormatV1, txFormat)
}

// rowReader reads the fields of a version 2 row. The first error sticks and
// later reads return zero values.
type rowReader struct {
	b   []byte
	err error
}

func (r *rowReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf(format, args...)
	}
	r.b = nil
}

func (r *rowReader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("truncated or overlong number")
		return 0
	}
	r.b = r.b[n:]
	return v
}

// count reads a number of items, each at least one byte long.
func (r *rowReader) count() int {
	n := r.uvarint()
	if n > uint64(len(r.b)) {
		r.fail("%d items in %d bytes", n, len(r.b))
		return 0
	}
	return int(n)
}

func (r *rowReader) part() int {
	p := r.uvarint()
	if p > math.MaxInt32 {
		r.fail("partition %d", p)
		return 0
	}
	return int(p)
}

func (r *rowReader) bytes() []byte {
	n := r.uvarint()
	if n > uint64(len(r.b)) {
		r.fail("%d bytes wanted, %d left", n, len(r.b))
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func (r *rowReader) str() string { return string(r.bytes()) }

func (r *rowReader) int64() int64 {
	if len(r.b) < 8 {
		r.fail("truncated number")
		return 0
	}
	v := int64(binary.BigEndian.Uint64(r.b))
	r.b = r.b[8:]
	return v
}

// end reports the first error, or bytes left after the last field.
func (r *rowReader) end(what string) error {
	if r.err == nil && len(r.b) > 0 {
		r.err = fmt.Errorf("%d bytes after the last field", len(r.b))
	}
	if r.err != nil {
		return fmt.Errorf("%w: %s: %v", ErrCorrupt, what, r.err)
	}
	return nil
}

// forgetLater queues the clean-up of txid's marker and outbox rows, once
// the queue's decision is durable. When the queue is full the marker stays:
// the next sweep finds the transaction decided and forgets it then.
func (n *txNode) forgetLater(s localtx.Store, txid string) {
	select {
	case n.forgets <- forgetReq{store: s, txid: txid, at: time.Now()}:
	default:
	}
}

// forgetter cleans markers in batches: one host transaction for everything
// queued within forgetLinger, so the clean-up adds little to each
// transaction's cost. With WithSyncInterval a decision is acknowledged
// before it is on disk, so its marker is kept two sync intervals longer: a
// power loss must not take the decision while the marker is gone.
func (n *txNode) forgetter(ctx context.Context) {
	const (
		forgetLinger = 50 * time.Millisecond
		forgetBatch  = 1024
	)
	hold := 2 * n.m.cfg.syncInterval
	linger := max(forgetLinger, hold)
	var pending []forgetReq
	// flush forgets what was queued at least hold ago and keeps the rest.
	flush := func(ctx context.Context) {
		cutoff := time.Now().Add(-hold)
		ready := map[localtx.Store][]string{}
		kept := pending[:0]
		for _, r := range pending {
			if r.at.After(cutoff) {
				kept = append(kept, r)
				continue
			}
			ready[r.store] = append(ready[r.store], r.txid)
		}
		pending = kept
		for s, ids := range ready {
			stores := []localtx.Store{s}
			if s == nil { // a transaction that named no store: try them all
				stores = n.storeList()
			}
			forgot := true
			for _, st := range stores {
				if err := st.Forget(ctx, ids); err != nil {
					n.m.cfg.logger.Warn("cannot forget transaction markers; the sweep will", "err", err)
					forgot = false
				}
			}
			if forgot {
				n.m.cfg.tx.prune.release(ids)
			}
		}
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	armed := false
	for {
		select {
		case r := <-n.forgets:
			pending = append(pending, r)
			if len(pending) >= forgetBatch && hold == 0 {
				flush(ctx)
			}
		case <-timer.C:
			armed = false
			flush(ctx)
		case <-ctx.Done():
			for {
				select {
				case r := <-n.forgets:
					pending = append(pending, r)
					continue
				default:
				}
				break
			}
			fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			flush(fctx) // what is not yet durable stays for the next start's sweep
			cancel()
			return
		}
		if len(pending) > 0 && !armed {
			timer.Reset(linger)
			armed = true
		}
	}
}

// checkLoop sweeps the host stores at start and every few check periods,
// and checks back undecided half messages in between.
func (n *txNode) checkLoop(ctx context.Context) {
	clk := n.m.cfg.clock
	every := min(max(n.m.cfg.tx.checkAfter/4, time.Millisecond), time.Second)
	sweepEvery := 5 * n.m.cfg.tx.checkAfter
	n.sweep(ctx)
	lastSweep := clk.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-clk.After(every):
		}
		n.checkBack(ctx)
		if now := clk.Now(); now.Sub(lastSweep) >= sweepEvery {
			n.sweep(ctx)
			lastSweep = now
		}
	}
}

// sweep commits the transactions whose marker is still in a host store (a
// crash came between the host's commit and the queue's, or the clean-up
// did not happen yet) and forgets them. Every marker it lists is held in
// the pruneGuard: its decision may be from an earlier run, of unknown age.
// A sweep that listed every store tells the guard which markers are gone.
func (n *txNode) sweep(ctx context.Context) {
	const page = 256
	guard := n.m.cfg.tx.prune
	start := guard.sweepStart()
	listed := map[string]bool{}
	complete := true
	for _, s := range n.storeList() {
		after := ""
		for {
			if ctx.Err() != nil {
				return
			}
			recs, err := s.Committed(ctx, after, page)
			if err != nil {
				if ctx.Err() == nil {
					n.m.cfg.logger.Warn("cannot list committed transactions", "err", err)
				}
				complete = false
				break
			}
			for _, rec := range recs {
				after = rec.TxID
				listed[rec.TxID] = true
				if n.isOpen(rec.TxID) { // its commit hook is on it
					continue
				}
				now := guard.hold(rec.TxID, n.m.cfg.clock, decidedAnyTime)
				if n.publish(ctx, rec, now) {
					n.forgetLater(s, rec.TxID)
				}
			}
			if len(recs) < page {
				break
			}
		}
	}
	if complete {
		guard.swept(start, listed)
	}
}

// publish commits, at now, a committed transaction found in a host store
// and reports whether its marker may be forgotten.
func (n *txNode) publish(ctx context.Context, rec localtx.Record, now time.Time) bool {
	plan, err := planOf(rec)
	if err != nil {
		n.m.cfg.logger.Error("cannot read a committed transaction's marker; left in place", "tx", rec.TxID, "err", err)
		return false
	}
	if _, err := n.commit(ctx, rec.TxID, plan, now); err != nil {
		if ctx.Err() == nil {
			n.m.cfg.logger.Warn("cannot publish a committed transaction yet", "tx", rec.TxID, "err", err)
		}
		return false
	}
	return true
}

// halfInfo gathers the half messages of one transaction across partitions.
// The transaction's check count is the highest of its partitions' (a
// partition whose prepare landed after a check lags behind).
type halfInfo struct {
	parts     []partRef
	checks    []int // per part
	messages  int
	firstSeen int64
	lastCheck int64
	maxChecks int
}

// halves scans every partition's undecided transactions.
func (n *txNode) halves() (map[string]*halfInfo, error) {
	out := map[string]*halfInfo{}
	for name := range n.m.Topics() {
		_, parts, err := n.m.router.partitions(name)
		if err != nil {
			continue // closed or gone
		}
		for i, part := range parts {
			err := part.HalfTxs(func(h store.HalfTx) bool {
				hi := out[h.TxID]
				if hi == nil {
					hi = &halfInfo{firstSeen: h.FirstSeen}
					out[h.TxID] = hi
				}
				hi.parts = append(hi.parts, partRef{Topic: name, Part: i})
				hi.checks = append(hi.checks, h.Checks)
				hi.messages += h.Messages
				hi.firstSeen = min(hi.firstSeen, h.FirstSeen)
				hi.lastCheck = max(hi.lastCheck, h.LastCheck)
				hi.maxChecks = max(hi.maxChecks, h.Checks)
				return true
			})
			if err != nil {
				return nil, fmt.Errorf("half messages of %s/%d: %w", name, i, translate(err))
			}
		}
	}
	return out, nil
}

// due says whether the transaction, not yet parked, waited long enough for
// its next check-back.
func (n *txNode) due(hi *halfInfo) bool {
	cfg := n.m.cfg.tx
	if hi.maxChecks >= cfg.maxChecks {
		return false
	}
	now := n.m.cfg.clock.Now().UnixNano()
	if now-hi.firstSeen < int64(cfg.checkAfter) {
		return false
	}
	if hi.maxChecks == 0 {
		return true
	}
	wait := max(cfg.checkAfter, time.Minute)
	if hi.maxChecks-1 < 32 {
		wait = min(cfg.checkAfter<<(hi.maxChecks-1), wait)
	}
	return now-hi.lastCheck >= int64(wait)
}

// checkBack asks the host stores about the transactions whose half messages
// are due, and commits, rolls back or counts an unanswered check.
func (n *txNode) checkBack(ctx context.Context) {
	all, err := n.halves()
	if err != nil {
		if ctx.Err() == nil {
			n.m.cfg.logger.Warn("check-back cannot list half messages", "err", err)
		}
		return
	}
	for txid, hi := range all {
		if ctx.Err() != nil {
			return
		}
		if n.due(hi) {
			n.checkOne(ctx, txid, hi)
		}
	}
}

func (n *txNode) checkOne(ctx context.Context, txid string, hi *halfInfo) {
	log := n.m.cfg.logger
	st, rec, owner := n.ask(ctx, txid)
	switch st {
	case localtx.Committed:
		plan, err := planOf(rec)
		if err != nil {
			log.Error("check-back cannot read the marker", "tx", txid, "err", err)
			return
		}
		for _, p := range hi.parts {
			if _, ok := plan[p]; !ok {
				plan[p] = nil
			}
		}
		now := n.m.cfg.tx.prune.hold(txid, n.m.cfg.clock, decidedAnyTime)
		if _, err := n.commit(ctx, txid, plan, now); err != nil {
			log.Warn("check-back commit failed", "tx", txid, "err", err)
			return
		}
		log.Info("check-back committed a transaction", "tx", txid)
		n.forgetLater(owner, txid)
	case localtx.RolledBack:
		if _, err := n.rollback(ctx, txid, hi.parts); err != nil {
			log.Warn("check-back rollback failed", "tx", txid, "err", err)
			return
		}
		log.Info("check-back rolled back a transaction", "tx", txid)
	default:
		// Count the check on the partitions at the transaction's count, so
		// the count grows by one per unanswered check.
		checks := 0
		for i, ref := range hi.parts {
			if hi.checks[i] < hi.maxChecks {
				continue
			}
			part, err := n.partition(ref)
			if err != nil {
				continue
			}
			cmd := &store.Command{Op: store.OpTxChecked, Now: n.m.cfg.clock.Now().UnixNano(), TxID: txid}
			res, err := part.Apply(ctx, cmd)
			if err != nil {
				return
			}
			checks = max(checks, res.Count)
		}
		if checks >= n.m.cfg.tx.maxChecks {
			log.Warn("transaction parked: no answer from the check-back; decide it with ResolveTx",
				"tx", txid, "checks", checks)
		}
	}
}

// ask asks every host store about txid: committed if one has its marker,
// unknown if one says it is running or cannot answer (or none is known),
// rolled back otherwise. It returns the store that answered committed.
func (n *txNode) ask(ctx context.Context, txid string) (localtx.State, localtx.Record, localtx.Store) {
	stores := n.storeList()
	if len(stores) == 0 {
		return localtx.Unknown, localtx.Record{}, nil
	}
	answer := localtx.RolledBack
	for _, s := range stores {
		st, rec, err := s.Check(ctx, txid)
		if err != nil {
			n.m.cfg.logger.Warn("check-back failed", "tx", txid, "err", err)
			st = localtx.Unknown
		}
		switch st {
		case localtx.Committed:
			return st, rec, s
		case localtx.Unknown:
			answer = localtx.Unknown
		}
	}
	return answer, localtx.Record{}, nil
}

// pruneGuard keeps transaction decisions from being pruned while a host
// marker may still need them: a sweep that finds a marker whose decision is
// gone publishes the transaction again. It holds every committed
// transaction whose marker may remain, until a Forget of the marker
// succeeds or a sweep that started later no longer lists it, and allows no
// pruning at all until a sweep has listed every host store since Open (and
// since the last store was learned). It is safe for concurrent use.
type pruneGuard struct {
	mu    sync.Mutex        // guards the fields below
	held  map[string]txHold // txid -> hold
	seq   uint64            // of the last hold
	epoch uint64            // stores learned
	whole bool              // a sweep listed every store of the current epoch
}

// txHold is a held transaction: its decisions are no older than since
// (unix ns; 0: of unknown age). seq orders it against sweeps.
type txHold struct {
	since int64
	seq   uint64
}

// decidedAge says what a commit knows of the transaction's earlier
// decisions, if any.
type decidedAge int

const (
	// decidedFromNow: none predates the hold (a transaction of this run,
	// committed by its own hook).
	decidedFromNow decidedAge = iota
	// decidedAnyTime: one may be of any age (found in a host store).
	decidedAnyTime
)

// hold holds txid before the node commits it and returns the time the
// commit records, read under the lock: an upkeep that computed its cutoff
// before saw a clock no later than it. A transaction held already keeps
// its age: it has been held since before any decision of this run, and it
// had none before unless that hold says so.
func (g *pruneGuard) hold(txid string, clk Clock, age decidedAge) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := clk.Now()
	g.seq++
	h, ok := g.held[txid]
	switch {
	case ok:
	case age == decidedFromNow:
		h.since = now.UnixNano()
	default:
		h.since = 0
	}
	h.seq = g.seq
	g.held[txid] = h
	return now
}

// release lets go of txids: their markers were forgotten.
func (g *pruneGuard) release(txids []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, id := range txids {
		delete(g.held, id)
	}
}

// learned notes a host store new to the node: its markers are unknown.
func (g *pruneGuard) learned() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.epoch++
	g.whole = false
}

// sweepToken is what a sweep's start tells swept.
type sweepToken struct{ seq, epoch uint64 }

func (g *pruneGuard) sweepStart() sweepToken {
	g.mu.Lock()
	defer g.mu.Unlock()
	return sweepToken{seq: g.seq, epoch: g.epoch}
}

// swept takes the listing of a sweep that listed every store: a hold older
// than the sweep whose marker was not listed is gone (a marker exists from
// the host's commit, before its hold, until a Forget).
func (g *pruneGuard) swept(t sweepToken, listed map[string]bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for id, h := range g.held {
		if h.seq <= t.seq && !listed[id] {
			delete(g.held, id)
		}
	}
	if t.epoch == g.epoch {
		g.whole = true
	}
}

// decideTTL returns the DecideTTL of an OpTrim at now: ttl, or more while
// a held transaction's decisions are older than now-ttl, or 0 (prune none)
// while one is of unknown age or no sweep has listed every store yet.
func (g *pruneGuard) decideTTL(now time.Time, ttl time.Duration) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.whole {
		return 0
	}
	cutoff := now.UnixNano() - int64(ttl)
	for _, h := range g.held {
		if h.since == 0 {
			return 0
		}
		cutoff = min(cutoff, h.since)
	}
	return time.Duration(now.UnixNano() - cutoff)
}

// UnresolvedTxs lists the parked transactions: those whose check-back found
// no answer TxMaxChecks times (see WithTxMaxChecks), oldest first. It
// returns ErrClosed after Close.
func (m *MQ) UnresolvedTxs() ([]UnresolvedTx, error) {
	if err := m.txClosed(); err != nil {
		return nil, err
	}
	all, err := m.txn().halves()
	if err != nil {
		return nil, err
	}
	now := m.cfg.clock.Now()
	var out []UnresolvedTx
	for txid, hi := range all {
		if hi.maxChecks < m.cfg.tx.maxChecks {
			continue
		}
		u := UnresolvedTx{TxID: txid, Messages: hi.messages, Checks: hi.maxChecks, FirstSeen: time.Unix(0, hi.firstSeen)}
		u.Age = now.Sub(u.FirstSeen)
		for _, p := range hi.parts {
			u.Partitions = append(u.Partitions, TopicPartition{Topic: p.Topic, Partition: p.Part})
		}
		sort.Slice(u.Partitions, func(i, j int) bool {
			a, b := u.Partitions[i], u.Partitions[j]
			return a.Topic < b.Topic || a.Topic == b.Topic && a.Partition < b.Partition
		})
		out = append(out, u)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].FirstSeen.Before(out[j].FirstSeen) || out[i].FirstSeen.Equal(out[j].FirstSeen) && out[i].TxID < out[j].TxID
	})
	return out, nil
}

// ResolveTx is the operator's decision on transaction txid, normally a
// parked one (see UnresolvedTxs): TxCommit delivers its half messages (and
// the outbox rows its host store still holds), TxRollback discards them. The
// first decision wins: ResolveTx returns the decision that stands, which
// differs from d when the transaction had been decided otherwise before, and
// is TxUndecided when the node knows nothing of txid. TxCommit first reads
// the transaction's rows from the host stores: when a store cannot answer,
// or a row cannot be read (ErrCorrupt, naming it), ResolveTx returns the
// error and decides nothing. It returns when the decision is durable or ctx
// ends, and ErrClosed after Close.
func (m *MQ) ResolveTx(ctx context.Context, txid string, d TxDecision) (TxDecision, error) {
	if d != TxCommit && d != TxRollback {
		return TxUndecided, fmt.Errorf("%w: decision %v", ErrInvalidOption, d)
	}
	if err := m.txClosed(); err != nil {
		return TxUndecided, err
	}
	n := m.txn()
	all, err := n.halves()
	if err != nil {
		return TxUndecided, err
	}
	var parts []partRef
	if hi := all[txid]; hi != nil {
		parts = hi.parts
	}
	if d == TxRollback {
		if len(parts) == 0 {
			return n.decided(txid), nil
		}
		standing, err := n.rollback(ctx, txid, parts)
		if err == nil {
			m.cfg.logger.Info("operator resolved a transaction", "tx", txid, "decision", standing)
		}
		return standing, err
	}
	plan := txPlan{}
	for _, p := range parts {
		plan[p] = nil
	}
	// The outbox rows too: a store that cannot answer or a row that cannot
	// be read fails the call, since committing without rows that exist
	// would lose them for good.
	var owner localtx.Store
	for _, s := range n.storeList() {
		st, rec, err := s.Check(ctx, txid)
		if err != nil {
			return TxUndecided, fmt.Errorf("mq: resolve %s: %w", txid, err)
		}
		if st != localtx.Committed {
			continue
		}
		p, err := planOf(rec)
		if err != nil {
			return TxUndecided, fmt.Errorf("mq: resolve %s: %w", txid, err)
		}
		for ref, msgs := range p {
			plan[ref] = msgs
		}
		owner = s
		break
	}
	if len(plan) == 0 {
		return n.decided(txid), nil
	}
	// Held even without a marker found: one may appear yet (a transaction
	// still running); the next sweep lets it go if none does.
	now := m.cfg.tx.prune.hold(txid, m.cfg.clock, decidedAnyTime)
	standing, err := n.commit(ctx, txid, plan, now)
	if err != nil {
		return standing, err
	}
	m.cfg.logger.Info("operator resolved a transaction", "tx", txid, "decision", standing)
	if owner != nil {
		n.forgetLater(owner, txid)
	}
	return standing, nil
}

// decided returns the decision recorded for txid in any partition.
func (n *txNode) decided(txid string) TxDecision {
	for name := range n.m.Topics() {
		_, parts, err := n.m.router.partitions(name)
		if err != nil {
			continue
		}
		for _, p := range parts {
			switch d, _ := p.Decision(txid); d {
			case store.Committed:
				return TxCommit
			case store.RolledBack:
				return TxRollback
			}
		}
	}
	return TxUndecided
}

// txClosed returns ErrClosed after Close.
func (m *MQ) txClosed() error {
	if m.closed.Load() {
		return ErrClosed
	}
	return nil
}
