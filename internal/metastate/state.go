package metastate

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Limits of the state, checked by Apply and by the snapshot decoder.
const (
	MaxPartitions = 1024 // partitions of one topic: internal/topicdb's limit
	MaxReplicas   = 3    // replicas of one partition
	MaxNameLen    = 255  // topic, group, member, address and ACL pattern bytes
	MaxNodeIDLen  = 64   // node id bytes: [A-Za-z0-9._-], a certificate's DNS name
	MaxRules      = 1024 // ACL rules
	MaxMembers    = 1024 // members of one consumer group
	// MaxGroupSize is the most partitions of a Raft3 or DoubleWrite topic
	// that share one raft group or pair (Topic.GroupSize).
	MaxGroupSize = 64
)

// Replication types of a topic: the root's Type values.
const (
	TypeSingle      uint8 = 1
	TypeDoubleWrite uint8 = 2
	TypeRaft3       uint8 = 4
)

// Rights is a bitmask of what an ACL rule allows. The rights are
// independent: Admin does not imply Produce.
type Rights uint8

// The rights of an ACL rule.
const (
	RightProduce Rights = 1 << iota
	RightConsume
	RightAdmin

	rightsAll = RightProduce | RightConsume | RightAdmin
)

// String names the rights: "produce|consume|admin", "nothing" for none.
func (r Rights) String() string {
	var parts []string
	for _, x := range []struct {
		r    Rights
		name string
	}{{RightProduce, "produce"}, {RightConsume, "consume"}, {RightAdmin, "admin"}} {
		if r&x.r != 0 {
			parts = append(parts, x.name)
		}
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, "|")
}

// Rule is one ACL rule: identities matching Identity may do Rights on the
// topics matching Topic, and in the consumer groups matching Group where
// an operation names a group (AllowedGroup); an empty Group matches every
// group, as "*" does. A pattern is an exact name, a prefix followed by
// "*", or "*" alone, which matches anything.
type Rule struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Identity string
	Topic    string
	Rights   Rights
	Group    string
}

// ruleV4 is a Rule in command version 4 and snapshot version 3 and
// before, without Group: it matches every group.
type ruleV4 struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Identity string
	Topic    string
	Rights   Rights
}

// rulesOf returns old rules as Rules, matching every group.
func rulesOf(old []ruleV4) []Rule {
	if old == nil {
		return nil
	}
	out := make([]Rule, len(old))
	for i, r := range old {
		out[i] = Rule{Identity: r.Identity, Topic: r.Topic, Rights: r.Rights}
	}
	return out
}

// Node is a node of the cluster as the metadata group records it.
type Node struct {
	ID      string
	Addr    string
	Voter   bool   // a raft voter of the metadata group, else a nonvoter
	Up      bool   // false once its session expired, until it registers again
	Joined  uint64 // log index of its first registration
	Session uint64 // 1 at the first registration, +1 each time it comes back up
	// Incarnation is the identity of the node's data directory, made at
	// its first Open and kept with it; "" for a node of an older release
	// until it registers with one. A registration with another is a new
	// incarnation: the directory lost what the node held.
	Incarnation string
	// Draining is set by DrainNode: placement puts nothing more on the
	// node, and the metadata leader moves its replicas to other nodes.
	Draining bool
}

// Topic is a topic with its partitions' placement.
type Topic struct {
	Name    string
	Type    uint8
	Created int64 // unix ns, stamped by the CreateTopic proposer
	// GroupSize is, for a Raft3 or DoubleWrite topic, how many of the
	// partitions placed together, by CreateTopic or by one AlterTopic,
	// share one replicated log, a raft group or a pair: they have the same
	// replicas, and one entry of that log carries commands of several of
	// them. A DoubleWrite chunk's partitions also share their record, the
	// leader, epoch, in-sync set and version: a change of one is a change
	// of all. 1 for the other types.
	GroupSize int
	Parts     []Partition
	// Alone is, for a DoubleWrite topic, whether a partition's leader may
	// ack sends while it alone is in sync: the risk stage, in which an ack
	// is one copy. False for the other types.
	Alone bool
}

// shares reports whether a topic of type typ may have partitions share a
// log (GroupSize > 1).
func shares(typ uint8) bool { return typ == TypeRaft3 || typ == TypeDoubleWrite }

// Chunk returns the partitions sharing partition i's raft group or pair:
// the first, and how many, 1 when it shares none.
func (t Topic) Chunk(i int) (first, n int) {
	first = t.Parts[i].Chunk
	for n = 1; first+n < len(t.Parts) && t.Parts[first+n].Chunk == first; n++ {
	}
	return first, n
}

// Partition is one partition's placement: the nodes holding its replicas,
// the leader among them and the leader's epoch, which a DoubleWrite pair
// raises with each new run of its leader so that a replica can refuse a
// stale one.
type Partition struct {
	Replicas []string
	Leader   string
	Epoch    uint64
	// Chunk is the index of the first partition of the raft group or pair
	// this one shares (Topic.GroupSize); the partition's own index when it
	// shares none.
	Chunk int
	// InSync is, for a DoubleWrite partition, the replicas holding every
	// batch its leader acked, the leader first: the follower is promoted
	// only from it. Nil for the other types.
	InSync []string
	// Version is, for a DoubleWrite partition, raised by every change of
	// its record (SetInSync, Promote, ReplaceFollower, RenewEpoch): the
	// token their compare-and-set carries; for a Single one, raised by
	// each start, retarget, cancel and end of a move (MoveReplica,
	// MoveDone), whose second replica, while it runs, is the node it
	// moves to. 0 for Raft3.
	Version uint64
	// Lost is, for a Raft3 partition, its replicas whose node came back
	// as a new incarnation (its data directory replaced) and that have
	// not yet rejoined the raft group as new servers (Rejoined): such a
	// replica never bootstraps the group, never votes, and its group's
	// leader removes it and adds it back as a nonvoter, promoted once it
	// caught up. Sorted; nil for the other types and while none is lost.
	Lost []string
	// Accepted is, for a DoubleWrite partition, the epoch an operator's
	// AcceptLoss began: its leader gave up the tail its lost copy alone
	// held, and new sends take those offsets. The leader fences every
	// consumer group first (store.OpFence), so that no position taken from
	// that tail skips them. 0 once both replicas are in sync again, since
	// each then holds the fence, and for the other types.
	Accepted uint64
}

// Follower returns a DoubleWrite partition's follower: its replica that
// is not the leader.
func (p Partition) Follower() string {
	for _, id := range p.Replicas {
		if id != p.Leader {
			return id
		}
	}
	return ""
}

// GroupKey names a consumer group: groups are per topic.
type GroupKey struct {
	Topic string
	Group string
}

// ConsumerGroup is a consumer group's coordination state.
type ConsumerGroup struct {
	// Generation is raised by every change of the group's members or
	// assignment; offset commits carry it and are fenced by it.
	Generation uint64
	Members    map[string]Member // member id → member
	// Owners is indexed by partition: the member owning it, "" for none. A
	// partition being revoked is still its owner's.
	Owners []string
	// Revoking maps a partition being revoked from its owner to the
	// generation at which the revocation started; the partition moves when
	// the owner sends Released with a generation at least that.
	Revoking map[int]uint64
}

// Member is a consumer-group member.
type Member struct {
	Node   string
	Joined uint64 // log index of its JoinGroup
}

// Result is what an applied command returned.
type Result struct {
	Index      uint64 // log index of the command
	Generation uint64 // the group's generation after JoinGroup, LeaveGroup, Released
	Session    uint64 // the node's session after RegisterNode
	Topic      Topic  // the topic after CreateTopic, AlterTopic
}

// State is one version of the metadata, immutable once published: reading
// it needs no lock, and Apply builds the next version beside it, copying
// what a command changes. Values returned by its methods share its memory
// and must not be modified. Safe for concurrent use.
type State struct {
	index   uint64 // log index of the last command applied without error
	nodes   map[string]Node
	topics  map[string]Topic
	groups  map[GroupKey]ConsumerGroup
	acl     []Rule
	cluster string        // the cluster's id, set by its first registration that carries one
	changed chan struct{} // closed when a newer version is published
}

// New returns the empty state, the one before the first command.
func New() *State {
	return &State{
		nodes:   map[string]Node{},
		topics:  map[string]Topic{},
		groups:  map[GroupKey]ConsumerGroup{},
		changed: make(chan struct{}),
	}
}

// Index returns the log index of the last command applied without error.
func (s *State) Index() uint64 { return s.index }

// ClusterID returns the cluster's id: made by the node that started the
// cluster, recorded by the first registration that carries one, and by
// every node's directory; "" for a cluster of an older release until
// then.
func (s *State) ClusterID() string { return s.cluster }

// Changed returns a channel closed when a newer State is published.
func (s *State) Changed() <-chan struct{} { return s.changed }

// Replaced closes the channel of Changed: the one who publishes states
// calls it once, when a newer version replaces s.
func (s *State) Replaced() { close(s.changed) }

// Node returns the node with that id.
func (s *State) Node(id string) (Node, bool) {
	n, ok := s.nodes[id]
	return n, ok
}

// Nodes returns all nodes sorted by id.
func (s *State) Nodes() []Node {
	out := slices.Collect(maps.Values(s.nodes))
	slices.SortFunc(out, func(a, b Node) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Topic returns the topic with that name.
func (s *State) Topic(name string) (Topic, bool) {
	t, ok := s.topics[name]
	return t, ok
}

// Topics returns the topic names, sorted.
func (s *State) Topics() []string {
	return slices.Sorted(maps.Keys(s.topics))
}

// Partition returns the placement of a topic's partition.
func (s *State) Partition(topic string, p int) (Partition, bool) {
	t, ok := s.topics[topic]
	if !ok || p < 0 || p >= len(t.Parts) {
		return Partition{}, false
	}
	return t.Parts[p], true
}

// GroupsOn returns the groups with a member on node, sorted.
func (s *State) GroupsOn(node string) []GroupKey {
	var out []GroupKey
	for k, g := range s.groups {
		for _, m := range g.Members {
			if m.Node == node {
				out = append(out, k)
				break
			}
		}
	}
	slices.SortFunc(out, func(a, b GroupKey) int { return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Group, b.Group)) })
	return out
}

// Group returns the record of group on topic, or false when the state has
// none.
func (s *State) Group(topic, group string) (ConsumerGroup, bool) {
	g, ok := s.groups[GroupKey{topic, group}]
	return g, ok
}

// Assignment returns the group's generation and the partitions member owns
// in it, sorted, including those being revoked from it (see Revoking): the
// member may consume and commit them until it releases them.
func (s *State) Assignment(topic, group, member string) (gen uint64, parts []int) {
	g, ok := s.groups[GroupKey{topic, group}]
	if !ok {
		return 0, nil
	}
	for p, o := range g.Owners {
		if o == member {
			parts = append(parts, p)
		}
	}
	return g.Generation, parts
}

// Revoking returns the partitions being revoked from member, sorted: its
// node stops consuming them, commits, and proposes Released for each.
func (s *State) Revoking(topic, group, member string) (gen uint64, parts []int) {
	g, ok := s.groups[GroupKey{topic, group}]
	if !ok {
		return 0, nil
	}
	for p := range g.Revoking {
		if g.Owners[p] == member {
			parts = append(parts, p)
		}
	}
	slices.Sort(parts)
	return g.Generation, parts
}

// Owner returns the member owning a partition for a group and the group's
// generation; member is "" if no one owns it.
func (s *State) Owner(topic, group string, partition int) (member string, gen uint64) {
	g, ok := s.groups[GroupKey{topic, group}]
	if !ok || partition < 0 || partition >= len(g.Owners) {
		return "", g.Generation
	}
	return g.Owners[partition], g.Generation
}

// Owns is the fence of offset commits: it reports whether member owns the
// partition in generation gen, which must be the group's current one. A
// partition has at most one owner per generation, so a member acting on an
// older generation is refused until it reads its new assignment.
func (s *State) Owns(topic, group, member string, partition int, gen uint64) bool {
	o, g := s.Owner(topic, group, partition)
	return member != "" && o == member && g == gen
}

// ACL returns the access rules; none means access control is off.
func (s *State) ACL() []Rule { return s.acl }

// Allowed reports whether identity may do right on topic: always when there
// are no rules, else when some rule matching both grants it.
func (s *State) Allowed(identity, topic string, right Rights) bool {
	if len(s.acl) == 0 {
		return true
	}
	for _, r := range s.acl {
		if r.Rights&right == right && matchPattern(r.Identity, identity) && matchPattern(r.Topic, topic) {
			return true
		}
	}
	return false
}

// AllowedGroup reports whether identity may do right on topic for the
// consumer group group: always when there are no rules, else when some
// rule matching all three grants it. A broadcasting consumer's offsets,
// group@instance, are its group's: a rule's Group matches the name before
// the '@'.
func (s *State) AllowedGroup(identity, topic, group string, right Rights) bool {
	if len(s.acl) == 0 {
		return true
	}
	if g, _, ok := strings.Cut(group, "@"); ok {
		group = g
	}
	for _, r := range s.acl {
		if r.Rights&right == right && matchPattern(r.Identity, identity) && matchPattern(r.Topic, topic) &&
			(r.Group == "" || matchPattern(r.Group, group)) {
			return true
		}
	}
	return false
}

// NamesIdentity reports whether some rule names identity exactly, whatever
// it grants: its identity pattern is identity itself, not a prefix and
// '*' that matches it.
func NamesIdentity(rules []Rule, identity string) bool {
	return !strings.Contains(identity, "*") && slices.ContainsFunc(rules, func(r Rule) bool { return r.Identity == identity })
}

func matchPattern(pattern, s string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(s, prefix)
	}
	return pattern == s
}

// clone returns a copy of s whose maps can be changed; the entries are
// shared and replaced, never modified, by the caller.
func (s *State) clone() *State {
	return &State{
		index:   s.index,
		cluster: s.cluster,
		nodes:   maps.Clone(s.nodes),
		topics:  maps.Clone(s.topics),
		groups:  maps.Clone(s.groups),
		acl:     s.acl,
		changed: make(chan struct{}),
	}
}

// Apply returns the state after c at log index index, and c's result. On
// an error s is unchanged and next is nil. Apply is deterministic: every map
// walk that affects the result is sorted.
func (s *State) Apply(index uint64, c Command) (next *State, res Result, err error) {
	res.Index = index
	n := s.clone()
	n.index = index
	switch c := c.(type) {
	case RegisterNode:
		res.Session, err = n.registerNode(index, c)
	case NodeDown:
		err = n.nodeDown(c)
	case CreateTopic:
		res.Topic, err = n.createTopic(c)
	case AlterTopic:
		res.Topic, err = n.alterTopic(c)
	case JoinGroup:
		res.Generation, err = n.joinGroup(index, c)
	case LeaveGroup:
		res.Generation, err = n.leaveGroup(c)
	case Released:
		res.Generation, err = n.released(c)
	case SetACL:
		err = n.setACL(c)
	case SetInSync:
		res.Topic, err = n.setInSync(c)
	case Promote:
		res.Topic, err = n.promote(c)
	case ReplaceFollower:
		res.Topic, err = n.replaceFollower(c)
	case RenewEpoch:
		res.Topic, err = n.renewEpoch(c)
	case Rejoined:
		res.Topic, err = n.rejoined(c)
	case DrainNode:
		err = n.drainNode(c)
	case MoveReplica:
		res.Topic, err = n.moveReplica(c)
	case RemoveNode:
		err = n.removeNode(c)
	case MoveDone:
		res.Topic, err = n.moveDone(c)
	case AcceptLoss:
		res.Topic, err = n.acceptLoss(c)
	case HandOver:
		res.Topic, err = n.handOver(c)
	default:
		err = fmt.Errorf("%w: command %T", ErrInvalid, c)
	}
	if err != nil {
		return nil, Result{Index: index}, err
	}
	return n, res, nil
}

func (s *State) registerNode(index uint64, c RegisterNode) (uint64, error) {
	if err := CheckNodeID(c.ID); err != nil {
		return 0, err
	}
	if c.Addr == "" || len(c.Addr) > MaxNameLen {
		return 0, fmt.Errorf("%w: node %s address of %d bytes", ErrInvalid, c.ID, len(c.Addr))
	}
	nd, ok := s.nodes[c.ID]
	if !ok {
		nd = Node{ID: c.ID, Joined: index}
	}
	if len(c.Incarnation) > MaxNameLen || len(c.Cluster) > MaxNameLen {
		return 0, fmt.Errorf("%w: node %s incarnation of %d bytes, cluster id of %d", ErrInvalid, c.ID, len(c.Incarnation), len(c.Cluster))
	}
	if c.Cluster != "" && s.cluster != "" && c.Cluster != s.cluster {
		return 0, fmt.Errorf("%w: node %s of cluster %s, this is %s", ErrWrongCluster, c.ID, c.Cluster, s.cluster)
	}
	if s.cluster == "" {
		s.cluster = c.Cluster
	}
	reborn := ok && nd.Incarnation != "" && c.Incarnation != "" && c.Incarnation != nd.Incarnation
	if !nd.Up || reborn {
		nd.Up = true
		nd.Session++
	}
	if c.Incarnation != "" {
		nd.Incarnation = c.Incarnation
	}
	nd.Addr, nd.Voter = c.Addr, c.Voter
	s.nodes[c.ID] = nd
	if reborn {
		s.dropMembers(c.ID) // the old process's members are gone with it
		s.lostCopies(c.ID)
	}
	return nd.Session, nil
}

func (s *State) nodeDown(c NodeDown) error {
	nd, ok := s.nodes[c.ID]
	if !ok {
		return fmt.Errorf("%w: %q", ErrNoNode, c.ID)
	}
	if !nd.Up || c.Session != nd.Session {
		return fmt.Errorf("%w: node %s session %d (current %d, up %t)", ErrStaleSession, c.ID, c.Session, nd.Session, nd.Up)
	}
	nd.Up = false
	s.nodes[c.ID] = nd
	s.dropMembers(c.ID)
	return nil
}

// dropMembers removes node id's consumer-group members from their groups,
// which rebalance.
func (s *State) dropMembers(id string) {
	for k, g := range s.groups { // each group on its own: the order does not matter
		var gone []string
		for mid, m := range g.Members {
			if m.Node == id {
				gone = append(gone, mid)
			}
		}
		if len(gone) == 0 {
			continue
		}
		g = g.clone()
		for _, mid := range gone {
			delete(g.Members, mid)
		}
		s.groups[k] = s.rebalance(g)
	}
}

func (s *State) createTopic(c CreateTopic) (Topic, error) {
	if err := checkName("topic", c.Name); err != nil {
		return Topic{}, err
	}
	if c.Partitions < 1 || c.Partitions > MaxPartitions {
		return Topic{}, fmt.Errorf("%w: topic %s: %d partitions (1..%d)", ErrInvalid, c.Name, c.Partitions, MaxPartitions)
	}
	want := 0
	switch c.Type {
	case TypeSingle:
		want = 1
	case TypeDoubleWrite:
		want = 2
	case TypeRaft3:
		want = 3
	default:
		return Topic{}, fmt.Errorf("%w: topic %s: type %d", ErrInvalid, c.Name, c.Type)
	}
	r := c.Replicas
	if r == 0 {
		r = want
	}
	if r != want {
		return Topic{}, fmt.Errorf("%w: topic %s: %d replicas for type %d (%d)", ErrInvalid, c.Name, c.Replicas, c.Type, want)
	}
	size := max(c.GroupSize, 1) // 0: a command of version 1, before groups were shared
	if size > MaxGroupSize || size > 1 && !shares(c.Type) {
		return Topic{}, fmt.Errorf("%w: topic %s: %d partitions per group for type %d (Raft3, DoubleWrite: 1..%d)", ErrInvalid, c.Name, c.GroupSize, c.Type, MaxGroupSize)
	}
	if _, ok := s.topics[c.Name]; ok {
		return Topic{}, fmt.Errorf("%w: %s", ErrTopicExists, c.Name)
	}
	parts, err := s.place(0, c.Partitions, r, size)
	if err != nil {
		return Topic{}, fmt.Errorf("topic %s: %w", c.Name, err)
	}
	if c.AllowAlone && c.Type != TypeDoubleWrite {
		return Topic{}, fmt.Errorf("%w: topic %s: a leader alone in sync is an option of DoubleWrite, not of type %d", ErrInvalid, c.Name, c.Type)
	}
	t := Topic{Name: c.Name, Type: c.Type, Created: c.Now, GroupSize: size, Parts: pairs(c.Type, parts), Alone: c.AllowAlone}
	s.topics[c.Name] = t
	return t, nil
}

func (s *State) alterTopic(c AlterTopic) (Topic, error) {
	t, ok := s.topics[c.Name]
	if !ok {
		return Topic{}, fmt.Errorf("%w: %s", ErrNoTopic, c.Name)
	}
	switch {
	case c.Partitions < len(t.Parts):
		return Topic{}, fmt.Errorf("%w: %s has %d, asked %d", ErrPartitionDecrease, c.Name, len(t.Parts), c.Partitions)
	case c.Partitions > MaxPartitions:
		return Topic{}, fmt.Errorf("%w: topic %s: %d partitions (1..%d)", ErrInvalid, c.Name, c.Partitions, MaxPartitions)
	case c.Partitions == len(t.Parts):
		return t, nil
	}
	replicas := len(t.Parts[0].Replicas)
	if t.Type == TypeSingle {
		replicas = 1 // the first partition may be moving, with two
	}
	added, err := s.place(len(t.Parts), c.Partitions-len(t.Parts), replicas, t.GroupSize)
	if err != nil {
		return Topic{}, fmt.Errorf("topic %s: %w", c.Name, err)
	}
	t.Parts = append(slices.Clip(t.Parts), pairs(t.Type, added)...)
	s.topics[c.Name] = t
	for _, k := range s.groupsOf(c.Name) {
		g := s.groups[k].clone()
		g.Owners = append(g.Owners, make([]string, len(added))...)
		s.groups[k] = s.rebalance(g)
	}
	return t, nil
}

// place returns the placement of n new partitions of r replicas each, the
// first of them partition first of its topic, in groups of size: every
// group goes to the r live nodes holding the fewest replicas, ties by node
// id, counting the partitions placed before it; its partitions all have
// those replicas, and the group's first partition as their Chunk. The
// first replica is the leader, at epoch 1.
func (s *State) place(first, n, r, size int) ([]Partition, error) {
	type load struct {
		id       string
		replicas int
	}
	var up []load
	count := s.replicaCounts()
	for id, nd := range s.nodes {
		if nd.Up && !nd.Draining {
			up = append(up, load{id, count[id]})
		}
	}
	if len(up) < r {
		return nil, fmt.Errorf("%w: %d up, %d replicas needed", ErrNotEnoughNodes, len(up), r)
	}
	byLoad := func(a, b load) int {
		return cmp.Or(cmp.Compare(a.replicas, b.replicas), strings.Compare(a.id, b.id))
	}
	parts := make([]Partition, n)
	for i := 0; i < n; i += size {
		k := min(size, n-i) // the group's partitions
		slices.SortFunc(up, byLoad)
		reps := make([]string, r)
		for j := range reps {
			reps[j] = up[j].id
			up[j].replicas += k
		}
		for j := i; j < i+k; j++ {
			parts[j] = Partition{Replicas: slices.Clone(reps), Leader: reps[0], Epoch: 1, Chunk: first + i}
		}
	}
	return parts, nil
}

// replicaCounts returns how many replicas each node holds, the load that
// placement evens out.
func (s *State) replicaCounts() map[string]int {
	count := map[string]int{}
	for _, t := range s.topics {
		for _, p := range t.Parts {
			for _, id := range p.Replicas {
				count[id]++
			}
		}
	}
	return count
}

func (s *State) groupsOf(topic string) []GroupKey {
	var ks []GroupKey
	for k := range s.groups {
		if k.Topic == topic {
			ks = append(ks, k)
		}
	}
	return ks
}

func (s *State) joinGroup(index uint64, c JoinGroup) (uint64, error) {
	if err := checkName("group", c.Group); err != nil {
		return 0, err
	}
	if err := checkName("member", c.Member); err != nil {
		return 0, err
	}
	t, ok := s.topics[c.Topic]
	if !ok {
		return 0, fmt.Errorf("%w: %s", ErrNoTopic, c.Topic)
	}
	nd, ok := s.nodes[c.Node]
	if !ok {
		return 0, fmt.Errorf("%w: %q", ErrNoNode, c.Node)
	}
	if !nd.Up {
		return 0, fmt.Errorf("%w: %s", ErrNodeDown, c.Node)
	}
	k := GroupKey{c.Topic, c.Group}
	g, ok := s.groups[k]
	if !ok {
		g = ConsumerGroup{Owners: make([]string, len(t.Parts))}
	}
	if m, ok := g.Members[c.Member]; ok {
		if m.Node != c.Node {
			return 0, fmt.Errorf("%w: %s on %s, joining from %s", ErrMemberExists, c.Member, m.Node, c.Node)
		}
		return g.Generation, nil
	}
	if len(g.Members) >= MaxMembers {
		return 0, fmt.Errorf("%w: group %s/%s has %d members", ErrInvalid, c.Topic, c.Group, len(g.Members))
	}
	g = g.clone()
	g.Members[c.Member] = Member{Node: c.Node, Joined: index}
	g = s.rebalance(g)
	s.groups[k] = g
	return g.Generation, nil
}

func (s *State) leaveGroup(c LeaveGroup) (uint64, error) {
	k := GroupKey{c.Topic, c.Group}
	g, ok := s.groups[k]
	if !ok {
		return 0, fmt.Errorf("%w: %s/%s", ErrNoGroup, c.Topic, c.Group)
	}
	if _, ok := g.Members[c.Member]; !ok {
		return 0, fmt.Errorf("%w: %s in %s/%s", ErrNoMember, c.Member, c.Topic, c.Group)
	}
	g = g.clone()
	delete(g.Members, c.Member)
	g = s.rebalance(g)
	s.groups[k] = g
	return g.Generation, nil
}

func (s *State) released(c Released) (uint64, error) {
	k := GroupKey{c.Topic, c.Group}
	g, ok := s.groups[k]
	if !ok {
		return 0, fmt.Errorf("%w: %s/%s", ErrNoGroup, c.Topic, c.Group)
	}
	since, revoking := g.Revoking[c.Partition]
	if c.Partition < 0 || c.Partition >= len(g.Owners) || !revoking || g.Owners[c.Partition] != c.Member ||
		c.Generation < since || c.Generation > g.Generation {
		return 0, fmt.Errorf("%w: %s/%s partition %d member %s generation %d", ErrNotRevoking, c.Topic, c.Group, c.Partition, c.Member, c.Generation)
	}
	g = g.clone()
	g.Owners[c.Partition] = ""
	g = s.rebalance(g)
	s.groups[k] = g
	return g.Generation, nil
}

func (s *State) setACL(c SetACL) error {
	if len(c.Rules) > MaxRules {
		return fmt.Errorf("%w: %d ACL rules (at most %d)", ErrInvalid, len(c.Rules), MaxRules)
	}
	for _, r := range c.Rules {
		if err := checkRule(r); err != nil {
			return err
		}
	}
	s.acl = nil
	if len(c.Rules) > 0 {
		s.acl = slices.Clone(c.Rules)
	}
	return nil
}

func checkRule(r Rule) error {
	if r.Identity == "" || len(r.Identity) > MaxNameLen || r.Topic == "" || len(r.Topic) > MaxNameLen ||
		r.Rights == 0 || r.Rights&^rightsAll != 0 || len(r.Group) > MaxNameLen {
		return fmt.Errorf("%w: ACL rule %q %q group %q rights %#x", ErrInvalid, r.Identity, r.Topic, r.Group, r.Rights)
	}
	return nil
}

func (g ConsumerGroup) clone() ConsumerGroup {
	return ConsumerGroup{
		Generation: g.Generation,
		Members:    cloneMap(g.Members),
		Owners:     slices.Clone(g.Owners),
		Revoking:   cloneMap(g.Revoking),
	}
}

// cloneMap is maps.Clone, but never nil.
func cloneMap[K comparable, V any](m map[K]V) map[K]V {
	c := make(map[K]V, len(m))
	maps.Copy(c, m)
	return c
}

// rebalance returns g, a private copy, reassigned after a change, at the
// next generation:
//
//  1. A partition whose owner left is free.
//  2. Each member's share is ⌊P/n⌋ or one more, the first P mod n members
//     to claim one getting the extra: a member keeps the partitions it
//     owns in partition order while under its share (sticky).
//  3. Free partitions go to the member with the fewest, ties by member id.
//  4. A partition whose target is not its current owner is revoked: it
//     stays its owner's until Released or until the owner leaves, then
//     step 3 gives it to the member short of its share.
func (s *State) rebalance(g ConsumerGroup) ConsumerGroup {
	g.Generation++
	for p, o := range g.Owners {
		if _, ok := g.Members[o]; !ok {
			g.Owners[p] = ""
		}
	}
	members := slices.Sorted(maps.Keys(g.Members))
	target := assign(members, g.Owners)
	for p, o := range g.Owners {
		switch {
		case o == "":
			g.Owners[p] = target[p]
			delete(g.Revoking, p)
		case o == target[p]:
			delete(g.Revoking, p)
		default:
			if _, ok := g.Revoking[p]; !ok {
				g.Revoking[p] = g.Generation
			}
		}
	}
	return g
}

// assign returns the target owner of each partition for the sorted members,
// given the current owners ("" for a free partition): rebalance's steps 2–3.
func assign(members []string, owners []string) []string {
	target := make([]string, len(owners))
	n := len(members)
	if n == 0 {
		return target
	}
	quota, extra := len(owners)/n, len(owners)%n
	count := make(map[string]int, n)
	take := func(m string, p int) {
		target[p] = m
		if count[m] == quota {
			extra--
		}
		count[m]++
	}
	for p, o := range owners {
		if o == "" {
			continue
		}
		if c := count[o]; c < quota || c == quota && extra > 0 {
			take(o, p)
		}
	}
	for p := range target {
		if target[p] != "" {
			continue
		}
		// The member with the fewest is under its share: the shares add
		// up to the partition count.
		best := members[0]
		for _, m := range members[1:] {
			if count[m] < count[best] {
				best = m
			}
		}
		take(best, p)
	}
	return target
}

func checkName(what, name string) error {
	if name == "" || len(name) > MaxNameLen {
		return fmt.Errorf("%w: %s name of %d bytes (1..%d)", ErrInvalid, what, len(name), MaxNameLen)
	}
	return nil
}

// CheckNodeID returns ErrInvalid for an id that is not a node id: 1 to
// MaxNodeIDLen bytes of [A-Za-z0-9._-], internal/transport's rule, since a
// node id is the DNS name of its certificate.
func CheckNodeID(id string) error {
	if id == "" || len(id) > MaxNodeIDLen {
		return fmt.Errorf("%w: node id of %d bytes (1..%d)", ErrInvalid, len(id), MaxNodeIDLen)
	}
	for _, c := range []byte(id) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%w: node id %q", ErrInvalid, id)
		}
	}
	return nil
}
