// Package txn is a node's transaction engine: the transactional messages
// of package mq, docs/DESIGN.md section 5, on store partitions.
//
// Prepare stores half messages under the host transaction's id and writes a
// marker into the host transaction; Outbox writes the messages themselves
// into the host transaction. Both register hooks on the transaction: after
// its commit, the half messages and the outbox messages of each partition
// become visible in one OpCommitTx; after a rollback, the half messages are
// discarded. A commit that failed without the host learning its outcome,
// for which localtx runs the WhileUnknown hooks, decides nothing: the
// check-back and the sweep read it from the host store later. Once every
// partition's decision is durable, the marker and outbox rows are
// forgotten, in batches, in the background.
//
// A crash between the host's commit and the queue's is repaired from the
// host store: at start and every sweep the node commits the transactions
// whose marker is still present, the outbox riding along, and the check-back
// asks the host store about half messages left undecided after CheckAfter.
// Decisions are recorded per partition and the first one wins, so every
// repair may run twice.
//
// A partition's decision on a transaction is what makes a repeat of the
// commit change nothing, so it must outlive every host marker of the
// transaction: the upkeep prunes decisions only as the PruneGuard allows,
// which is never one a marker may still need.
//
// The engine never imports package mq: it takes store messages, reaches
// partitions through Topics, and returns store errors and ErrCorrupt for the
// root to translate.
//
// Lock order: Node.mu before openTx.mu, though they are never both held at
// once in practice, and Node.mu before PruneGuard.mu.
package txn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/zeze-go/mq/internal/fanout"
	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/store"
)

// ErrCorrupt is returned for a marker or outbox row that cannot be read: a
// damaged row, or one of a format this build does not know.
var ErrCorrupt = errors.New("txn: corrupt")

// Partition is what the engine needs of a partition; the root's
// partition.Partition values have it. Apply stamps the command's Now.
type Partition interface {
	Apply(ctx context.Context, cmd *store.Command) (store.Result, error)
	HalfTxs(fn func(store.HalfTx) bool) error
	Decision(txid string) (store.Decision, error)
}

// Topics is the node's topic table as the engine reads it.
type Topics interface {
	// Topics returns the names of the node's topics and their partition
	// counts; none once the node is closed.
	Topics() map[string]int
	// Partition returns partition i of topic, or an error: the node is
	// closed, the topic is gone, i is out of range.
	Partition(topic string, i int) (Partition, error)
}

// Clock is the node's source of time.
type Clock interface {
	Now() time.Time
	// After returns a channel that receives once d has passed.
	After(d time.Duration) <-chan time.Time
}

// Config is what a Node needs of its node. Every field but Stores,
// SyncInterval and TestHook must be set.
type Config struct {
	// CheckAfter is how long half messages may stay undecided before the
	// check-back asks the host stores; later checks back off from there.
	CheckAfter time.Duration
	// MaxChecks is how many unanswered check-backs park a transaction.
	MaxChecks int
	// Stores are the host stores given at Open; the node learns more from
	// the transactions that send.
	Stores []localtx.Store
	// SyncInterval is the node's WAL sync interval, 0 when every write is
	// synced; markers are kept two intervals after their decision.
	SyncInterval time.Duration

	// NodeID names the node in a cluster, "" for a standalone node. It is
	// written into each transaction's marker: a node's sweep publishes only
	// its own transactions' markers and those without an owner, so nodes
	// may share a host store's tables.
	NodeID string
	// Owned, if set, names the partitions whose half messages this node
	// checks back: those it leads. Nil: every partition.
	Owned func(topic string, part int) bool
	// AskNode, if set, asks node, which prepared txid, to decide it with
	// its CheckBack for the half messages in parts; nil: this node prepared
	// every half message it sees.
	AskNode func(ctx context.Context, node, txid string, parts []Ref) (store.Decision, error)

	Topics Topics
	// Prune is the guard the upkeep reads; it exists before the Node.
	Prune  *PruneGuard
	Clock  Clock
	Logger *slog.Logger
	// Context ends when the node closes. The commit and rollback hooks,
	// which run in the host's goroutine, work under it.
	Context context.Context
	// Go runs fn in a goroutine owned by the node, with the node's context:
	// the node's Close cancels it and waits.
	Go func(fn func(ctx context.Context))

	// TestHook, set only by tests, is called at the named points of a
	// transaction's life:
	//   - "sent": Prepare or Outbox is about to return;
	//   - "local-committed": the commit hook was entered;
	//   - "partition-committing": one partition's OpCommitTx is about to be
	//     applied;
	//   - "partition-committed": it is durable.
	TestHook func(point, txid string)
}

// Node is a node's transaction state. It is safe for concurrent use.
type Node struct {
	cfg Config

	mu     sync.Mutex         // guards open and stores
	open   map[string]*openTx // transactions of this process that sent, until their hooks end
	stores []localtx.Store    // configured, then learned from transactions

	forgets chan forgetReq // to the forgetter
}

// New returns the transaction engine of a node; Start starts its
// goroutines.
func New(cfg Config) *Node {
	return &Node{
		cfg:     cfg,
		open:    map[string]*openTx{},
		stores:  append([]localtx.Store(nil), cfg.Stores...),
		forgets: make(chan forgetReq, 4096),
	}
}

// Start starts, through Config.Go, two goroutines: one runs the check-back
// of half messages left undecided and the sweep of the host stores'
// markers, the other the forgetter that cleans markers once decisions are
// durable.
func (n *Node) Start() {
	n.cfg.Go(n.checkLoop)
	n.cfg.Go(n.forgetter)
}

// Message is a message routed to partition Part of a topic.
type Message struct {
	Part int
	store.Message
}

// openTx is what the node knows of a transaction that sent messages.
type openTx struct {
	id    string
	owner string        // the node's id, written into the marker
	store localtx.Store // the transaction's own store; nil if it does not say

	mu     sync.Mutex // guards the fields below
	halves []Ref      // partitions holding half messages, in first-use order
	outbox map[Ref][]store.Message
	seq    uint64 // next outbox row
	marked int    // len(halves) when the marker was last written; -1: never
}

// standaloneProducer is recorded as the producer of the half messages of a
// standalone node, without an id, which checks back all of them.
const standaloneProducer = "local"

// producer is what the node records as the producer of its half messages:
// its id, or standaloneProducer.
func (n *Node) producer() string {
	if n.cfg.NodeID == "" {
		return standaloneProducer
	}
	return n.cfg.NodeID
}

// hook calls the test hook, if a test set one.
func (n *Node) hook(point, txid string) {
	if h := n.cfg.TestHook; h != nil {
		h(point, txid)
	}
}

// Prepare binds tx and stores msgs, for partitions of topic, as its half
// messages: durable, invisible until tx commits. The marker listing their
// partitions is written into tx first. It returns when the half messages
// are durable or ctx ends; after an error whatever was stored is delivered
// if tx commits anyway.
func (n *Node) Prepare(ctx context.Context, tx localtx.Tx, topic string, msgs []Message) error {
	ot, err := n.bind(tx)
	if err != nil || len(msgs) == 0 {
		return err
	}
	byPart := map[int][]store.Message{}
	var order []int
	for _, m := range msgs {
		if _, ok := byPart[m.Part]; !ok {
			order = append(order, m.Part)
		}
		byPart[m.Part] = append(byPart[m.Part], m.Message)
	}
	// The marker first: whatever partition may hold halves is in it when
	// the transaction commits.
	ot.mu.Lock()
	for _, i := range order {
		ot.addHalf(Ref{Topic: topic, Part: i})
	}
	ot.mu.Unlock()
	if err := ot.writeMarker(tx); err != nil {
		return err
	}
	err = fanout.Each(order, func(i int) error {
		part, err := n.cfg.Topics.Partition(topic, i)
		if err != nil {
			return err
		}
		cmd := &store.Command{Op: store.OpPrepare, TxID: ot.id, Producer: n.producer(), Msgs: byPart[i]}
		if _, err := part.Apply(ctx, cmd); err != nil {
			return fmt.Errorf("prepare to %s/%d: %w", topic, i, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	n.hook("sent", ot.id)
	return nil
}

// Outbox binds tx and writes msgs, for partitions of topic, into tx as
// outbox rows, published with the rest of tx when it commits. It costs no
// round trip to the queue; its errors are the host store's.
func (n *Node) Outbox(tx localtx.Tx, topic string, msgs []Message) error {
	ot, err := n.bind(tx)
	if err != nil || len(msgs) == 0 {
		return err
	}
	ot.mu.Lock()
	first := ot.seq
	ot.seq += uint64(len(msgs))
	ot.mu.Unlock()
	if err := ot.writeMarker(tx); err != nil {
		return err
	}
	for i := range msgs {
		row := encodeOutboxRow(Ref{Topic: topic, Part: msgs[i].Part}, &msgs[i].Message)
		if err := tx.Put(localtx.OutboxBucket, localtx.OutboxKey(ot.id, first+uint64(i)), row); err != nil {
			return fmt.Errorf("mq: outbox of %s: %w", ot.id, err)
		}
	}
	ot.mu.Lock()
	for _, m := range msgs {
		ref := Ref{Topic: topic, Part: m.Part}
		ot.outbox[ref] = append(ot.outbox[ref], m.Message)
	}
	ot.mu.Unlock()
	n.hook("sent", ot.id)
	return nil
}

// bind returns the node's state of tx, registering the commit and rollback
// hooks on first use.
func (n *Node) bind(tx localtx.Tx) (*openTx, error) {
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
	ot = &openTx{id: id, owner: n.cfg.NodeID, outbox: map[Ref][]store.Message{}, marked: -1}
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
func (n *Node) learn(s localtx.Store) {
	for _, x := range n.stores {
		if x == s {
			return
		}
	}
	n.stores = append(n.stores, s)
	n.cfg.Prune.learned() // its old markers are unknown until swept
}

// ended forgets ot once its hook has run: a sweep may commit it from then on.
func (n *Node) ended(ot *openTx) {
	n.mu.Lock()
	delete(n.open, ot.id)
	n.mu.Unlock()
}

func (n *Node) isOpen(txid string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.open[txid] != nil
}

func (n *Node) storeList() []localtx.Store {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]localtx.Store(nil), n.stores...)
}

// addHalf records that ref holds half messages. ot.mu is held.
func (ot *openTx) addHalf(ref Ref) {
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
	v := encodeMarker(ot.owner, ot.halves)
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
func (n *Node) committed(ot *openTx) {
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
	n.cfg.Prune.hold(ot.id, n.cfg.Clock, decidedFromNow)
	_, err := n.commit(n.cfg.Context, ot.id, plan)
	n.ended(ot)
	if err != nil {
		n.cfg.Logger.Warn("transaction committed by the host but not yet by the queue; the check-back or the next sweep will",
			"tx", ot.id, "err", err)
		return
	}
	n.forgetLater(ot.store, ot.id)
}

// rolledBack is the WhileRollback hook: it discards the half messages.
func (n *Node) rolledBack(ot *openTx) {
	ot.mu.Lock()
	halves := append([]Ref(nil), ot.halves...)
	ot.mu.Unlock()
	_, err := n.rollback(n.cfg.Context, ot.id, halves)
	n.ended(ot)
	if err != nil {
		n.cfg.Logger.Warn("transaction rolled back by the host but not yet by the queue; the check-back will",
			"tx", ot.id, "err", err)
	}
}

// unknown is the WhileUnknown hook: the host's commit failed and its
// outcome could not be read. Nothing is decided: the half messages wait for
// the check-back and the outbox rows for the sweep, which read the outcome
// from the host store: a marker present means committed.
func (n *Node) unknown(ot *openTx) {
	n.ended(ot)
	n.cfg.Logger.Warn("the host's commit failed and its outcome is unknown; the check-back and the sweep will read it from the host store",
		"tx", ot.id)
}

// commit publishes txid in every partition of plan and returns the
// decision that stands, as decide does. Its callers hold txid in the
// PruneGuard first; the partitions stamp the decisions later than that
// hold.
func (n *Node) commit(ctx context.Context, txid string, plan txPlan) (store.Decision, error) {
	return n.decide(ctx, txid, store.Committed, plan)
}

// rollback discards the half messages of txid in refs and returns the
// decision that stands, as decide does.
func (n *Node) rollback(ctx context.Context, txid string, refs []Ref) (store.Decision, error) {
	plan := make(txPlan, len(refs))
	for _, ref := range refs {
		plan[ref] = nil
	}
	return n.decide(ctx, txid, store.RolledBack, plan)
}

// decide records want for txid in every partition of plan, in parallel:
// Committed, publishing the messages of plan with the half messages, or
// RolledBack. It returns the decision that stands: want, or the other one
// when it was recorded first in some partition, which it logs.
func (n *Node) decide(ctx context.Context, txid string, want store.Decision, plan txPlan) (store.Decision, error) {
	op, verb, other, otherVerb := store.OpCommitTx, "commit", store.RolledBack, "rollback"
	if want == store.RolledBack {
		op, verb, other, otherVerb = store.OpRollbackTx, "rollback", store.Committed, "commit"
	}
	var (
		mu       sync.Mutex
		standing = want
	)
	err := fanout.Each(slices.Collect(maps.Keys(plan)), func(ref Ref) error {
		part, err := n.cfg.Topics.Partition(ref.Topic, ref.Part)
		if err != nil {
			return err
		}
		cmd := &store.Command{Op: op, TxID: txid, Msgs: plan[ref]}
		if want == store.Committed {
			n.hook("partition-committing", txid)
		}
		res, err := part.Apply(ctx, cmd)
		if err != nil {
			return fmt.Errorf("%s %s in %s/%d: %w", verb, txid, ref.Topic, ref.Part, err)
		}
		if res.Previous == other {
			n.cfg.Logger.Error(verb+" arrived after a "+otherVerb+" and changed nothing",
				"tx", txid, "topic", ref.Topic, "partition", ref.Part)
			mu.Lock()
			standing = other
			mu.Unlock()
		}
		if want == store.Committed {
			n.hook("partition-committed", txid)
		}
		return nil
	})
	return standing, err
}
