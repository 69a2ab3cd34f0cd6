package mq

import (
	"context"
	"fmt"
	"time"

	"github.com/zeze-go/mq/internal/txn"
	"github.com/zeze-go/mq/localtx"
	"github.com/zeze-go/mq/store"
)

// Transactional messages, the user API; docs/DESIGN.md §5 has the design.
// The engine is package internal/txn: the binding to host transactions,
// the marker and outbox rows, the commit and rollback of each partition,
// the check-back, the sweep and the forgetter. This file converts
// messages, decisions and errors at its boundary.

// LocalTx is the host's local transaction as the queue sees it; see
// package localtx for the contract and the bbolt and database/sql adapters.
type LocalTx = localtx.Tx

// TxDecision is an operator's decision on a parked transaction, and what
// ResolveTx reports as the decision that stands.
type TxDecision int

// Decisions.
const (
	// TxUndecided: the node knows no decision of the transaction, nor any
	// of its half messages.
	TxUndecided TxDecision = iota
	// TxCommit delivers the transaction's messages.
	TxCommit
	// TxRollback discards them.
	TxRollback
)

// String names the decision: "commit", "rollback", or "undecided".
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
	Checks     int              // check-backs without an answer, the most among its partitions
}

// txConfig holds the transaction settings of a node and, once the node is
// open, its transaction engine.
type txConfig struct {
	checkAfter time.Duration
	maxChecks  int
	stores     []localtx.Store
	// testHook, set only by tests (export_test.go), is
	// txn.Config.TestHook.
	testHook func(point, txid string)

	prune *txn.PruneGuard // read by the upkeep (internal/upkeep) from the start
	node  *txn.Node       // set by startTxChecker
}

func defaultTxConfig() txConfig {
	return txConfig{checkAfter: 6 * time.Second, maxChecks: 15, prune: txn.NewPruneGuard()}
}

// startTxChecker starts the transaction engine: its check-back and sweep
// goroutine and its forgetter (internal/txn).
func (m *MQ) startTxChecker() {
	c := &m.cfg.tx
	cfg := txn.Config{
		CheckAfter:   c.checkAfter,
		MaxChecks:    c.maxChecks,
		Stores:       c.stores,
		SyncInterval: m.cfg.syncInterval,
		Topics:       txTopics{m},
		Prune:        c.prune,
		Clock:        m.cfg.clock,
		Logger:       m.cfg.logger,
		Context:      m.ctx,
		Go:           m.goFunc,
		TestHook:     c.testHook,
	}
	if m.cluster != nil { // half messages name their node; each is checked back where it was prepared
		cfg.NodeID = m.cluster.ID()
		cfg.Owned = m.cluster.Owned
		cfg.AskNode = m.cluster.AskNode
	}
	c.node = txn.New(cfg)
	if m.cluster != nil {
		m.cluster.ServeTx(c.node)
	}
	c.node.Start()
}

// txTopics is the node's topic table as the transaction engine reads it.
type txTopics struct{ m *MQ }

func (t txTopics) Topics() map[string]int { return t.m.Topics() }

func (t txTopics) Partition(topic string, i int) (txn.Partition, error) {
	_, parts, err := t.m.partitions(topic)
	if err != nil {
		return nil, err
	}
	if i < 0 || i >= len(parts) {
		return nil, fmt.Errorf("%w: %s/%d", ErrInvalidPartition, topic, i)
	}
	return parts[i], nil
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
// SendMessage; Offset is -1, since offsets are given at commit.
func (p *Producer) PrepareMessage(ctx context.Context, msgs ...*Message) error {
	tx, ok := localtx.FromContext(ctx)
	if !ok {
		return ErrNotInTransaction
	}
	sms, err := p.routeTx(msgs)
	if err != nil {
		return err
	}
	return translate(p.m.cfg.tx.node.Prepare(ctx, tx, p.topic, sms))
}

// CommitMessage writes msgs into the host transaction carried by ctx, as an
// outbox (see package localtx), and publishes them when that transaction
// commits, together with its half messages and in commit order; a rollback
// or a redo discards them with the rest of the transaction. It costs no
// round trip to the queue before the commit. It returns ErrNotInTransaction
// when ctx carries no transaction, the errors of SendMessage's checks, and
// the host store's write errors. CommitMessage fills ID, Topic,
// PartitionIndex and Timestamp like SendMessage; Offset is -1.
func (p *Producer) CommitMessage(ctx context.Context, msgs ...*Message) error {
	tx, ok := localtx.FromContext(ctx)
	if !ok {
		return ErrNotInTransaction
	}
	sms, err := p.routeTx(msgs)
	if err != nil {
		return err
	}
	return translate(p.m.cfg.tx.node.Outbox(tx, p.topic, sms))
}

// routeTx checks and routes msgs, fills their Timestamp when zero, sets
// their Offset to -1, and converts them for the engine.
func (p *Producer) routeTx(msgs []*Message) ([]txn.Message, error) {
	if p.closed.Load() {
		return nil, ErrClosed
	}
	if err := p.m.allowed(p.topic, Produce); err != nil {
		return nil, err
	}
	_, parts, err := p.m.partitions(p.topic)
	if err != nil {
		return nil, err
	}
	if err := p.route(msgs, len(parts)); err != nil {
		return nil, err
	}
	now := p.m.cfg.clock.Now()
	out := make([]txn.Message, len(msgs))
	for i, m := range msgs {
		if m.Timestamp.IsZero() {
			m.Timestamp = now
		}
		m.Offset = -1
		out[i] = txn.Message{Part: m.PartitionIndex, Message: toStore(m)}
	}
	return out, nil
}

// UnresolvedTxs lists the parked transactions: those whose check-back found
// no answer TxMaxChecks times (see WithTxMaxChecks), oldest first. In a
// cluster these are the ones parked in the partitions stored on this node,
// whose check-back it runs by asking the node that prepared the
// transaction. It returns ErrClosed after Close, or ctx's error once it
// ends.
func (m *MQ) UnresolvedTxs(ctx context.Context) ([]UnresolvedTx, error) {
	if err := m.txClosed(); err != nil {
		return nil, err
	}
	parked, err := m.cfg.tx.node.Parked(ctx)
	if err != nil {
		return nil, translate(err)
	}
	now := m.cfg.clock.Now()
	var out []UnresolvedTx
	for _, pk := range parked {
		u := UnresolvedTx{TxID: pk.TxID, Messages: pk.Messages, Checks: pk.Checks, FirstSeen: pk.FirstSeen, Age: now.Sub(pk.FirstSeen)}
		for _, r := range pk.Parts {
			u.Partitions = append(u.Partitions, TopicPartition{Topic: r.Topic, Partition: r.Part})
		}
		out = append(out, u)
	}
	return out, nil
}

// ResolveTx is the operator's decision on transaction txid, normally a
// parked one (see UnresolvedTxs): TxCommit delivers its half messages and
// the outbox rows its host store still holds, TxRollback discards them. The
// first decision wins: ResolveTx returns the decision that stands, which
// differs from d when the transaction had been decided otherwise before,
// and is TxUndecided when the node knows nothing of txid. TxCommit first
// reads the transaction's rows from the host stores: when a store cannot
// answer, or a row cannot be read, which is ErrCorrupt naming it, ResolveTx
// returns the error and decides nothing. It returns when the decision is
// durable or ctx ends, and ErrClosed after Close.
func (m *MQ) ResolveTx(ctx context.Context, txid string, d TxDecision) (TxDecision, error) {
	if err := m.allowed("*", Admin); err != nil {
		return TxUndecided, err
	}
	want := store.Committed
	switch d {
	case TxCommit:
	case TxRollback:
		want = store.RolledBack
	default:
		return TxUndecided, fmt.Errorf("%w: decision %v", ErrInvalidOption, d)
	}
	if err := m.txClosed(); err != nil {
		return TxUndecided, err
	}
	standing, err := m.cfg.tx.node.Resolve(ctx, txid, want)
	return txDecision(standing), translate(err)
}

// txDecision is the TxDecision of a store decision.
func txDecision(d store.Decision) TxDecision {
	switch d {
	case store.Committed:
		return TxCommit
	case store.RolledBack:
		return TxRollback
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
