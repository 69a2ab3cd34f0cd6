package metastate

import (
	"fmt"
	"slices"
)

// DrainNode marks node ID draining (Draining true) or takes the mark off:
// a draining node gets no new replica, and the metadata leader moves its
// replicas to other nodes (MoveReplica, Promote). It returns ErrNoNode for
// a node never registered.
type DrainNode struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	ID       string
	Draining bool
}

// MoveReplica moves the replica of partition Partition's raft group or
// pair (the whole chunk, Topic.Chunk) on node From to node To, or, with To
// empty, to the node placement would choose: up, not draining, holding
// none of the chunk's replicas, the least loaded.
//
// Raft3: To takes From's place among the replicas and is lost (Lost), a
// new server: it never bootstraps the group or votes until it caught up
// and rejoined (Rejoined), and the group's leader removes From from its
// configuration once the placed replicas are voters. Refused (ErrInvalid)
// while a replica other than From is lost: one new server at a time. DoubleWrite: From
// must be the pair's follower, and the record must be at Version (ErrStale
// otherwise); To becomes the follower at the next epoch, with the leader
// alone in sync until it caught up, as ReplaceFollower does.
//
// Single: the record must be at Version (ErrStale otherwise), and From
// the partition's node, Replicas[0]. The move starts:
// To becomes Replicas[1], and the version rises; the partition's node
// freezes it when To asks for it at that version, To copies it and ends
// the move with MoveDone. While a move runs, MoveReplica with From the
// node moved to retargets it (To another node) or cancels it (To the
// partition's node), raising the version: a MoveDone of the move before
// is refused (ErrStale), and the partition's node thaws its copy once a
// record with it alone, at a version past its freeze, shows.
type MoveReplica struct {
	_msgpack  struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Topic     string
	Partition int
	Version   uint64
	From      string
	To        string
}

// RemoveNode removes node ID from the cluster's nodes. It must be down
// (ErrNodeUp) and hold no replica (ErrNodeHolds): drained (DrainNode),
// then shut down. The metadata leader then removes it from the metadata
// group's configuration. A node that comes back after it registers as a
// new node.
type RemoveNode struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	ID       string
}

// AcceptLoss is an operator's decision on a DoubleWrite pair whose record
// holds no replica in sync (its leader's data directory was replaced while
// it acked alone, State.lostCopies): Leader, the pair's follower, which
// must be up, leads at the next epoch with what it holds, alone in sync,
// the old leader its follower, caught up from it. What the lost copy alone
// held is given up. The record must be at Version (ErrStale), and have no
// replica in sync (ErrInvalid: an intact copy is known, nothing to
// accept). Naming the leader is refused (ErrInvalid): its copy is the one
// lost, and its empty log would contradict what the follower committed.
// Nothing else ends that state: ReplaceFollower and a MoveReplica of the
// follower are refused (ErrNotInSync).
type AcceptLoss struct {
	_msgpack  struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Topic     string
	Partition int
	Version   uint64
	Leader    string
}

// MoveDone ends the move of Single partition Partition to node To at
// Version (MoveReplica): To holds its copy, and becomes its node alone. A
// record at another version, or moving elsewhere, refuses it (ErrStale).
type MoveDone struct {
	_msgpack  struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Topic     string
	Partition int
	Version   uint64
	To        string
}

func (DrainNode) kind() byte   { return kindDrainNode }
func (MoveReplica) kind() byte { return kindMoveReplica }
func (RemoveNode) kind() byte  { return kindRemoveNode }
func (MoveDone) kind() byte    { return kindMoveDone }
func (AcceptLoss) kind() byte  { return kindAcceptLoss }

func (s *State) drainNode(c DrainNode) error {
	nd, ok := s.nodes[c.ID]
	if !ok {
		return fmt.Errorf("%w: %q", ErrNoNode, c.ID)
	}
	nd.Draining = c.Draining
	s.nodes[c.ID] = nd
	return nil
}

// Holds returns the partitions that have a replica on node id, as
// "topic/partition", sorted.
func (s *State) Holds(id string) []string { return s.Holdings()[id] }

// Holdings returns, by node, the partitions that have a replica on it, as
// "topic/partition", sorted: Holds of every node, in one pass.
func (s *State) Holdings() map[string][]string {
	out := map[string][]string{}
	for _, name := range s.Topics() {
		for i, p := range s.topics[name].Parts {
			for _, id := range p.Replicas {
				out[id] = append(out[id], fmt.Sprintf("%s/%d", name, i))
			}
		}
	}
	return out
}

// moveTarget returns the node c moves a replica to, not one of replicas:
// c.To, or the least loaded node up and not draining.
func (s *State) moveTarget(c MoveReplica, replicas []string) (string, error) {
	to := c.To
	if to == "" {
		if to = s.LeastLoaded(replicas...); to == "" {
			return "", fmt.Errorf("%w: no node up and not draining for a replica of %s/%d", ErrNotEnoughNodes, c.Topic, c.Partition)
		}
	}
	nd, ok := s.nodes[to]
	switch {
	case !ok:
		return "", fmt.Errorf("%w: %q", ErrNoNode, to)
	case !nd.Up:
		return "", fmt.Errorf("%w: %s, to hold a replica of %s/%d", ErrNodeDown, to, c.Topic, c.Partition)
	case nd.Draining:
		return "", fmt.Errorf("%w: %s is draining", ErrInvalid, to)
	case slices.Contains(replicas, to):
		return "", fmt.Errorf("%w: %s/%d has a replica on %s already", ErrInvalid, c.Topic, c.Partition, to)
	}
	return to, nil
}

// moveSingle is MoveReplica on partition c.Partition of Single topic t:
// it starts a move from the partition's node, or retargets or cancels the
// move under way (From its target).
func (s *State) moveSingle(t Topic, c MoveReplica) (Topic, error) {
	p := t.Parts[c.Partition]
	owner := p.Replicas[0]
	switch {
	case c.Version != p.Version:
		return Topic{}, fmt.Errorf("%w: %s/%d at version %d, not %d", ErrStale, c.Topic, c.Partition, p.Version, c.Version)
	case c.From == owner && len(p.Replicas) == 2:
		return Topic{}, fmt.Errorf("%w: %s/%d is moving to %s: retarget or cancel that move (From %s)", ErrInvalid, c.Topic, c.Partition, p.Replicas[1], p.Replicas[1])
	case c.From == owner:
		to, err := s.moveTarget(c, p.Replicas)
		if err != nil {
			return Topic{}, err
		}
		p.Replicas = []string{owner, to}
	case c.To == owner: // cancelled: the partition's node thaws its copy
		p.Replicas = []string{owner}
	default: // retargeted
		to, err := s.moveTarget(c, p.Replicas)
		if err != nil {
			return Topic{}, err
		}
		p.Replicas = []string{owner, to}
	}
	return s.withPart(t, c.Partition, p), nil
}

// moveDone ends a Single partition's move (MoveDone).
func (s *State) moveDone(c MoveDone) (Topic, error) {
	t, p, err := s.partitionOf(c.Topic, c.Partition)
	switch {
	case err != nil:
		return Topic{}, err
	case t.Type != TypeSingle:
		return Topic{}, fmt.Errorf("%w: %s is not a Single topic", ErrInvalid, c.Topic)
	case len(p.Replicas) != 2 || p.Replicas[1] != c.To || p.Version != c.Version:
		return Topic{}, fmt.Errorf("%w: %s/%d on %q at version %d, not moving to %s at %d", ErrStale, c.Topic, c.Partition, p.Replicas, p.Version, c.To, c.Version)
	}
	p.Replicas, p.Leader = []string{c.To}, c.To
	return s.withPart(t, c.Partition, p), nil
}

func (s *State) removeNode(c RemoveNode) error {
	nd, ok := s.nodes[c.ID]
	switch {
	case !ok:
		return fmt.Errorf("%w: %q", ErrNoNode, c.ID)
	case nd.Up:
		return fmt.Errorf("%w: %s: shut it down first", ErrNodeUp, c.ID)
	}
	if holds := s.Holds(c.ID); len(holds) > 0 {
		return fmt.Errorf("%w: %s holds %d replicas (%s first): drain it first", ErrNodeHolds, c.ID, len(holds), holds[0])
	}
	delete(s.nodes, c.ID)
	return nil
}

// partitionOf returns topic and its partition i, or ErrNoTopic or
// ErrInvalid.
func (s *State) partitionOf(topic string, i int) (Topic, Partition, error) {
	t, ok := s.topics[topic]
	switch {
	case !ok:
		return Topic{}, Partition{}, fmt.Errorf("%w: %s", ErrNoTopic, topic)
	case i < 0 || i >= len(t.Parts):
		return Topic{}, Partition{}, fmt.Errorf("%w: %s/%d: %d partitions", ErrInvalid, topic, i, len(t.Parts))
	}
	return t, t.Parts[i], nil
}

func (s *State) moveReplica(c MoveReplica) (Topic, error) {
	t, p, err := s.partitionOf(c.Topic, c.Partition)
	if err != nil {
		return Topic{}, err
	}
	if !slices.Contains(p.Replicas, c.From) {
		return Topic{}, fmt.Errorf("%w: %s/%d has no replica on %s (replicas %q)", ErrInvalid, c.Topic, c.Partition, c.From, p.Replicas)
	}
	if t.Type == TypeSingle {
		return s.moveSingle(t, c)
	}
	to, err := s.moveTarget(c, p.Replicas)
	if err != nil {
		return Topic{}, err
	}
	if t.Type == TypeDoubleWrite {
		if _, _, err := s.pair(c.Topic, c.Partition, c.Version); err != nil {
			return Topic{}, err
		}
		if c.From == p.Leader {
			return Topic{}, fmt.Errorf("%w: %s leads %s/%d: hand the pair over first (Promote)", ErrInvalid, c.From, c.Topic, c.Partition)
		}
		if len(p.InSync) == 0 {
			return Topic{}, errNoIntactCopy("MoveReplica", c.Topic, c.Partition, p)
		}
		p.Replicas, p.InSync, p.Epoch = []string{p.Leader, to}, []string{p.Leader}, p.Epoch+1
		return s.withPart(t, c.Partition, p), nil
	}
	if slices.ContainsFunc(p.Lost, func(id string) bool { return id != c.From }) {
		// One new server at a time: a second leaves one intact replica
		// of three, no quorum that may vote until both rejoined. A move
		// planned before another replica was lost (BalanceReplicas, a
		// drain) is refused here.
		return Topic{}, fmt.Errorf("%w: %s/%d has a lost replica (%q) that has not rejoined yet", ErrInvalid, c.Topic, c.Partition, p.Lost)
	}
	first, n := t.Chunk(c.Partition)
	t.Parts = slices.Clone(t.Parts)
	for j := first; j < first+n; j++ {
		q := t.Parts[j]
		q.Replicas = slices.Clone(q.Replicas)
		q.Replicas[slices.Index(q.Replicas, c.From)] = to
		lost := slices.DeleteFunc(slices.Clone(q.Lost), func(id string) bool { return id == c.From })
		q.Lost = append(lost, to)
		slices.Sort(q.Lost)
		if q.Leader == c.From {
			q.Leader = q.Replicas[0]
		}
		t.Parts[j] = q
	}
	s.topics[t.Name] = t
	return t, nil
}

// BalanceMoves returns at most most moves (MoveReplica; most <= 0: no
// bound) that even out the replicas the nodes up and not draining hold,
// the load placement evens out (a chunk of k partitions counts k on each
// of its nodes): while moving a chunk from one node to another that holds
// none of its replicas lowers the sum of the squared loads, that is,
// while the first holds more than k more than the second, the chunk that
// lowers it most moves, a Raft3 group before a Single partition that
// lowers it as much. A node added to the cluster, holding nothing, thus
// gets chunks from the most loaded. Each chunk moves at most once per
// plan. Raft3 groups move with every replica up and none lost, Single
// partitions when not moving already (with their version); DoubleWrite
// pairs stay, since a moved follower leaves its leader alone in sync, and
// without AckAlone the pair refuses sends until the new one caught up.
func (s *State) BalanceMoves(most int) []MoveReplica {
	count := s.replicaCounts()
	var nodes []string
	for _, nd := range s.Nodes() {
		if nd.Up && !nd.Draining {
			nodes = append(nodes, nd.ID)
		}
	}
	type chunk struct {
		topic    string
		first, k int
		p        Partition
	}
	// Raft3 groups first: of moves that even the loads alike, theirs cost
	// the senders no wait, a Single partition's a wait for its copy.
	var chunks []chunk
	for _, typ := range []uint8{TypeRaft3, TypeSingle} {
		for _, name := range s.Topics() {
			t := s.topics[name]
			if t.Type != typ {
				continue
			}
			for i, p := range t.Parts {
				if _, k := t.Chunk(i); p.Chunk == i && s.Balanceable(name, i) {
					chunks = append(chunks, chunk{topic: name, first: i, k: k, p: p})
				}
			}
		}
	}
	var moves []MoveReplica
	moved := make([]bool, len(chunks))
	for most <= 0 || len(moves) < most {
		best, gain := -1, 0
		var from, to string
		for j, c := range chunks {
			if moved[j] {
				continue
			}
			for _, a := range c.p.Replicas {
				if !slices.Contains(nodes, a) {
					continue
				}
				for _, b := range nodes {
					if g := count[a] - count[b] - c.k; g > gain && !slices.Contains(c.p.Replicas, b) {
						best, gain, from, to = j, g, a, b
					}
				}
			}
		}
		if best < 0 {
			break
		}
		c := chunks[best]
		moved[best] = true
		count[from] -= c.k
		count[to] += c.k
		moves = append(moves, MoveReplica{Topic: c.topic, Partition: c.first, Version: c.p.Version, From: from, To: to})
	}
	return moves
}

// Balanceable reports whether the chunk of topic's partition i may move
// for balance (BalanceMoves): a Raft3 group none of whose replicas is
// lost, or a Single partition not moving, every replica up. DoubleWrite
// pairs never move for balance.
func (s *State) Balanceable(topic string, i int) bool {
	t, ok := s.topics[topic]
	if !ok || i < 0 || i >= len(t.Parts) {
		return false
	}
	p := t.Parts[i]
	switch {
	case !s.AllUp(p.Replicas):
		return false
	case t.Type == TypeRaft3:
		return len(p.Lost) == 0
	case t.Type == TypeSingle:
		return len(p.Replicas) == 1
	}
	return false
}

// AllUp reports whether every node of ids is up.
func (s *State) AllUp(ids []string) bool {
	for _, id := range ids {
		if !s.nodes[id].Up {
			return false
		}
	}
	return true
}
