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
// configuration once the placed replicas are voters. DoubleWrite: From
// must be the pair's follower, and the record must be at Version (ErrStale
// otherwise); To becomes the follower at the next epoch, with the leader
// alone in sync until it caught up, as ReplaceFollower does. A Single
// partition does not move (ErrInvalid).
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

func (DrainNode) kind() byte   { return kindDrainNode }
func (MoveReplica) kind() byte { return kindMoveReplica }
func (RemoveNode) kind() byte  { return kindRemoveNode }

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
func (s *State) Holds(id string) []string {
	var out []string
	for _, name := range s.Topics() {
		for i, p := range s.topics[name].Parts {
			if slices.Contains(p.Replicas, id) {
				out = append(out, fmt.Sprintf("%s/%d", name, i))
			}
		}
	}
	return out
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

func (s *State) moveReplica(c MoveReplica) (Topic, error) {
	t, ok := s.topics[c.Topic]
	switch {
	case !ok:
		return Topic{}, fmt.Errorf("%w: %s", ErrNoTopic, c.Topic)
	case c.Partition < 0 || c.Partition >= len(t.Parts):
		return Topic{}, fmt.Errorf("%w: %s/%d: %d partitions", ErrInvalid, c.Topic, c.Partition, len(t.Parts))
	case t.Type != TypeRaft3 && t.Type != TypeDoubleWrite:
		return Topic{}, fmt.Errorf("%w: %s is a Single topic: its partitions do not move", ErrInvalid, c.Topic)
	}
	p := t.Parts[c.Partition]
	if !slices.Contains(p.Replicas, c.From) {
		return Topic{}, fmt.Errorf("%w: %s/%d has no replica on %s (replicas %q)", ErrInvalid, c.Topic, c.Partition, c.From, p.Replicas)
	}
	to := c.To
	if to == "" {
		if to = s.LeastLoaded(p.Replicas...); to == "" {
			return Topic{}, fmt.Errorf("%w: no node up and not draining for a replica of %s/%d", ErrNotEnoughNodes, c.Topic, c.Partition)
		}
	}
	nd, ok := s.nodes[to]
	switch {
	case !ok:
		return Topic{}, fmt.Errorf("%w: %q", ErrNoNode, to)
	case !nd.Up:
		return Topic{}, fmt.Errorf("%w: %s, to hold a replica of %s/%d", ErrNodeDown, to, c.Topic, c.Partition)
	case nd.Draining:
		return Topic{}, fmt.Errorf("%w: %s is draining", ErrInvalid, to)
	case slices.Contains(p.Replicas, to):
		return Topic{}, fmt.Errorf("%w: %s/%d has a replica on %s already", ErrInvalid, c.Topic, c.Partition, to)
	}
	if t.Type == TypeDoubleWrite {
		if _, _, err := s.pair(c.Topic, c.Partition, c.Version); err != nil {
			return Topic{}, err
		}
		if c.From == p.Leader {
			return Topic{}, fmt.Errorf("%w: %s leads %s/%d: hand the pair over first (Promote)", ErrInvalid, c.From, c.Topic, c.Partition)
		}
		p.Replicas, p.InSync, p.Epoch = []string{p.Leader, to}, []string{p.Leader}, p.Epoch+1
		return s.withPart(t, c.Partition, p), nil
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
