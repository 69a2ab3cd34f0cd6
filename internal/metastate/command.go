package metastate

import (
	"errors"
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/zeze-go/mq/internal/wire"
)

// A command's encoding, the data of one raft log entry:
//
//	[1] cmdMagic
//	[1] cmdVersion
//	[1] kind (kindRegisterNode …)
//	[…] the command struct as a msgpack array, fields in declaration order
//
// New fields go at the end of a struct with a new version. A decoder
// refuses versions it does not know, since a newer node's entry is
// corruption to an older one: nodes are upgraded before new commands are
// proposed. It reads an older version's struct with the new fields zero.
// Version 2 added CreateTopic.GroupSize; version 3 CreateTopic.AllowAlone
// and the commands of DoubleWrite partitions (SetInSync, Promote,
// ReplaceFollower, RenewEpoch); version 4 changed no struct but lets a
// DoubleWrite CreateTopic have a GroupSize above 1, for pairs shared by
// several partitions. A version 3 node would refuse such a command where a
// version 4 one applies it: an older node must refuse the entry as unknown
// rather than apply it otherwise. Version 5 added Rule.Group to SetACL's
// rules; an older SetACL's rules match every group. Version 6 added
// RegisterNode.Incarnation and Cluster, an older one having neither, which
// changes no incarnation and sets no cluster id, and the command Rejoined;
// the commands DrainNode, MoveReplica, RemoveNode, MoveDone, AcceptLoss and HandOver came later in the same
// version, an older node refusing their kinds as it refuses any command of
// a newer version.
const (
	cmdMagic   = 0xC1 // never the first byte of a msgpack value
	cmdVersion = 6
)

// Command kinds, the third byte of an encoded command.
const (
	kindRegisterNode = 1 + iota
	kindNodeDown
	kindCreateTopic
	kindAlterTopic
	kindJoinGroup
	kindLeaveGroup
	kindReleased
	kindSetACL
	kindSetInSync
	kindPromote
	kindReplaceFollower
	kindRenewEpoch
	kindRejoined
	kindDrainNode
	kindMoveReplica
	kindRemoveNode
	kindMoveDone
	kindAcceptLoss
	kindHandOver
)

// Command is one mutation of the metadata state: one of RegisterNode,
// NodeDown, CreateTopic, AlterTopic, JoinGroup, LeaveGroup, Released,
// SetACL, SetInSync, Promote, ReplaceFollower, RenewEpoch, Rejoined,
// DrainNode, MoveReplica, RemoveNode, MoveDone, AcceptLoss, HandOver. A command
// carries inputs only; what it does is decided by Apply from the state,
// identically on every node.
type Command interface {
	kind() byte
}

// RegisterNode adds a node or updates its address. A node marked down comes
// back up with a new session. Voter records whether the node is a raft voter
// of the metadata group, as the leader decides (see cluster.Meta.AddNode).
// Incarnation is the identity of the node's data directory, made at its
// first Open: one other than recorded is a directory that lost what the
// node held (an empty or replaced disk), so the node comes back with a new
// session and none of its replicas is in sync any more (Node.Incarnation).
// "" keeps the recorded one. Cluster is the cluster id the node's
// directory records, or the one its node made to start the cluster: the
// first registration carrying one sets State.ClusterID, and another one
// is refused with ErrWrongCluster; "" for a node that has none yet.
type RegisterNode struct {
	_msgpack    struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	ID          string
	Addr        string
	Voter       bool
	Incarnation string
	Cluster     string
}

// registerNodeV5 is RegisterNode before version 6, without Incarnation
// and Cluster.
type registerNodeV5 struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	ID       string
	Addr     string
	Voter    bool
}

// NodeDown marks a node down, proposed by the leader when the node's
// session expires. Its consumer-group members leave their groups; its
// partitions keep their placement. A NodeDown for an older Session than the
// node's current one is refused with ErrStaleSession.
type NodeDown struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	ID       string
	Session  uint64
}

// CreateTopic creates a topic and places its partitions. Type is the
// replication type (TypeSingle, TypeDoubleWrite, TypeRaft3); Replicas is the
// replica count per partition, 0 for the type's own: 1, 2 or 3. Now, in
// unix ns, is stamped by the proposer. GroupSize is Topic.GroupSize, 0
// meaning 1; AllowAlone is Topic.Alone.
type CreateTopic struct {
	_msgpack   struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Name       string
	Partitions int
	Type       uint8
	Replicas   int
	Now        int64
	GroupSize  int
	AllowAlone bool
}

// createTopicV2 is CreateTopic in version 2, without AllowAlone.
type createTopicV2 struct {
	_msgpack   struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Name       string
	Partitions int
	Type       uint8
	Replicas   int
	Now        int64
	GroupSize  int
}

// createTopicV1 is CreateTopic in version 1, without GroupSize.
type createTopicV1 struct {
	_msgpack   struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Name       string
	Partitions int
	Type       uint8
	Replicas   int
	Now        int64
}

// AlterTopic raises a topic's partition count, placing only the added
// partitions. The same count is a no-op; a lower one is ErrPartitionDecrease.
type AlterTopic struct {
	_msgpack   struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Name       string
	Partitions int
}

// JoinGroup adds member Member, running on node Node, to consumer group
// Group of Topic and rebalances the group. Joining again from the same node
// changes nothing.
type JoinGroup struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Topic    string
	Group    string
	Member   string
	Node     string
}

// LeaveGroup removes a member from its group: its partitions are free at
// once, since the member has stopped, and the group is rebalanced.
type LeaveGroup struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Topic    string
	Group    string
	Member   string
}

// Released is the second step of moving a partition: Member, from which the
// partition is being revoked, has stopped consuming it and committed its
// offsets. Generation is the group generation at which the member saw the
// revocation; it must not be older than the revocation itself.
type Released struct {
	_msgpack   struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Topic      string
	Group      string
	Partition  int
	Member     string
	Generation uint64
}

// SetACL replaces the access rules. An empty list disables access control.
type SetACL struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Rules    []Rule
}

// setACLV4 is SetACL in version 4 and before, its rules without Group.
type setACLV4 struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Rules    []ruleV4
}

// SetInSync sets the in-sync replicas of DoubleWrite partition Partition
// of Topic, Partition.InSync with its leader first, or returns ErrStale if
// its record is no longer at Version. Its leader proposes it.
type SetInSync struct {
	_msgpack  struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Topic     string
	Partition int
	Version   uint64
	InSync    []string
}

// Promote makes Leader the leader of a DoubleWrite partition at the next
// epoch, with itself alone in sync and a new follower chosen by load, or
// the old leader when no other node is up. Leader must be an in-sync
// replica (ErrNotInSync) that is up (ErrNodeDown), and the record still at
// Version (ErrStale). The metadata leader proposes it once the old leader
// is gone; the old leader proposes it to hand the pair off when its
// replica failed or its node closes.
type Promote struct {
	_msgpack  struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Topic     string
	Partition int
	Version   uint64
	Leader    string
}

// HandOver swaps a DoubleWrite partition's leader and follower at the
// next epoch: Leader, the follower, in sync and up, leads, and the old
// leader, up, follows with what it holds, both still in sync (the old
// leader held every acked entry; its tail that Leader lacks, never acked,
// is cut by Leader's first appends). The pair's leader proposes it to
// balance leaderships, where Promote, for a leader that failed or closes,
// gives the pair a follower chosen by load. It returns ErrStale if the
// record is no longer at Version, ErrNotInSync for a Leader out of sync,
// ErrNodeDown when either node is down, and ErrInvalid for a Leader that
// drains.
type HandOver struct {
	_msgpack  struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Topic     string
	Partition int
	Version   uint64
	Leader    string
}

// ReplaceFollower gives a DoubleWrite partition a new follower chosen by
// load, with its leader alone in sync until the follower caught up, at the
// next epoch: the leader's replication to the new follower is a run of its
// own. It returns ErrStale if the record is no longer at Version, and
// ErrNotEnoughNodes when no node is free. The metadata leader proposes it
// once the follower is gone.
type ReplaceFollower struct {
	_msgpack  struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Topic     string
	Partition int
	Version   uint64
}

func (RegisterNode) kind() byte    { return kindRegisterNode }
func (NodeDown) kind() byte        { return kindNodeDown }
func (CreateTopic) kind() byte     { return kindCreateTopic }
func (AlterTopic) kind() byte      { return kindAlterTopic }
func (JoinGroup) kind() byte       { return kindJoinGroup }
func (LeaveGroup) kind() byte      { return kindLeaveGroup }
func (Released) kind() byte        { return kindReleased }
func (SetACL) kind() byte          { return kindSetACL }
func (SetInSync) kind() byte       { return kindSetInSync }
func (Promote) kind() byte         { return kindPromote }
func (ReplaceFollower) kind() byte { return kindReplaceFollower }
func (RenewEpoch) kind() byte      { return kindRenewEpoch }
func (Rejoined) kind() byte        { return kindRejoined }
func (HandOver) kind() byte        { return kindHandOver }

// Rejoined records that Node's replica of the Raft3 group holding
// Partition caught up as a new server, after its node came back as
// Incarnation (Partition.Lost): it is no longer lost, and may vote again.
// Only the node itself proposes it. It returns ErrStale when the node is
// no longer that incarnation, and changes nothing when the replica is not
// lost.
type Rejoined struct {
	_msgpack    struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Topic       string
	Partition   int
	Node        string
	Incarnation string
}

// RenewEpoch gives a DoubleWrite partition's leader the next epoch, its
// replicas and in-sync set unchanged, or returns ErrStale if its record is
// no longer at Version. Its leader proposes it when it must start leading
// again, after a restart or after its replication failed: each run of a
// leader writes under an epoch of its own (pairlog.Log.Lead).
type RenewEpoch struct {
	_msgpack  struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Topic     string
	Partition int
	Version   uint64
}

// EncodeCommand returns c's encoding, laid out as above.
func EncodeCommand(c Command) ([]byte, error) {
	body, err := msgpack.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encode %T: %w", c, err)
	}
	return append([]byte{cmdMagic, cmdVersion, c.kind()}, body...), nil
}

// cmdLimits bound what DecodeCommand decodes: no list is longer than
// MaxRules, SetACL's (a command's other lists are shorter), so a command
// costs at most a SetACL of MaxRules rules, about 40 KiB, beyond its
// strings. Strings are bounded by the bytes alone: a string costs its
// length, and Apply refuses an over-long name with ErrInvalid.
var cmdLimits = wire.Limits{Elems: MaxRules, Bytes: math.MaxInt32}

// DecodeCommand decodes an encoded command. Damaged or foreign bytes
// return ErrCorrupt; a list over cmdLimits, checked before anything is
// allocated, returns ErrInvalid, as Apply would; the rest of the limits
// are Apply's.
func DecodeCommand(b []byte) (Command, error) {
	if len(b) < 4 {
		return nil, fmt.Errorf("%w: command of %d bytes", ErrCorrupt, len(b))
	}
	if b[0] != cmdMagic || b[1] < 1 || b[1] > cmdVersion {
		return nil, fmt.Errorf("%w: command magic/version %#x %d", ErrCorrupt, b[0], b[1])
	}
	var c Command
	var err error
	switch k, body := b[2], b[3:]; k {
	case kindRegisterNode:
		if b[1] < 6 {
			var v registerNodeV5
			v, err = decodeAs[registerNodeV5](body, cmdLimits)
			c = RegisterNode{ID: v.ID, Addr: v.Addr, Voter: v.Voter}
			break
		}
		c, err = decodeAs[RegisterNode](body, cmdLimits)
	case kindNodeDown:
		c, err = decodeAs[NodeDown](body, cmdLimits)
	case kindCreateTopic:
		switch b[1] {
		case 1:
			var v createTopicV1
			v, err = decodeAs[createTopicV1](body, cmdLimits)
			c = CreateTopic{Name: v.Name, Partitions: v.Partitions, Type: v.Type, Replicas: v.Replicas, Now: v.Now}
		case 2:
			var v createTopicV2
			v, err = decodeAs[createTopicV2](body, cmdLimits)
			c = CreateTopic{Name: v.Name, Partitions: v.Partitions, Type: v.Type, Replicas: v.Replicas, Now: v.Now, GroupSize: v.GroupSize}
		default:
			c, err = decodeAs[CreateTopic](body, cmdLimits)
		}
	case kindAlterTopic:
		c, err = decodeAs[AlterTopic](body, cmdLimits)
	case kindJoinGroup:
		c, err = decodeAs[JoinGroup](body, cmdLimits)
	case kindLeaveGroup:
		c, err = decodeAs[LeaveGroup](body, cmdLimits)
	case kindReleased:
		c, err = decodeAs[Released](body, cmdLimits)
	case kindSetACL:
		if b[1] < 5 {
			var v setACLV4
			v, err = decodeAs[setACLV4](body, cmdLimits)
			c = SetACL{Rules: rulesOf(v.Rules)}
			break
		}
		c, err = decodeAs[SetACL](body, cmdLimits)
	case kindSetInSync:
		c, err = decodeAs[SetInSync](body, cmdLimits)
	case kindPromote:
		c, err = decodeAs[Promote](body, cmdLimits)
	case kindReplaceFollower:
		c, err = decodeAs[ReplaceFollower](body, cmdLimits)
	case kindRenewEpoch:
		c, err = decodeAs[RenewEpoch](body, cmdLimits)
	case kindRejoined:
		c, err = decodeAs[Rejoined](body, cmdLimits)
	case kindDrainNode:
		c, err = decodeAs[DrainNode](body, cmdLimits)
	case kindMoveReplica:
		c, err = decodeAs[MoveReplica](body, cmdLimits)
	case kindRemoveNode:
		c, err = decodeAs[RemoveNode](body, cmdLimits)
	case kindMoveDone:
		c, err = decodeAs[MoveDone](body, cmdLimits)
	case kindAcceptLoss:
		c, err = decodeAs[AcceptLoss](body, cmdLimits)
	case kindHandOver:
		c, err = decodeAs[HandOver](body, cmdLimits)
	default:
		return nil, fmt.Errorf("%w: command kind %d", ErrCorrupt, k)
	}
	if err != nil {
		return nil, err
	}
	return c, nil
}

// decodeAs decodes body as a T, which must be a msgpack array, never a map
// of field names, within lim.
func decodeAs[T any](body []byte, lim wire.Limits) (T, error) {
	var v T
	if !isArray(body) {
		return v, fmt.Errorf("%w: %T is not a msgpack array", ErrCorrupt, v)
	}
	if err := wire.UnmarshalLimited(body, &v, lim); errors.Is(err, wire.ErrOverLimit) {
		return v, fmt.Errorf("%w: %T: %v", ErrInvalid, v, err) // well formed, over a limit Apply checks too
	} else if err != nil {
		return v, fmt.Errorf("%w: %T: %v", ErrCorrupt, v, err)
	}
	return v, nil
}

// isArray reports whether b starts with a msgpack array header.
func isArray(b []byte) bool {
	return len(b) > 0 && (b[0]&0xf0 == 0x90 || b[0] == 0xdc || b[0] == 0xdd)
}
