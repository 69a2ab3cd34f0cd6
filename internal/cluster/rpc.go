package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/zeze-go/mq/internal/metastate"
	"github.com/zeze-go/mq/internal/remote"
	"github.com/zeze-go/mq/internal/transport"
	"github.com/zeze-go/mq/internal/wire"
	"github.com/zeze-go/mq/store"
)

// The cluster's RPC ops, beside remote's partition ops. Requests and
// replies are msgpack arrays of the fixed structs below, decoded with
// wire.Unmarshal, which checks every length against the bytes there before
// allocating. Field order is the format: a field is only ever appended.
const (
	opWhoLeads  = remote.FirstOp + 64 // → whoLeads
	opJoin      = remote.FirstOp + 65 // joinReq → joinReply: the leader registered the node
	opHeartbeat = remote.FirstOp + 66 // joinReq → joinReply: the leader renewed its session
	opPropose   = remote.FirstOp + 67 // EncodeCommand → resultMsg
	opCheckTx   = remote.FirstOp + 68 // checkTxReq → checkTxResp
	opAnnounce  = remote.FirstOp + 69 // joinReq → nothing: where the calling node listens now
	opReport    = remote.FirstOp + 70 // joinReq naming the node, Addr empty → nothing: the leader probed it
	opClusterOf = remote.FirstOp + 71 // → clusterOf: whether the node is a member of a cluster, and its id
	// opRegistered: joinReq naming the caller → registered: whether this
	// node's state has it registered with that incarnation.
	opRegistered = remote.FirstOp + 72
)

// registered answers opRegistered.
type registered struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Yes      bool
}

func (*registered) limits() wire.Limits { return tinyLimits }

// clusterOf answers opClusterOf: whether the node holds metadata state
// (a member of a cluster) and the cluster's id as it knows it.
type clusterOf struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Member   bool
	ID       string
}

func (*clusterOf) limits() wire.Limits { return nameLimits }

// Error codes of the metadata group's errors on the wire.
func init() {
	for i, err := range []error{ErrNotLeader, ErrUnknownOutcome, metastate.ErrInvalid, metastate.ErrTopicExists, metastate.ErrNoTopic,
		metastate.ErrPartitionDecrease, metastate.ErrNotEnoughNodes, metastate.ErrNoNode, metastate.ErrNodeDown, metastate.ErrStaleSession, metastate.ErrNoGroup,
		metastate.ErrNoMember, metastate.ErrMemberExists, metastate.ErrNotRevoking, ErrDenied, ErrClosed,
		metastate.ErrStale, metastate.ErrNodeUp, metastate.ErrNodeHolds} {
		remote.RegisterError(remote.FirstUserCode+uint16(i), err)
	}
}

// ErrDenied is returned for a call the caller's identity has no right to
// make under the cluster's ACL.
var ErrDenied = errors.New("cluster: denied by ACL")

type whoLeads struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	ID       string
	Addr     string
}

type joinReq struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	ID       string
	Addr     string
	// Incarnation is the node's data directory's identity, in a join and
	// a heartbeat; "" from an older release, and in the other uses.
	Incarnation string
	// Cluster is the cluster id the node's directory records, in a join
	// and a heartbeat; "" while it has none.
	Cluster string
}

// joinReqV1 is a joinReq of an older release, without Incarnation and
// Cluster.
type joinReqV1 struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	ID       string
	Addr     string
}

// decodeJoin decodes a joinReq, or an older release's.
func decodeJoin(req []byte) (joinReq, error) {
	var j joinReq
	switch {
	case len(req) > 0 && req[0] == 0x92: // an array of two
		var v joinReqV1
		if err := decodeMsg(req, &v); err != nil {
			return j, err
		}
		return joinReq{ID: v.ID, Addr: v.Addr}, nil
	}
	err := decodeMsg(req, &j)
	return j, err
}

// joinReply answers a join and a heartbeat: the leader that registered
// the node, or renewed its session, its state having the node's
// incarnation. An older release answers nothing.
type joinReply struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Leader   string
	// Index is the index of the leader's metadata state when it answered:
	// the caller's state is behind until it has applied as much (Behind).
	Index uint64
}

type checkTxReq struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	TxID     string
	Parts    []PartRef // at most MaxCheckParts
}

// MaxCheckParts bounds the partitions one check-back request names: the
// decoder refuses more, and CheckTx asks for more in several requests.
const MaxCheckParts = 4096

// The limits of each message (decodeMsg): names are MaxNameLen at most,
// a txid store.MaxKeyBytes; a list holds at most its own maximum, and at
// least the fields of its struct.
var (
	nameLimits   = wire.Limits{Elems: 4, Bytes: metastate.MaxNameLen}
	checkLimits  = wire.Limits{Elems: MaxCheckParts, Bytes: store.MaxKeyBytes}
	resultLimits = wire.Limits{Elems: metastate.MaxPartitions, Bytes: metastate.MaxNameLen}
	tinyLimits   = wire.Limits{Elems: 1}
)

func (*whoLeads) limits() wire.Limits    { return nameLimits }
func (*joinReq) limits() wire.Limits     { return nameLimits }
func (*joinReqV1) limits() wire.Limits   { return nameLimits }
func (*joinReply) limits() wire.Limits   { return nameLimits }
func (*checkTxReq) limits() wire.Limits  { return checkLimits }
func (*checkTxResp) limits() wire.Limits { return tinyLimits }
func (*resultMsg) limits() wire.Limits   { return resultLimits }

// bounded is a message of this file: its limits bound what decodeMsg
// accepts for it.
type bounded interface {
	limits() wire.Limits
}

// PartRef names one partition of one topic.
type PartRef struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Topic    string
	Part     int
}

type checkTxResp struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Decision uint8
}

// resultMsg is a Result on the wire.
type resultMsg struct {
	_msgpack   struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Index      uint64
	Generation uint64
	Session    uint64
	Name       string
	Type       uint8
	Created    int64
	Parts      []partMsg
	GroupSize  int
	Alone      bool
}

type partMsg struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Replicas []string
	Leader   string
	Epoch    uint64
	Chunk    int
	InSync   []string
	Version  uint64
}

func toResultMsg(r metastate.Result) *resultMsg {
	m := &resultMsg{Index: r.Index, Generation: r.Generation, Session: r.Session,
		Name: r.Topic.Name, Type: r.Topic.Type, Created: r.Topic.Created, GroupSize: r.Topic.GroupSize, Alone: r.Topic.Alone}
	for _, p := range r.Topic.Parts {
		m.Parts = append(m.Parts, partMsg{Replicas: p.Replicas, Leader: p.Leader, Epoch: p.Epoch, Chunk: p.Chunk,
			InSync: p.InSync, Version: p.Version})
	}
	return m
}

func (m *resultMsg) result() metastate.Result {
	r := metastate.Result{Index: m.Index, Generation: m.Generation, Session: m.Session,
		Topic: metastate.Topic{Name: m.Name, Type: m.Type, Created: m.Created, GroupSize: m.GroupSize, Alone: m.Alone}}
	for _, p := range m.Parts {
		r.Topic.Parts = append(r.Topic.Parts, metastate.Partition{Replicas: p.Replicas, Leader: p.Leader, Epoch: p.Epoch, Chunk: p.Chunk,
			InSync: p.InSync, Version: p.Version})
	}
	return r
}

func encodeMsg(v any) ([]byte, error) { return msgpack.Marshal(v) }

// decodeMsg decodes b into v, refusing with ErrCorrupt, before it
// allocates, a count or a length over v's limits: each element of a list
// costs the receiver far more than its smallest encoding (an empty array,
// one byte, becomes a PartRef of 24), so a list is bounded by its type.
func decodeMsg(b []byte, v bounded) error {
	if err := wire.UnmarshalLimited(b, v, v.limits()); err != nil {
		return fmt.Errorf("%w: %v", metastate.ErrCorrupt, err)
	}
	return nil
}

// handle runs a leader op for peer: a node's call, or this node's own.
func (n *Agent) handle(ctx context.Context, peer string, op uint16, req []byte) ([]byte, error) {
	switch op {
	case opJoin:
		return n.handleJoin(ctx, peer, req)
	case opHeartbeat:
		return n.handleHeartbeat(ctx, peer, req)
	case opPropose:
		return n.handlePropose(ctx, peer, req)
	case opReport:
		return n.handleReport(ctx, peer, req)
	}
	return nil, fmt.Errorf("%w: op %d", metastate.ErrInvalid, op)
}

// handleClusterOf tells any authenticated peer whether this node is a
// member of a cluster, and its id: a node about to start a cluster asks
// its seeds first (Agent.bootstrap).
func (n *Agent) handleClusterOf(_ context.Context, _ string, _ []byte) ([]byte, error) {
	st := n.meta.State()
	c := clusterOf{Member: st.Index() > 0 || transport.InConfiguration(n.meta.raft, n.cfg.ID), ID: st.ClusterID()}
	if c.ID == "" {
		c.ID, _ = n.clusterID.Load().(string)
	}
	c.Member = c.Member || c.ID != ""
	return encodeMsg(&c)
}

// handleRegistered answers a node asking whether this node's state has
// it registered with its incarnation: a state holds committed entries
// only, so yes lets a replica that withholds its vote vote
// (Agent.checkVote). A node asks only of itself.
func (n *Agent) handleRegistered(_ context.Context, peer string, req []byte) ([]byte, error) {
	j, err := n.ownJoin(peer, req, "registration")
	if err != nil {
		return nil, err
	}
	nd, ok := n.meta.State().Node(j.ID)
	return encodeMsg(&registered{Yes: ok && j.Incarnation != "" && nd.Incarnation == j.Incarnation})
}

// ownJoin decodes the request req of node peer, a what (join, heartbeat,
// registration), which names a node: peer itself, or ErrDenied, logged
// once.
func (n *Agent) ownJoin(peer string, req []byte, what string) (joinReq, error) {
	j, err := decodeJoin(req)
	if err != nil {
		return j, err
	}
	if j.ID != peer {
		return j, n.refuse(peer, what+" as another", fmt.Errorf("%w: node %s sends a %s for %s", ErrDenied, peer, what, j.ID))
	}
	return j, nil
}

func (n *Agent) handleWhoLeads(_ context.Context, _ string, _ []byte) ([]byte, error) {
	id, _ := n.meta.Leader()
	w := whoLeads{ID: id}
	if id != "" {
		w.Addr, _ = n.resolve(id)
	}
	return encodeMsg(&w)
}

// handleJoin registers the calling node (AddNode) on the leader. A node
// registers only itself: the id is the peer's, which the handshake proved,
// and with TLS its certificate. An identity that is not a node yet joins
// only as joinAllowed says.
func (n *Agent) handleJoin(ctx context.Context, peer string, req []byte) ([]byte, error) {
	j, err := n.ownJoin(peer, req, "join")
	if err != nil {
		return nil, err
	}
	if !n.meta.IsLeader() {
		return nil, n.meta.notLeader() // the joining node finds the leader
	}
	if err := n.joinAllowed(ctx, peer, j.Addr); err != nil {
		return nil, err
	}
	if c := n.meta.State().ClusterID(); j.Cluster != "" && c != "" && j.Cluster != c {
		return nil, n.refuse(peer, "join from another cluster", fmt.Errorf("%w: %s holds cluster %s's data, this is %s", metastate.ErrWrongCluster, peer, j.Cluster, c))
	}
	if err := n.meta.AddNode(ctx, metastate.RegisterNode{ID: j.ID, Addr: j.Addr, Incarnation: j.Incarnation, Cluster: j.Cluster}); err != nil {
		return nil, err
	}
	return encodeMsg(&joinReply{Leader: n.cfg.ID, Index: n.meta.State().Index()})
}

// handleHeartbeat renews the calling node's session on the leader. An
// identity that is no node is told so (ErrNoNode) before its request is
// decoded: a node the leader does not know registers again.
func (n *Agent) handleHeartbeat(_ context.Context, peer string, req []byte) ([]byte, error) {
	if !n.IsNode(peer) {
		return nil, n.refuse(peer, "not a node: heartbeat", fmt.Errorf("%w: %q", metastate.ErrNoNode, peer))
	}
	j, err := n.ownJoin(peer, req, "heartbeat")
	if err != nil {
		return nil, err
	}
	if nd, ok := n.meta.State().Node(j.ID); ok && nd.Up && nd.Addr != j.Addr {
		return nil, fmt.Errorf("%w: %s moved to %s", metastate.ErrNodeDown, j.ID, j.Addr) // registers again
	} else if c := n.meta.State().ClusterID(); j.Cluster != "" && c != "" && j.Cluster != c {
		return nil, n.refuse(peer, "heartbeat from another cluster", fmt.Errorf("%w: %s holds cluster %s's data, this is %s", metastate.ErrWrongCluster, peer, j.Cluster, c))
	} else if ok && nd.Up && j.Incarnation != "" && nd.Incarnation != j.Incarnation {
		// Another data directory than the one registered: the node
		// registers again, which takes its replicas out of sync.
		return nil, fmt.Errorf("%w: %s is incarnation %s, not %s", metastate.ErrNodeDown, j.ID, j.Incarnation, nd.Incarnation)
	}
	if j.ID == n.cfg.ID { // the leader itself: it is alive, and registers itself
		return nil, nil
	}
	if err := n.meta.Heartbeat(j.ID); err != nil {
		return nil, err
	}
	return encodeMsg(&joinReply{Leader: n.cfg.ID, Index: n.meta.State().Index()})
}

// handlePropose applies a command on the leader for peer, if the ACL
// allows it: topic changes need Admin on the topic and the ACL Admin on
// "*"; joining a group needs Consume on its topic; group commands may name
// only the peer's own members; a DoubleWrite pair's commands come from its
// leader's node. Nodes are registered by joining, marked down by the
// leader alone. A refusal is logged once per identity, command type and
// cause (Refusals), whatever names the command holds.
func (n *Agent) handlePropose(ctx context.Context, peer string, req []byte) ([]byte, error) {
	if err := n.NodeOnly(peer, "propose"); err != nil {
		return nil, err
	}
	c, err := metastate.DecodeCommand(req)
	if err != nil {
		return nil, err
	}
	if cause, err := n.authorize(peer, c); err != nil {
		command := fmt.Sprintf("%T", c)
		if ok, unlogged := n.refused.First(peer + "\x00" + command + "\x00" + cause); ok {
			n.log.Warn("refused by the cluster's ACL", "identity", peer, "command", command, "cause", cause, "err", err, "unlogged", unlogged)
		}
		return nil, err
	}
	r, err := n.meta.Propose(ctx, c)
	if err != nil {
		return nil, err
	}
	return encodeMsg(toResultMsg(r))
}

// Report tells the metadata leader that this node cannot reach node id,
// the leader of a DoubleWrite pair it sends to: the metadata leader
// probes id and, if id does not answer either, promotes the in-sync
// followers of the pairs it leads (Meta.promoteFrom); the node itself is
// marked down only when its session expires. One that answers is left as
// it is: the fault is the reporter's. Reports of a node are probed one at
// a time; the others return at once.
func (n *Agent) Report(ctx context.Context, id string) error {
	req, err := encodeMsg(&joinReq{ID: id})
	if err != nil {
		return err
	}
	_, err = n.toLeader(ctx, opReport, req)
	return err
}

// ReportLater is Report without waiting: the report is sent by a
// goroutine of the agent's, one at a time; one made while the queue is
// full, or the agent closed, is dropped, since the session check follows
// anyway.
func (n *Agent) ReportLater(id string) {
	select {
	case n.reports <- id:
	default:
	}
}

// reportLoop sends the queued reports until the agent closes.
func (n *Agent) reportLoop() {
	for {
		select {
		case <-n.ctx.Done():
			return
		case id := <-n.reports:
			ctx, cancel := context.WithTimeout(n.ctx, 2*probeTries*probeTimeout)
			if err := n.Report(ctx, id); err != nil && n.ctx.Err() == nil {
				n.log.Info("report not taken", "node", id, "err", err)
			}
			cancel()
		}
	}
}

// probeTimeout bounds each of a probe's calls, probeTries how many it makes.
const (
	probeTimeout = time.Second
	probeTries   = 2
)

// handleReport probes the node a report names, on the leader.
func (n *Agent) handleReport(ctx context.Context, peer string, req []byte) ([]byte, error) {
	if err := n.NodeOnly(peer, "report"); err != nil {
		return nil, err
	}
	j, err := decodeJoin(req)
	if err != nil {
		return nil, err
	}
	if !n.meta.IsLeader() {
		return nil, n.meta.notLeader() // the reporter finds the leader
	}
	nd, ok := n.meta.State().Node(j.ID)
	if !ok || !nd.Up || j.ID == n.cfg.ID || j.ID == peer {
		return nil, nil // down already, or this node, alive; or the reporter itself
	}
	if _, busy := n.probing.LoadOrStore(j.ID, true); busy {
		return nil, nil
	}
	defer n.probing.Delete(j.ID)
	for try := range probeTries {
		if try > 0 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(probeTimeout / 5):
			}
		}
		c, err := n.Peer(j.ID)
		if err == nil {
			pctx, cancel := context.WithTimeout(ctx, probeTimeout)
			_, err = c.Call(pctx, opWhoLeads, nil)
			cancel()
		}
		if err == nil {
			n.log.Info("reported node answers the metadata leader: left up", "node", j.ID, "reporter", peer)
			return nil, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	// Not marked down: a node cut off, or paused, still believes its
	// session valid, and delivers to its consumers, until SessionDeadline;
	// NodeDown would give its group members' partitions to others at once.
	// Its pairs alone move now, which their epochs fence; its session
	// expires as any other.
	n.log.Warn("reported node does not answer: its DoubleWrite pairs handed to their followers", "node", j.ID, "reporter", peer)
	n.meta.promoteFrom(ctx, j.ID)
	return nil, nil
}

// pairLeader refuses a command on a DoubleWrite partition from a node that
// does not lead it: its leader's own.
func pairLeader(s *metastate.State, peer, topic string, i int) error {
	if t, ok := s.Topic(topic); ok && i >= 0 && i < len(t.Parts) && t.Parts[i].Leader == peer {
		return nil
	}
	return fmt.Errorf("%w: %s does not lead %s/%d", ErrDenied, peer, topic, i)
}

// authorize says whether peer may propose c (handlePropose): nil, or
// ErrDenied and, beside it, its cause: fixed text naming no value of c.
func (n *Agent) authorize(peer string, c metastate.Command) (cause string, err error) {
	s := n.meta.State()
	deny := func(topic string, right metastate.Rights) (string, error) {
		if s.Allowed(peer, topic, right) {
			return "", nil
		}
		return "may not " + rightName(right), fmt.Errorf("%w: %s may not %s %s", ErrDenied, peer, rightName(right), topic)
	}
	const another, notPairLeader = "another node's member", "not the pair's leader"
	switch c := c.(type) {
	case metastate.CreateTopic:
		if systemTopic(c.Name) { // made by the first consumer of its group that needs it
			return denySystem(s, peer, c.Name, "", metastate.RightConsume)
		}
		return deny(c.Name, metastate.RightAdmin)
	case metastate.AlterTopic:
		if systemTopic(c.Name) {
			return denySystem(s, peer, c.Name, "", metastate.RightAdmin)
		}
		return deny(c.Name, metastate.RightAdmin)
	case metastate.SetACL, metastate.DrainNode, metastate.MoveReplica, metastate.RemoveNode, metastate.AcceptLoss:
		return deny("*", metastate.RightAdmin)
	case metastate.JoinGroup:
		if c.Node != peer || !ownMember(peer, c.Member) {
			return another, fmt.Errorf("%w: node %s cannot add member %s on %s", ErrDenied, peer, c.Member, c.Node)
		}
		if systemTopic(c.Topic) {
			return denySystem(s, peer, c.Topic, c.Group, metastate.RightConsume)
		}
		if !s.AllowedGroup(peer, c.Topic, c.Group, metastate.RightConsume) {
			return "may not consume in the group", fmt.Errorf("%w: %s may not consume from %s in group %s", ErrDenied, peer, c.Topic, c.Group)
		}
		return "", nil
	case metastate.LeaveGroup:
		if !ownMember(peer, c.Member) {
			return another, fmt.Errorf("%w: node %s cannot remove member %s", ErrDenied, peer, c.Member)
		}
		return "", nil
	case metastate.Released:
		if !ownMember(peer, c.Member) {
			return another, fmt.Errorf("%w: node %s cannot release for member %s", ErrDenied, peer, c.Member)
		}
		return "", nil
	case metastate.SetInSync:
		return notPairLeader, pairLeader(s, peer, c.Topic, c.Partition)
	case metastate.RenewEpoch:
		return notPairLeader, pairLeader(s, peer, c.Topic, c.Partition)
	case metastate.Promote:
		// A leader whose replica failed, or whose node closes, hands the
		// pair to its follower, which Promote requires in sync and up.
		return notPairLeader, pairLeader(s, peer, c.Topic, c.Partition)
	case metastate.HandOver:
		// A leader balancing leaderships swaps with its follower.
		return notPairLeader, pairLeader(s, peer, c.Topic, c.Partition)
	case metastate.MoveDone:
		// The node a Single partition moves to, holding its copy, says so
		// itself; the state refuses it for another move.
		if c.To != peer {
			return "move done for another", fmt.Errorf("%w: node %s cannot end a move to %s", ErrDenied, peer, c.To)
		}
		return "", nil
	case metastate.Rejoined:
		// A replica caught up as a new server says so itself.
		if c.Node != peer {
			return "rejoin for another", fmt.Errorf("%w: node %s cannot record %s rejoined", ErrDenied, peer, c.Node)
		}
		return "", nil
	}
	return "the leader's own", fmt.Errorf("%w: %T is the leader's own", ErrDenied, c)
}

// systemTopic reports whether topic is a group's retry or dead-letter topic.
func systemTopic(topic string) bool {
	_, ok := metastate.SystemGroup(topic)
	return ok
}

// denySystem is authorize's refusal of right on the system topic topic,
// for offsets ("" for none), unless the ACL gives it to peer in the
// topic's group (State.AllowedSystem): creating a group's retry or
// dead-letter topic and joining it are its consumers' Consume, not an
// Admin's.
func denySystem(s *metastate.State, peer, topic, offsets string, right metastate.Rights) (cause string, err error) {
	if s.AllowedSystem(peer, topic, offsets, right) {
		return "", nil
	}
	g, _ := metastate.SystemGroup(topic)
	return "may not " + rightName(right) + " in the system topic's group",
		fmt.Errorf("%w: %s may not %s %s (%s of group %s)", ErrDenied, peer, rightName(right), topic, offsets, g)
}

// MemberName is the group member name of consumer id on node: the node's
// id, a slash, the consumer's number on that node.
func MemberName(node string, consumer uint64) string {
	return fmt.Sprintf("%s/%d", node, consumer)
}

func ownMember(node, member string) bool {
	return len(member) > len(node) && member[:len(node)] == node && member[len(node)] == '/'
}

func rightName(r metastate.Rights) string {
	switch r {
	case metastate.RightProduce:
		return "produce to"
	case metastate.RightConsume:
		return "consume from"
	case metastate.RightAdmin:
		return "administer"
	}
	return fmt.Sprintf("rights %#x on", uint8(r))
}

// handleAnnounce records where the calling node listens. Nothing proves
// the address, but only a current node may announce, and only for its own
// id.
func (n *Agent) handleAnnounce(_ context.Context, peer string, req []byte) ([]byte, error) {
	if err := n.NodeOnly(peer, "announce"); err != nil {
		return nil, err
	}
	j, err := decodeJoin(req)
	if err != nil {
		return nil, err
	}
	if j.ID != peer || j.Addr == "" || len(j.Addr) > metastate.MaxNameLen {
		return nil, n.refuse(peer, "announce as another", fmt.Errorf("%w: node %s cannot announce %q at %q", ErrDenied, peer, j.ID, j.Addr))
	}
	n.announced.Store(j.ID, j.Addr)
	return nil, nil
}

// handleCheckTx answers a check-back of a transaction this node prepared
// (AgentConfig.CheckTx checks that it did) to a current node holding a
// replica of every partition the request names: the node that checks back
// the half messages there. Another identity is refused before its request
// is decoded.
func (n *Agent) handleCheckTx(ctx context.Context, peer string, req []byte) ([]byte, error) {
	if err := n.NodeOnly(peer, "check-back"); err != nil {
		return nil, err
	}
	var q checkTxReq
	if err := decodeMsg(req, &q); err != nil {
		return nil, err
	}
	if err := n.holdsAll(peer, q.Parts); err != nil {
		return nil, n.refuse(peer, "check-back of partitions it does not hold", err)
	}
	d, err := n.cfg.CheckTx(ctx, q.TxID, q.Parts)
	if err != nil {
		return nil, err
	}
	return encodeMsg(&checkTxResp{Decision: uint8(d)})
}

// CheckTx asks node, the preparer of txid, to decide it for the half
// messages in parts (AgentConfig.CheckTx there), MaxCheckParts of them a
// request: each request gets the same decision, which the preparer takes
// from its own record, and the first undecided answer is the answer.
func (n *Agent) CheckTx(ctx context.Context, node, txid string, parts []PartRef) (store.Decision, error) {
	c, err := n.Peer(node)
	if err != nil {
		return store.Undecided, err
	}
	d := store.Undecided
	for first := true; first || len(parts) > 0; first = false {
		chunk := parts[:min(len(parts), MaxCheckParts)]
		parts = parts[len(chunk):]
		if d, err = n.checkTx(ctx, c, txid, chunk); err != nil || d == store.Undecided {
			return d, err
		}
	}
	return d, nil
}

// checkTx makes one check-back request of CheckTx.
func (n *Agent) checkTx(ctx context.Context, c *remote.Client, txid string, parts []PartRef) (store.Decision, error) {
	req, err := encodeMsg(&checkTxReq{TxID: txid, Parts: parts})
	if err != nil {
		return store.Undecided, err
	}
	resp, err := c.Call(ctx, opCheckTx, req)
	if err != nil {
		return store.Undecided, err
	}
	var r checkTxResp
	if err := decodeMsg(resp, &r); err != nil {
		return store.Undecided, err
	}
	if r.Decision > uint8(store.RolledBack) {
		return store.Undecided, fmt.Errorf("%w: decision %d", metastate.ErrCorrupt, r.Decision)
	}
	return store.Decision(r.Decision), nil
}
