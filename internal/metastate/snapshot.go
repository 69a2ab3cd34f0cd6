package metastate

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/zeze-go/mq/internal/wire"
)

// A snapshot of the state, the content of a raft snapshot:
//
//	[4] snapMagic "ZMMS"
//	[1] snapVersion
//	[…] snapV7 as a msgpack array: every list sorted by its key, so equal
//	    states encode to equal bytes
//
// Version 2 added snapTopic.GroupSize and snapPart.Chunk; a version 1
// snapshot is read with every partition in a group of its own. Version 3
// added snapTopic.Alone, snapPart.InSync and snapPart.Version; a version 2
// snapshot is read with both replicas of a DoubleWrite partition in sync,
// at version 1. Version 4 added Rule.Group; a version 3 snapshot's rules
// match every group. Version 5 added snapNode.Incarnation, snapPart.Lost and
// snapV5.ClusterID; an older snapshot's nodes have none, no replica is
// lost, and the cluster has no id. Version 6 added snapNode.Draining; an
// older snapshot's nodes are not draining. Version 7 added
// snapPart.Accepted; an older snapshot's pairs gave up no copy's tail.
//
// The decoder checks what Apply keeps true: sorted unique keys, limits,
// replicas and members on known nodes, owners that are members. So a
// damaged snapshot is ErrCorrupt, never a state Apply could not reach.
const (
	snapMagic   = "ZMMS"
	snapVersion = 7
)

type snapV7 struct {
	_msgpack  struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Index     uint64
	Nodes     []snapNode
	Topics    []snapTopic
	Groups    []snapGroup
	ACL       []Rule
	ClusterID string
}

// snapV6 is a version 6 snapshot: its partitions lack Accepted.
type snapV6 struct {
	_msgpack  struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Index     uint64
	Nodes     []snapNode
	Topics    []snapTopicV6
	Groups    []snapGroup
	ACL       []Rule
	ClusterID string
}

// snapV5 is a version 5 snapshot: its nodes lack Draining.
type snapV5 struct {
	_msgpack  struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Index     uint64
	Nodes     []snapNodeV5
	Topics    []snapTopicV6
	Groups    []snapGroup
	ACL       []Rule
	ClusterID string
}

// v7 is v in version 7: no pair gave up a copy's tail.
func (v snapV6) v7() snapV7 {
	out := snapV7{Index: v.Index, Nodes: v.Nodes, Groups: v.Groups, ACL: v.ACL, ClusterID: v.ClusterID}
	for _, t := range v.Topics {
		st := snapTopic{Name: t.Name, Type: t.Type, Created: t.Created, GroupSize: t.GroupSize, Alone: t.Alone}
		for _, p := range t.Parts {
			st.Parts = append(st.Parts, snapPart{Replicas: p.Replicas, Leader: p.Leader, Epoch: p.Epoch, Chunk: p.Chunk,
				InSync: p.InSync, Version: p.Version, Lost: p.Lost})
		}
		out.Topics = append(out.Topics, st)
	}
	return out
}

// v6 is v in version 6: no node draining.
func (v snapV5) v6() snapV6 {
	out := snapV6{Index: v.Index, Topics: v.Topics, Groups: v.Groups, ACL: v.ACL, ClusterID: v.ClusterID}
	for _, n := range v.Nodes {
		out.Nodes = append(out.Nodes, snapNode{ID: n.ID, Addr: n.Addr, Voter: n.Voter, Up: n.Up, Joined: n.Joined, Session: n.Session,
			Incarnation: n.Incarnation})
	}
	return out
}

// snapV4 is a version 4 snapshot: its nodes lack Incarnation, its
// partitions Lost, and it has no cluster id.
type snapV4 struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Index    uint64
	Nodes    []snapNodeV4
	Topics   []snapTopicV4
	Groups   []snapGroup
	ACL      []Rule
}

// v5 is v in version 5: no incarnations, no lost replicas, no cluster id.
func (v snapV4) v5() snapV5 {
	out := snapV5{Index: v.Index, Groups: v.Groups, ACL: v.ACL}
	for _, n := range v.Nodes {
		out.Nodes = append(out.Nodes, snapNodeV5{ID: n.ID, Addr: n.Addr, Voter: n.Voter, Up: n.Up, Joined: n.Joined, Session: n.Session})
	}
	for _, t := range v.Topics {
		st := snapTopicV6{Name: t.Name, Type: t.Type, Created: t.Created, GroupSize: t.GroupSize, Alone: t.Alone}
		for _, p := range t.Parts {
			st.Parts = append(st.Parts, snapPartV6{Replicas: p.Replicas, Leader: p.Leader, Epoch: p.Epoch, Chunk: p.Chunk,
				InSync: p.InSync, Version: p.Version})
		}
		out.Topics = append(out.Topics, st)
	}
	return out
}

// snapV3 is a version 3 snapshot: its rules lack Group.
type snapV3 struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Index    uint64
	Nodes    []snapNodeV4
	Topics   []snapTopicV4
	Groups   []snapGroup
	ACL      []ruleV4
}

// v4 is v in version 4: its rules match every group.
func (v snapV3) v4() snapV4 {
	return snapV4{Index: v.Index, Nodes: v.Nodes, Topics: v.Topics, Groups: v.Groups, ACL: rulesOf(v.ACL)}
}

// snapV1 is a version 1 snapshot: its topics and partitions lack the
// fields of raft groups.
type snapV1 struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Index    uint64
	Nodes    []snapNodeV4
	Topics   []snapTopicV1
	Groups   []snapGroup
	ACL      []ruleV4
}

type snapTopicV1 struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Name     string
	Type     uint8
	Created  int64
	Parts    []snapPartV1
}

type snapPartV1 struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Replicas []string
	Leader   string
	Epoch    uint64
}

// v2 is v in version 2: every partition in a group of its own.
func (v snapV1) v2() snapV2 {
	out := snapV2{Index: v.Index, Nodes: v.Nodes, Groups: v.Groups, ACL: v.ACL}
	for _, t := range v.Topics {
		st := snapTopicV2{Name: t.Name, Type: t.Type, Created: t.Created, GroupSize: 1}
		for j, p := range t.Parts {
			st.Parts = append(st.Parts, snapPartV2{Replicas: p.Replicas, Leader: p.Leader, Epoch: p.Epoch, Chunk: j})
		}
		out.Topics = append(out.Topics, st)
	}
	return out
}

// snapV2 is a version 2 snapshot: its topics and partitions lack the
// fields of DoubleWrite pairs.
type snapV2 struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Index    uint64
	Nodes    []snapNodeV4
	Topics   []snapTopicV2
	Groups   []snapGroup
	ACL      []ruleV4
}

type snapTopicV2 struct {
	_msgpack  struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Name      string
	Type      uint8
	Created   int64
	Parts     []snapPartV2
	GroupSize int
}

type snapPartV2 struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Replicas []string
	Leader   string
	Epoch    uint64
	Chunk    int
}

// v3 is v in version 3: both replicas of a DoubleWrite partition in sync,
// at version 1, as CreateTopic places them.
func (v snapV2) v3() snapV3 {
	out := snapV3{Index: v.Index, Nodes: v.Nodes, Groups: v.Groups, ACL: v.ACL}
	for _, t := range v.Topics {
		st := snapTopicV4{Name: t.Name, Type: t.Type, Created: t.Created, GroupSize: t.GroupSize}
		for _, p := range t.Parts {
			sp := snapPartV4{Replicas: p.Replicas, Leader: p.Leader, Epoch: p.Epoch, Chunk: p.Chunk}
			if t.Type == TypeDoubleWrite {
				sp.InSync, sp.Version = slices.Clone(p.Replicas), 1
			}
			st.Parts = append(st.Parts, sp)
		}
		out.Topics = append(out.Topics, st)
	}
	return out
}

type snapNode struct {
	_msgpack    struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	ID          string
	Addr        string
	Voter       bool
	Up          bool
	Joined      uint64
	Session     uint64
	Incarnation string
	Draining    bool
}

// snapNodeV5 is a node in version 5, without Draining.
type snapNodeV5 struct {
	_msgpack    struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	ID          string
	Addr        string
	Voter       bool
	Up          bool
	Joined      uint64
	Session     uint64
	Incarnation string
}

// snapNodeV4 is a node before version 5, without Incarnation.
type snapNodeV4 struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	ID       string
	Addr     string
	Voter    bool
	Up       bool
	Joined   uint64
	Session  uint64
}

// snapTopicV4 and snapPartV4 are a topic and a partition in versions 3
// and 4, without Lost.
type snapTopicV4 struct {
	_msgpack  struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Name      string
	Type      uint8
	Created   int64
	Parts     []snapPartV4
	GroupSize int
	Alone     bool
}

type snapPartV4 struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Replicas []string
	Leader   string
	Epoch    uint64
	Chunk    int
	InSync   []string
	Version  uint64
}

type snapTopic struct {
	_msgpack  struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Name      string
	Type      uint8
	Created   int64
	Parts     []snapPart
	GroupSize int
	Alone     bool
}

type snapPart struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Replicas []string
	Leader   string
	Epoch    uint64
	Chunk    int
	InSync   []string
	Version  uint64
	Lost     []string
	Accepted uint64
}

// snapTopicV6 and snapPartV6 are a topic and a partition in versions 5
// and 6, without Accepted.
type snapTopicV6 struct {
	_msgpack  struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Name      string
	Type      uint8
	Created   int64
	Parts     []snapPartV6
	GroupSize int
	Alone     bool
}

type snapPartV6 struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Replicas []string
	Leader   string
	Epoch    uint64
	Chunk    int
	InSync   []string
	Version  uint64
	Lost     []string
}

type snapGroup struct {
	_msgpack   struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Topic      string
	Group      string
	Generation uint64
	Members    []snapMember // sorted by ID
	Owners     []string     // one per partition of the topic
	Revoking   []snapRevoke // sorted by Partition
}

type snapMember struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	ID       string
	Node     string
	Joined   uint64
}

type snapRevoke struct {
	_msgpack  struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Partition int
	Since     uint64
}

// EncodeSnapshot returns the encoding of s, laid out as above.
func EncodeSnapshot(s *State) ([]byte, error) {
	v := snapV7{Index: s.index, ACL: s.acl, ClusterID: s.cluster}
	for _, n := range s.Nodes() {
		v.Nodes = append(v.Nodes, snapNode{ID: n.ID, Addr: n.Addr, Voter: n.Voter, Up: n.Up, Joined: n.Joined, Session: n.Session,
			Incarnation: n.Incarnation, Draining: n.Draining})
	}
	for _, name := range s.Topics() {
		t := s.topics[name]
		st := snapTopic{Name: t.Name, Type: t.Type, Created: t.Created, GroupSize: t.GroupSize, Alone: t.Alone}
		for _, p := range t.Parts {
			st.Parts = append(st.Parts, snapPart{Replicas: p.Replicas, Leader: p.Leader, Epoch: p.Epoch, Chunk: p.Chunk,
				InSync: p.InSync, Version: p.Version, Lost: p.Lost, Accepted: p.Accepted})
		}
		v.Topics = append(v.Topics, st)
	}
	keys := slices.SortedFunc(maps.Keys(s.groups), compareKeys)
	for _, k := range keys {
		g := s.groups[k]
		sg := snapGroup{Topic: k.Topic, Group: k.Group, Generation: g.Generation, Owners: g.Owners}
		for _, id := range slices.Sorted(maps.Keys(g.Members)) {
			m := g.Members[id]
			sg.Members = append(sg.Members, snapMember{ID: id, Node: m.Node, Joined: m.Joined})
		}
		for _, p := range slices.Sorted(maps.Keys(g.Revoking)) {
			sg.Revoking = append(sg.Revoking, snapRevoke{Partition: p, Since: g.Revoking[p]})
		}
		v.Groups = append(v.Groups, sg)
	}
	body, err := msgpack.Marshal(&v)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot: %w", err)
	}
	return append(append([]byte(snapMagic), snapVersion), body...), nil
}

func compareKeys(a, b GroupKey) int {
	if c := strings.Compare(a.Topic, b.Topic); c != 0 {
		return c
	}
	return strings.Compare(a.Group, b.Group)
}

// snapLimits bound what DecodeSnapshot decodes from body by its bytes
// alone, as wire.Unmarshal does: a state holds as many nodes, topics and
// groups as its commands made, and state checks the limits of each. A
// snapshot comes from the metadata group's leader, never from a caller of
// an op.
func snapLimits(body []byte) wire.Limits {
	return wire.Limits{Elems: len(body), Bytes: len(body)}
}

// DecodeSnapshot decodes an encoded snapshot into a State, or returns
// ErrCorrupt.
func DecodeSnapshot(b []byte) (*State, error) {
	if len(b) < len(snapMagic)+2 || string(b[:len(snapMagic)]) != snapMagic {
		return nil, fmt.Errorf("%w: not a metadata snapshot", ErrCorrupt)
	}
	version := b[len(snapMagic)]
	if version < 1 || version > snapVersion {
		return nil, fmt.Errorf("%w: snapshot version %d", ErrCorrupt, version)
	}
	var v snapV7
	var err error
	switch body := b[len(snapMagic)+1:]; version {
	case 1:
		var v1 snapV1
		v1, err = decodeAs[snapV1](body, snapLimits(body))
		v = v1.v2().v3().v4().v5().v6().v7()
	case 2:
		var v2 snapV2
		v2, err = decodeAs[snapV2](body, snapLimits(body))
		v = v2.v3().v4().v5().v6().v7()
	case 3:
		var v3 snapV3
		v3, err = decodeAs[snapV3](body, snapLimits(body))
		v = v3.v4().v5().v6().v7()
	case 4:
		var v4 snapV4
		v4, err = decodeAs[snapV4](body, snapLimits(body))
		v = v4.v5().v6().v7()
	case 5:
		var v5 snapV5
		v5, err = decodeAs[snapV5](body, snapLimits(body))
		v = v5.v6().v7()
	case 6:
		var v6 snapV6
		v6, err = decodeAs[snapV6](body, snapLimits(body))
		v = v6.v7()
	default:
		v, err = decodeAs[snapV7](body, snapLimits(body))
	}
	if err != nil {
		return nil, err
	}
	s, err := v.state()
	if err != nil {
		return nil, fmt.Errorf("%w: snapshot: %v", ErrCorrupt, err)
	}
	return s, nil
}

// state builds and checks the State of a decoded snapshot.
func (v *snapV7) state() (*State, error) {
	s := New()
	s.index = v.Index
	if len(v.ClusterID) > MaxNameLen {
		return nil, fmt.Errorf("a cluster id of %d bytes", len(v.ClusterID))
	}
	s.cluster = v.ClusterID
	for i, n := range v.Nodes {
		if err := CheckNodeID(n.ID); err != nil {
			return nil, err
		}
		if i > 0 && v.Nodes[i-1].ID >= n.ID {
			return nil, fmt.Errorf("node %q out of order", n.ID)
		}
		if n.Addr == "" || len(n.Addr) > MaxNameLen || n.Session == 0 || len(n.Incarnation) > MaxNameLen {
			return nil, fmt.Errorf("node %s: address %q, session %d, incarnation of %d bytes", n.ID, n.Addr, n.Session, len(n.Incarnation))
		}
		s.nodes[n.ID] = Node{ID: n.ID, Addr: n.Addr, Voter: n.Voter, Up: n.Up, Joined: n.Joined, Session: n.Session,
			Incarnation: n.Incarnation, Draining: n.Draining}
	}
	for i, t := range v.Topics {
		if err := checkName("topic", t.Name); err != nil {
			return nil, err
		}
		if i > 0 && v.Topics[i-1].Name >= t.Name {
			return nil, fmt.Errorf("topic %q out of order", t.Name)
		}
		if t.Type != TypeSingle && t.Type != TypeDoubleWrite && t.Type != TypeRaft3 {
			return nil, fmt.Errorf("topic %s: type %d", t.Name, t.Type)
		}
		if len(t.Parts) < 1 || len(t.Parts) > MaxPartitions {
			return nil, fmt.Errorf("topic %s: %d partitions", t.Name, len(t.Parts))
		}
		if t.GroupSize < 1 || t.GroupSize > MaxGroupSize || t.GroupSize > 1 && !shares(t.Type) {
			return nil, fmt.Errorf("topic %s: %d partitions per group", t.Name, t.GroupSize)
		}
		if t.Alone && t.Type != TypeDoubleWrite {
			return nil, fmt.Errorf("topic %s: a leader alone in sync for type %d", t.Name, t.Type)
		}
		tp := Topic{Name: t.Name, Type: t.Type, Created: t.Created, GroupSize: t.GroupSize, Alone: t.Alone, Parts: make([]Partition, len(t.Parts))}
		for j, p := range t.Parts {
			// A group starts at its Chunk and goes on with the partitions
			// after it, at most GroupSize, all on the same replicas.
			if c := p.Chunk; c != j && (j == 0 || c != t.Parts[j-1].Chunk || j-c >= t.GroupSize ||
				!slices.Equal(p.Replicas, t.Parts[c].Replicas)) {
				return nil, fmt.Errorf("topic %s/%d: in the group of %d", t.Name, j, c)
			}
			n := len(p.Replicas)
			bad := n < 1 || n > MaxReplicas || n != len(t.Parts[0].Replicas)
			if t.Type == TypeSingle { // one, or two while it moves
				bad = n < 1 || n > 2 || n == 2 && p.Version == 0
			}
			if bad {
				return nil, fmt.Errorf("topic %s/%d: %d replicas", t.Name, j, len(p.Replicas))
			}
			for k, id := range p.Replicas {
				if _, ok := s.nodes[id]; !ok || slices.Contains(p.Replicas[:k], id) {
					return nil, fmt.Errorf("topic %s/%d: replica %q", t.Name, j, id)
				}
			}
			if !slices.Contains(p.Replicas, p.Leader) {
				return nil, fmt.Errorf("topic %s/%d: leader %q", t.Name, j, p.Leader)
			}
			if err := checkPair(t.Type, p); err != nil {
				return nil, fmt.Errorf("topic %s/%d: %v", t.Name, j, err)
			}
			if c := t.Parts[p.Chunk]; t.Type == TypeDoubleWrite && (p.Leader != c.Leader || p.Epoch != c.Epoch ||
				p.Version != c.Version || !slices.Equal(p.InSync, c.InSync) || p.Accepted != c.Accepted) {
				return nil, fmt.Errorf("topic %s/%d: a record other than its pair's (partition %d)", t.Name, j, p.Chunk)
			}
			if err := checkLost(t.Type, p); err != nil {
				return nil, fmt.Errorf("topic %s/%d: %v", t.Name, j, err)
			}
			if c := t.Parts[p.Chunk]; !slices.Equal(p.Lost, c.Lost) {
				return nil, fmt.Errorf("topic %s/%d: lost %q, its group's %q", t.Name, j, p.Lost, c.Lost)
			}
			if p.Accepted != 0 && (t.Type != TypeDoubleWrite || p.Accepted > p.Epoch || len(p.InSync) > 1) {
				return nil, fmt.Errorf("topic %s/%d: accepted a loss at epoch %d (epoch %d, type %d)", t.Name, j, p.Accepted, p.Epoch, t.Type)
			}
			tp.Parts[j] = Partition{Replicas: p.Replicas, Leader: p.Leader, Epoch: p.Epoch, Chunk: p.Chunk,
				InSync: p.InSync, Version: p.Version, Lost: p.Lost, Accepted: p.Accepted}
		}
		s.topics[t.Name] = tp
	}
	for i, sg := range v.Groups {
		k := GroupKey{sg.Topic, sg.Group}
		if err := checkName("group", sg.Group); err != nil {
			return nil, err
		}
		if i > 0 && compareKeys(GroupKey{v.Groups[i-1].Topic, v.Groups[i-1].Group}, k) >= 0 {
			return nil, fmt.Errorf("group %s/%s out of order", sg.Topic, sg.Group)
		}
		t, ok := s.topics[sg.Topic]
		if !ok || len(sg.Owners) != len(t.Parts) || len(sg.Members) > MaxMembers {
			return nil, fmt.Errorf("group %s/%s: %d owners, %d members", sg.Topic, sg.Group, len(sg.Owners), len(sg.Members))
		}
		g := ConsumerGroup{Generation: sg.Generation, Members: map[string]Member{}, Owners: sg.Owners, Revoking: map[int]uint64{}}
		for j, m := range sg.Members {
			if err := checkName("member", m.ID); err != nil {
				return nil, err
			}
			if j > 0 && sg.Members[j-1].ID >= m.ID {
				return nil, fmt.Errorf("group %s/%s: member %q out of order", sg.Topic, sg.Group, m.ID)
			}
			if nd, ok := s.nodes[m.Node]; !ok || !nd.Up {
				return nil, fmt.Errorf("group %s/%s: member %s on node %q", sg.Topic, sg.Group, m.ID, m.Node)
			}
			g.Members[m.ID] = Member{Node: m.Node, Joined: m.Joined}
		}
		for p, o := range sg.Owners {
			if _, ok := g.Members[o]; o != "" && !ok || o == "" && len(g.Members) > 0 {
				return nil, fmt.Errorf("group %s/%s: partition %d owner %q", sg.Topic, sg.Group, p, o)
			}
		}
		for j, r := range sg.Revoking {
			if r.Partition < 0 || r.Partition >= len(sg.Owners) || sg.Owners[r.Partition] == "" ||
				j > 0 && sg.Revoking[j-1].Partition >= r.Partition || r.Since == 0 || r.Since > sg.Generation {
				return nil, fmt.Errorf("group %s/%s: revoking %d since %d", sg.Topic, sg.Group, r.Partition, r.Since)
			}
			g.Revoking[r.Partition] = r.Since
		}
		s.groups[k] = g
	}
	if len(v.ACL) > MaxRules {
		return nil, fmt.Errorf("%d ACL rules", len(v.ACL))
	}
	for _, r := range v.ACL {
		if err := checkRule(r); err != nil {
			return nil, err
		}
	}
	s.acl = v.ACL
	return s, nil
}

// checkLost checks a partition's lost replicas: a Raft3 partition's, if
// any, are some of its replicas, sorted and unique; other types have none.
func checkLost(typ uint8, p snapPart) error {
	if p.Lost == nil {
		return nil
	}
	if typ != TypeRaft3 || len(p.Lost) == 0 {
		return fmt.Errorf("lost %q for type %d", p.Lost, typ)
	}
	for i, id := range p.Lost {
		if !slices.Contains(p.Replicas, id) || i > 0 && p.Lost[i-1] >= id {
			return fmt.Errorf("lost %q of replicas %q", p.Lost, p.Replicas)
		}
	}
	return nil
}

// checkPair checks the fields of a DoubleWrite pair in a partition of a
// topic of type typ: what SetInSync, Promote and ReplaceFollower keep true,
// the leader first in sync, the others replicas, and a version. A
// partition of another type has none of them, but a Single one's version
// (its moves).
func checkPair(typ uint8, p snapPart) error {
	if typ == TypeSingle {
		if p.InSync != nil {
			return fmt.Errorf("in sync %q for type %d", p.InSync, typ)
		}
		return nil
	}
	if typ != TypeDoubleWrite {
		if p.InSync != nil || p.Version != 0 {
			return fmt.Errorf("in sync %q, version %d for type %d", p.InSync, p.Version, typ)
		}
		return nil
	}
	if p.Version == 0 || len(p.InSync) > len(p.Replicas) || len(p.InSync) > 0 && p.InSync[0] != p.Leader ||
		len(p.InSync) == 2 && (p.InSync[1] == p.Leader || !slices.Contains(p.Replicas, p.InSync[1])) {
		return fmt.Errorf("in sync %q of replicas %q led by %q, version %d", p.InSync, p.Replicas, p.Leader, p.Version)
	}
	return nil
}
