package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/zeze-go/mq/internal/cluster"
	"github.com/zeze-go/mq/internal/metastate"
	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/internal/remote"
	"github.com/zeze-go/mq/internal/replica"
	"github.com/zeze-go/mq/internal/txn"
	"github.com/zeze-go/mq/raftqueue"
	"github.com/zeze-go/mq/raftqueue/pairlog"
	"github.com/zeze-go/mq/store"
)

// ErrNoTopic is returned to another node's call for a partition this node
// does not know, once it waited a little for the metadata to reach it.
var ErrNoTopic = errors.New("node: no such topic")

// Served is the partition of the table that this node serves to another's
// RPC: one placed here, or this node's replica of a replicated one, which
// answers while it leads. A topic just created may not be in the table yet,
// since the metadata group's change reaches the nodes one after the other:
// Served waits a little for it. A replicated partition the metadata shows
// and the table does not yet is refused at once with store.ErrClosed, so
// the caller asks another of its replicas.
func (n *Node) Served(topic string, i int) (partition.Partition, error) {
	if n.started.Load() == nil {
		return nil, errStarting
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if t, ok := n.cfg.Topics.Get(topic); ok && i >= 0 && i < len(t.Parts) {
			switch p := t.Parts[i].(type) {
			case *single:
				return p.served()
			case *replica.Partition:
				if err := p.Failed(); err != nil {
					// The record makes this node the pair's leader and its
					// replica cannot serve: the caller fails at once, as a
					// call made here does.
					return nil, fmt.Errorf("%w: %s/%d: %w", replica.ErrReplicaFailed, topic, i, err)
				}
				if l := p.Leading(); l != nil {
					return l, nil // it answers while it leads
				}
			}
			return nil, fmt.Errorf("%w: %s/%d is not on node %s", store.ErrClosed, topic, i, n.agent.ID())
		}
		if mt, ok := n.agent.Meta().State().Topic(topic); ok && mt.Type != metastate.TypeSingle && i >= 0 && i < len(mt.Parts) {
			return nil, fmt.Errorf("%w: %s/%d is not open on node %s yet", store.ErrClosed, topic, i, n.agent.ID())
		}
		if n.closed.Load() || time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: %s/%d", ErrNoTopic, topic, i)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// authorize is the ACL of the partition service: only current nodes of
// the cluster call it, and what a node asks of a partition stored here
// needs the right its own calls would. Commands only a partition's own
// node proposes, the upkeep's and the counting of check-backs, are refused
// from others. Deciding a transaction needs Produce from the node that
// prepared it, which the half messages name as their producer: a prepare
// must name the node that sends it. Another node needs Admin to decide it.
// A reset or a deletion of a group's offsets needs Admin on the topic and
// the group, as ResetOffset and Seek do where they start. Claiming,
// renewing, committing and releasing a group's offsets need Consume on the
// topic and the group, and the peer must own the partition in the group's
// current assignment (owns). Any right reads a transaction's state. A
// group's retry and dead-letter topics are the group's (authorizeSystem).
func (n *Node) authorize(peer, topic string, index int, op uint16, cmd *store.Command) error {
	if err := n.nodeOnly(peer, "partition service"); err != nil {
		return err
	}
	if group, ok := metastate.SystemGroup(topic); ok {
		return n.authorizeSystem(peer, topic, group, index, op, cmd)
	}
	right := metastate.RightConsume // reads, fetches, offsets
	switch {
	case op == remote.OpHalfTxs || op == remote.OpDecision: // transaction state: any right reads it
		st := n.agent.Meta().State()
		for _, r := range []metastate.Rights{metastate.RightProduce, metastate.RightConsume, metastate.RightAdmin} {
			if st.Allowed(peer, topic, r) {
				return nil
			}
		}
		return n.Allowed(peer, topic, metastate.RightProduce)
	case op != remote.OpApply:
	case cmd.Op == store.OpPrepare && cmd.Producer != peer:
		return fmt.Errorf("%w: %s prepares half messages as %q", cluster.ErrDenied, peer, cmd.Producer)
	case cmd.Op == store.OpCommitTx || cmd.Op == store.OpRollbackTx:
		right = metastate.RightProduce
		if n.agent.Meta().State().Allowed(peer, topic, metastate.RightAdmin) {
			return nil
		}
		producer, ok, err := n.halfProducer(topic, index, cmd.TxID)
		if err != nil {
			return err
		}
		if ok && producer != peer {
			return fmt.Errorf("%w: %s decides transaction %s of %s: %v", cluster.ErrDenied, peer, cmd.TxID, producer,
				n.Allowed(peer, topic, metastate.RightAdmin))
		}
	case cmd.Op == store.OpAppend || cmd.Op == store.OpPrepare:
		right = metastate.RightProduce
	case cmd.Op == store.OpDeleteGroup || cmd.Op == store.OpResetOffset:
		return n.AllowedGroup(peer, topic, cmd.Group, metastate.RightAdmin)
	case cmd.Op == store.OpClaim || cmd.Op == store.OpCommitOffset || cmd.Op == store.OpUnclaim || cmd.Op == store.OpRenew:
		if err := n.AllowedGroup(peer, topic, cmd.Group, metastate.RightConsume); err != nil {
			return err
		}
		return n.owns(peer, topic, index, cmd.Group)
	default:
		return fmt.Errorf("%w: op %d is proposed by the partition's own node only", cluster.ErrDenied, cmd.Op)
	}
	return n.Allowed(peer, topic, right) // cluster.ErrDenied: a code the caller's node maps back
}

// authorizeSystem is authorize for a retry or dead-letter topic of group,
// whose calls are the group's (metastate.State.AllowedSystem): reading it
// needs Consume in the group; appending to it, parking or dead-lettering
// a message, needs Consume in the group from a node owning a partition in
// it, whose consumer failed the message (ownsInGroup); resetting or
// deleting offsets needs Admin, claiming, renewing, committing and
// releasing them Consume, for the offsets named (a retry consumer's
// "<group>%<topic>": the right on its origin topic), and the ownership of
// the partition as on any topic. Offsets no consumer stores
// (RedriveDeadLetters' progress, named with a leading '%') need Admin in
// the group. Transactions, the upkeep and the counting of check-backs are
// refused.
func (n *Node) authorizeSystem(peer, topic, group string, index int, op uint16, cmd *store.Command) error {
	if op != remote.OpApply {
		return n.allowedSystem(peer, topic, "", metastate.RightConsume)
	}
	switch cmd.Op {
	case store.OpAppend:
		if err := n.allowedSystem(peer, topic, "", metastate.RightConsume); err != nil {
			return err
		}
		return n.ownsInGroup(peer, topic, group)
	case store.OpDeleteGroup, store.OpResetOffset:
		return n.allowedSystem(peer, topic, cmd.Group, metastate.RightAdmin)
	case store.OpClaim, store.OpCommitOffset, store.OpUnclaim, store.OpRenew:
		if strings.HasPrefix(cmd.Group, "%") {
			return n.allowedSystem(peer, topic, cmd.Group, metastate.RightAdmin)
		}
		if err := n.allowedSystem(peer, topic, cmd.Group, metastate.RightConsume); err != nil {
			return err
		}
		return n.owns(peer, topic, index, cmd.Group)
	}
	return n.refuse(peer, strings.Join([]string{"system op", topic, strconv.Itoa(int(cmd.Op))}, "\x00"),
		fmt.Errorf("%w: op %d on %s is proposed by the partition's own node only", cluster.ErrDenied, cmd.Op, topic))
}

// allowedSystem returns cluster.ErrDenied, logged once per identity,
// topic, offsets and right, unless identity may do right on the system
// topic topic for offsets ("" for none).
func (n *Node) allowedSystem(identity, topic, offsets string, right metastate.Rights) error {
	if n.agent.Meta().State().AllowedSystem(identity, topic, offsets, right) {
		return nil
	}
	what := strings.Join([]string{identity, topic, right.String(), offsets}, "\x00")
	if ok, unlogged := n.refused.First(what); ok {
		n.cfg.Logger.Warn("refused by the cluster's ACL", "identity", identity, "topic", topic, "right", right.String(), "group", offsets, "unlogged", unlogged)
	}
	return fmt.Errorf("%w: %s may not %s %s (%q)", cluster.ErrDenied, identity, right, topic, offsets)
}

// ownsInGroup returns cluster.ErrDenied unless node peer owns a partition
// in group (metastate.State.OwnsInGroup), waiting up to ownsWait for the
// state to show it, as owns does.
func (n *Node) ownsInGroup(peer, topic, group string) error {
	if n.awaitState(func(st *metastate.State) bool { return st.OwnsInGroup(peer, group) }) {
		return nil
	}
	return n.refuse(peer, strings.Join([]string{"group owner", topic, group}, "\x00"),
		fmt.Errorf("%w: %s owns no partition in group %s, whose %s it appends to", cluster.ErrDenied, peer, group, topic))
}

// awaitState reports whether this node's metadata state satisfies cond,
// now or within ownsWait: the caller's node may have applied a change
// first.
func (n *Node) awaitState(cond func(*metastate.State) bool) bool {
	var deadline *time.Timer // made on the first miss: most calls pass at once
	for {
		st := n.agent.Meta().State()
		if cond(st) {
			return true
		}
		if deadline == nil {
			deadline = time.NewTimer(ownsWait)
			defer deadline.Stop()
		}
		select {
		case <-st.Changed():
		case <-deadline.C:
			return false
		}
	}
}

// AllowedGroup returns cluster.ErrDenied, logged once per identity, topic,
// group and right, unless identity may do right on topic for group.
// A system topic's calls are its group's (allowedSystem).
func (n *Node) AllowedGroup(identity, topic, group string, right metastate.Rights) error {
	if _, ok := metastate.SystemGroup(topic); ok {
		return n.allowedSystem(identity, topic, group, right)
	}
	if n.agent.Meta().State().AllowedGroup(identity, topic, group, right) {
		return nil
	}
	what := strings.Join([]string{identity, topic, right.String(), group}, "\x00")
	if ok, unlogged := n.refused.First(what); ok {
		n.cfg.Logger.Warn("refused by the cluster's ACL", "identity", identity, "topic", topic, "right", right.String(), "group", group, "unlogged", unlogged)
	}
	return fmt.Errorf("%w: %s may not %s %s in group %s", cluster.ErrDenied, identity, right, topic, group)
}

// ownsWait bounds how long owns waits for this node's metadata state to
// show the peer's assignment: the claimer's node may have applied it first.
const ownsWait = time.Second

// owns returns cluster.ErrDenied unless node peer owns partition index of
// topic for group in the group's current assignment: a member named after
// peer owns it, or is having it revoked and may still commit. It waits up
// to ownsWait for the state to show it. The refusal names no generation,
// so a node that does not own the partition learns nothing it could use
// to move the group's offsets.
func (n *Node) owns(peer, topic string, index int, group string) error {
	if n.awaitState(func(st *metastate.State) bool {
		member, _ := st.Owner(topic, group, index)
		return cluster.OwnMember(peer, member)
	}) {
		return nil
	}
	return n.refuse(peer, strings.Join([]string{"owner", topic, group}, "\x00"),
		fmt.Errorf("%w: %s does not own %s/%d in group %s", cluster.ErrDenied, peer, topic, index, group))
}

// nodeOnly returns nil if peer is a current node of the cluster, for a call
// of op: errStarting while this node starts, else as cluster.Agent.NodeOnly.
func (n *Node) nodeOnly(peer, op string) error {
	if n.started.Load() == nil {
		return errStarting
	}
	return n.agent.NodeOnly(peer, op)
}

// refuse logs err, a refusal of peer's call, once per identity and cause,
// and returns it.
func (n *Node) refuse(peer, cause string, err error) error {
	if ok, unlogged := n.refused.First(peer + "\x00" + cause); ok {
		n.cfg.Logger.Warn("refused a call", "identity", peer, "err", err, "unlogged", unlogged)
	}
	return err
}

// halfProducer returns the producer of txid's half messages in partition
// index of topic, stored here, and whether there are any.
func (n *Node) halfProducer(topic string, index int, txid string) (string, bool, error) {
	t, ok := n.cfg.Topics.Get(topic)
	if !ok || index < 0 || index >= len(t.Parts) {
		return "", false, nil // the lookup that follows answers
	}
	switch p := t.Parts[index].(type) {
	case *single:
		if l, err := p.served(); err == nil {
			return l.HalfProducer(txid)
		}
	case *replica.Partition:
		if l := p.Leading(); l != nil {
			return l.HalfProducer(txid)
		}
	}
	return "", false, nil
}

// checkTx answers another node's check-back of a transaction this node
// prepared, through txn.Node.CheckBack, for those of parts whose half
// messages of txid name this node as their producer (preparedHere): this
// node, finding no marker of a transaction, rolls it back with its own
// rights, so it must never do so where another node prepared it. One with
// no such partition is refused. (The agent checked that the asking node
// holds parts.)
func (n *Node) checkTx(ctx context.Context, txid string, parts []cluster.PartRef) (store.Decision, error) {
	if n.started.Load() == nil {
		return store.Undecided, errStarting
	}
	tx := n.tx.Load()
	if tx == nil { // not started yet: as if running
		return store.Undecided, nil
	}
	refs, err := n.preparedHere(ctx, txid, parts)
	if err != nil {
		return store.Undecided, err
	}
	return tx.CheckBack(ctx, txid, refs)
}

// preparedHere returns the partitions of parts holding a half message of
// txid whose producer is this node, or cluster.ErrDenied, logged once,
// when none does.
func (n *Node) preparedHere(ctx context.Context, txid string, parts []cluster.PartRef) ([]txn.Ref, error) {
	self := n.agent.ID()
	var refs []txn.Ref
	for _, r := range parts {
		t, ok := n.cfg.Topics.Get(r.Topic)
		if !ok || r.Part < 0 || r.Part >= len(t.Parts) {
			continue
		}
		found := false
		err := partition.HalfTxs(ctx, t.Parts[r.Part], func(h store.HalfTx) bool {
			if h.TxID == txid {
				found = h.Producer == self
			}
			return h.TxID < txid // in txid order: past it, it is not there
		})
		if err != nil {
			return nil, err // the asker tries again: deciding part of them would be no answer
		}
		if found && !slices.Contains(refs, txn.Ref{Topic: r.Topic, Part: r.Part}) {
			refs = append(refs, txn.Ref{Topic: r.Topic, Part: r.Part})
		}
	}
	if len(refs) == 0 {
		err := fmt.Errorf("%w: node %s did not prepare transaction %s in the partitions named", cluster.ErrDenied, self, txid)
		if ok, _ := n.refused.First("check-back of another's transaction"); ok {
			n.cfg.Logger.Warn("refused a check-back", "tx", txid, "err", err)
		}
		return nil, err
	}
	return refs, nil
}

// AskNode asks node, which prepared txid, to decide it for the half
// messages in parts (txn.Config.AskNode).
func (n *Node) AskNode(ctx context.Context, node, txid string, parts []txn.Ref) (store.Decision, error) {
	refs := make([]cluster.PartRef, len(parts))
	for i, p := range parts {
		refs[i] = cluster.PartRef{Topic: p.Topic, Part: p.Part}
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return n.agent.CheckTx(ctx, node, txid, refs)
}

// Owned reports whether partition part of topic is stored on this node: a
// Single partition placed here, or a replicated one whose replica here
// leads, since its leader's node checks its transactions back. It is
// txn.Config.Owned.
func (n *Node) Owned(topic string, part int) bool {
	t, ok := n.cfg.Topics.Get(topic)
	if !ok || part < 0 || part >= len(t.Parts) {
		return false
	}
	switch p := t.Parts[part].(type) {
	case *single:
		return p.owned()
	case *replica.Partition:
		return p.Leads()
	}
	return false
}

// errNotHere is an append for a replica this node does not hold, or not
// yet: the leader tries again.
var errNotHere = errors.New("node: no such replica here")

// pairAt is the follower's side of a DoubleWrite leader's append from node
// peer (replica.ServePairs). A node the pair's record does not name as its
// leader is refused, logged once per identity and partition.
func (n *Node) pairAt(peer, topic string, i int) (*raftqueue.Pair, error) {
	if err := n.nodeOnly(peer, "pair append"); err != nil {
		return nil, err
	}
	t, ok := n.cfg.Topics.Get(topic)
	if !ok || i < 0 || i >= len(t.Parts) {
		return nil, fmt.Errorf("%w: %s/%d is not open on node %s", errNotHere, topic, i, n.agent.ID())
	}
	p, ok := t.Parts[i].(*replica.Partition)
	if !ok || p.Pair() == nil {
		return nil, fmt.Errorf("%w: %s/%d is not a DoubleWrite partition", errNotHere, topic, i)
	}
	rep, err := p.Pair().AppendFrom(peer)
	if errors.Is(err, pairlog.ErrBadAppend) { // a node the pair's record does not name as its leader
		return nil, n.refuse(peer, fmt.Sprintf("pair append\x00%s/%d", topic, i), fmt.Errorf("append to %s/%d: %w", topic, i, err))
	}
	return rep, err
}

// serveReplicas registers the replicas' ops on the node's RPC server.
func (n *Node) serveReplicas(srv *remote.Server) {
	replica.ServePairs(srv, n.pairAt)
	srv.Handle(OpMoveFetch, n.moveFetch)
	srv.Handle(OpRaft3Vouch, n.raft3Vouch)
	srv.Handle(OpLeading, n.serveLeading)
	srv.Handle(OpLeadTo, n.serveLeadTo)
}
