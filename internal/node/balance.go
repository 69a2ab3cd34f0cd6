package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/zeze-go/mq/internal/metastate"
	"github.com/zeze-go/mq/internal/remote"
	"github.com/zeze-go/mq/internal/replica"
	"github.com/zeze-go/mq/internal/wire"
	"github.com/zeze-go/mq/raftqueue"
)

// Balancing the leaderships of Raft3 groups and DoubleWrite pairs over the
// nodes (BalanceLeaders): raft elects whichever replica times out first, a
// pair's follower takes over when its leader's session lapses, and a node
// that restarts leads none of its groups or pairs until something moves
// them back.

const (
	// OpLeading asks a node which Raft3 groups its replicas lead. The
	// request is empty; the reply is a leadingReply in msgpack.
	OpLeading = remote.FirstOp + 92
	// OpLeadTo asks a node whose replica leads a Raft3 group or a
	// DoubleWrite pair to hand its leadership to another replica: a
	// leadTo in msgpack; the reply is empty once raft's transfer ended,
	// or once the metadata swapped the pair's leader and follower.
	OpLeadTo = remote.FirstOp + 93
)

// groupRef names a Raft3 group or a DoubleWrite pair: its topic and first
// partition.
type groupRef struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Topic    string
	First    int
}

func (g groupRef) compare(o groupRef) int {
	return cmp.Or(cmp.Compare(g.Topic, o.Topic), cmp.Compare(g.First, o.First))
}

type leadingReply struct {
	_msgpack struct{}   `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Groups   []groupRef // sorted
}

type leadTo struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Group    groupRef
	To       string
}

// balanceLimits bound what a peer's OpLeading reply and OpLeadTo request
// make this node decode: a node leads at most one group per partition,
// and a name is at most metastate.MaxNameLen bytes.
var balanceLimits = wire.Limits{Elems: 1 << 16, Bytes: metastate.MaxNameLen}

// transferWidth is how many leadership transfers BalanceLeaders runs at once.
const transferWidth = 8

// handOverTimeout bounds a pair's swap (leadTo): its follower's
// confirmation, which a follower cut off from its leader never gives, and
// the proposal. raft's leadership transfer bounds itself.
const handOverTimeout = 10 * time.Second

// BalanceLeaders hands the leaderships of Raft3 groups and DoubleWrite
// pairs from the nodes that lead the most to replicas on nodes that lead
// fewer, until no group's leader leads two more than another of its
// replicas could: it asks every up node which Raft3 groups it leads
// (OpLeading; a pair's leader is the metadata's), plans, and asks the
// leader of each group to move to hand its leadership over (OpLeadTo):
// raft's leadership transfer (the target is caught up, then elected at
// once), or a pair's swap with its follower in sync (replica.Pair.HandOver).
// Only up nodes that are not draining, replicas not lost, and a pair's
// follower in sync take leaderships. It needs the Admin right on "*", which
// each node checks of the caller. It returns how many groups moved, and
// the errors of those that did not: they stay where they were.
func (n *Node) BalanceLeaders(ctx context.Context) (int, error) {
	self := n.agent.ID()
	if err := n.Allowed(self, "*", metastate.RightAdmin); err != nil {
		return 0, err
	}
	st := n.agent.Meta().State()
	leaders := map[groupRef]string{}
	silent := map[string]bool{} // up nodes that did not say what they lead
	var errs []error
	for _, nd := range st.Nodes() {
		if !nd.Up {
			continue
		}
		led, err := n.leadingOn(ctx, nd.ID)
		if err != nil {
			errs = append(errs, fmt.Errorf("ask %s what it leads: %w", nd.ID, err))
			silent[nd.ID] = true
			continue
		}
		for _, g := range led {
			leaders[g] = nd.ID
		}
	}
	eligible, pairLeaders := eligibleLeaders(st)
	for g, l := range pairLeaders {
		if !silent[l] {
			leaders[g] = l
		}
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	// A node that did not answer may lead any number of groups: none is
	// handed to it.
	for g, reps := range eligible {
		eligible[g] = slices.DeleteFunc(reps, func(id string) bool { return silent[id] })
	}
	plan := planLeaders(eligible, leaders)
	var (
		mu    sync.Mutex
		moved int
		wg    sync.WaitGroup
		sem   = make(chan struct{}, transferWidth)
	)
	for _, tr := range plan {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			mu.Lock()
			errs = append(errs, ctx.Err())
			mu.Unlock()
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			err := n.leadToOn(ctx, tr)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s/%d from %s to %s: %w", tr.group.Topic, tr.group.First, tr.from, tr.to, err))
				return
			}
			n.cfg.Logger.Info("leadership balanced", "topic", tr.group.Topic, "group", tr.group.First, "from", tr.from, "to", tr.to)
			moved++
		})
	}
	wg.Wait()
	return moved, errors.Join(errs...)
}

// eligibleLeaders returns, for each Raft3 group and DoubleWrite pair of
// st, its replicas that may lead it after a balance: on nodes up and not
// draining; of a Raft3 group, not lost; of a pair, its leader, and its
// follower while in sync. It returns the leader of each pair too, which
// the metadata records (a Raft3 group's, only raft knows).
func eligibleLeaders(st *metastate.State) (eligible map[groupRef][]string, pairLeaders map[groupRef]string) {
	eligible, pairLeaders = map[groupRef][]string{}, map[groupRef]string{}
	for _, name := range st.Topics() {
		t, _ := st.Topic(name)
		if t.Type != metastate.TypeRaft3 && t.Type != metastate.TypeDoubleWrite {
			continue
		}
		for i, p := range t.Parts {
			if p.Chunk != i {
				continue
			}
			g := groupRef{Topic: name, First: i}
			if t.Type == metastate.TypeDoubleWrite && p.Leader != "" {
				pairLeaders[g] = p.Leader
			}
			var ok []string
			for _, id := range p.Replicas {
				may := !slices.Contains(p.Lost, id)
				if t.Type == metastate.TypeDoubleWrite {
					may = id == p.Leader || len(p.InSync) == 2 && slices.Contains(p.InSync, id)
				}
				if nd, _ := st.Node(id); may && nd.Up && !nd.Draining {
					ok = append(ok, id)
				}
			}
			eligible[g] = ok
		}
	}
	return eligible, pairLeaders
}

// transfer is one move of a plan: group's leadership from node from to
// node to.
type transfer struct {
	group    groupRef
	from, to string
}

// planLeaders returns the transfers that balance leaders, each group's
// leader now, over the nodes of eligible, each group's replicas that may
// lead it: while a group's leader leads at least two more groups than one
// of the group's eligible replicas, the group moves to the replica that
// evens them most. Each step lowers the sum of the squared counts, so the
// plan ends; a group moves at most once, from its leader now to where the
// plan leaves it. Groups without a known leader, or not in eligible, stay.
func planLeaders(eligible map[groupRef][]string, leaders map[groupRef]string) []transfer {
	count := map[string]int{}
	for _, reps := range eligible {
		for _, id := range reps {
			count[id] += 0
		}
	}
	var groups []groupRef
	for g, l := range leaders {
		if _, ok := eligible[g]; ok {
			groups = append(groups, g)
			count[l]++
		}
	}
	slices.SortFunc(groups, groupRef.compare)
	now := maps.Clone(leaders)
	for {
		var best transfer
		gain := 1
		for _, g := range groups {
			from := now[g]
			for _, to := range eligible[g] {
				if d := count[from] - count[to]; to != from && d > gain {
					best, gain = transfer{group: g, from: from, to: to}, d
				}
			}
		}
		if best.to == "" {
			break
		}
		now[best.group] = best.to
		count[best.from]--
		count[best.to]++
	}
	var plan []transfer
	for _, g := range groups {
		if now[g] != leaders[g] {
			plan = append(plan, transfer{group: g, from: leaders[g], to: now[g]})
		}
	}
	return plan
}

// leadingOn returns the Raft3 groups node id's replicas lead.
func (n *Node) leadingOn(ctx context.Context, id string) ([]groupRef, error) {
	if id == n.agent.ID() {
		return n.leading(), nil
	}
	c, err := n.agent.Peer(id)
	if err != nil {
		return nil, err
	}
	b, err := c.Call(ctx, OpLeading, nil)
	if err != nil {
		return nil, err
	}
	var r leadingReply
	if err := wire.UnmarshalLimited(b, &r, balanceLimits); err != nil {
		return nil, fmt.Errorf("%w: %s's groups: %v", errRequestFormat, id, err)
	}
	return r.Groups, nil
}

// leading returns the Raft3 groups this node's replicas lead, sorted.
func (n *Node) leading() []groupRef {
	var out []groupRef
	n.groups.Each(func(topic string, first int, g *raftqueue.Group) {
		if g.Raft().State() == raft.Leader {
			out = append(out, groupRef{Topic: topic, First: first})
		}
	})
	slices.SortFunc(out, groupRef.compare)
	return out
}

// leadToOn asks tr.from to hand tr.group's leadership to tr.to.
func (n *Node) leadToOn(ctx context.Context, tr transfer) error {
	if tr.from == n.agent.ID() {
		return n.leadTo(ctx, tr.group, tr.to)
	}
	c, err := n.agent.Peer(tr.from)
	if err != nil {
		return err
	}
	req, err := msgpack.Marshal(&leadTo{Group: tr.group, To: tr.to})
	if err != nil {
		return err
	}
	_, err = c.Call(ctx, OpLeadTo, req)
	return err
}

// leadTo hands the leadership of this node's replica of group, which must
// lead, to node to, a replica of the group that may lead it
// (eligibleLeaders), and waits for raft's transfer to end, or for the
// metadata to make a pair's follower its leader.
func (n *Node) leadTo(ctx context.Context, group groupRef, to string) error {
	st := n.agent.Meta().State()
	eligible, _ := eligibleLeaders(st)
	if reps := eligible[group]; !slices.Contains(reps, to) {
		return fmt.Errorf("%w: %s may not lead %s/%d (eligible: %q)", metastate.ErrInvalid, to, group.Topic, group.First, reps)
	}
	if t, _ := st.Topic(group.Topic); t.Type == metastate.TypeDoubleWrite {
		p, ok := n.pairs.Get(group.Topic, group.First)
		if !ok {
			return fmt.Errorf("%w: %s/%d is not led here", errNotHere, group.Topic, group.First)
		}
		ctx, cancel := context.WithTimeout(ctx, handOverTimeout)
		defer cancel()
		if err := p.HandOver(ctx, to); err != nil {
			if errors.Is(err, replica.ErrNotHandedOff) {
				return fmt.Errorf("%w: %v", errNotHere, err)
			}
			return err
		}
		return nil
	}
	g, ok := n.groups.Get(raft3Name(group.Topic, group.First))
	if !ok || g.Raft().State() != raft.Leader {
		return fmt.Errorf("%w: %s/%d is not led here", errNotHere, group.Topic, group.First)
	}
	return g.Raft().LeadershipTransferToServer(raft.ServerID(to), raft.ServerAddress(to)).Error()
}

// serveLeading serves OpLeading to a node of the cluster.
func (n *Node) serveLeading(_ context.Context, peer string, _ []byte) ([]byte, error) {
	if err := n.nodeOnly(peer, "leading"); err != nil {
		return nil, err
	}
	return msgpack.Marshal(&leadingReply{Groups: n.leading()})
}

// serveLeadTo serves OpLeadTo to a node of the cluster with the Admin
// right on "*".
func (n *Node) serveLeadTo(ctx context.Context, peer string, req []byte) ([]byte, error) {
	if err := n.nodeOnly(peer, "lead to"); err != nil {
		return nil, err
	}
	if err := n.Allowed(peer, "*", metastate.RightAdmin); err != nil {
		return nil, err
	}
	var r leadTo
	if err := wire.UnmarshalLimited(req, &r, balanceLimits); err != nil {
		return nil, fmt.Errorf("%w: %v", errRequestFormat, err)
	}
	return nil, n.leadTo(ctx, r.Group, r.To)
}
