package metastate

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// The record of a DoubleWrite partition: Replicas are its leader and its
// follower, Leader the one that takes sends at Epoch, InSync those holding
// every batch it acked, the leader first, and Version the token of the
// compare-and-set every change carries. Who proposes what:
//
//   - the partition's leader, SetInSync: {leader} when its follower is lost
//     or lags, {leader, follower} once the follower caught up;
//   - the metadata leader, Promote: the leader is gone, its in-sync
//     follower leads at Epoch+1 and a new follower is chosen by load. The
//     follower persists the epoch before it serves, and then refuses the
//     old leader's batches, so the old leader can no longer ack. The
//     partition's leader proposes Promote too, to hand the pair off when
//     its replica failed or its node closes;
//   - the partition's leader, HandOver: to balance leaderships, its
//     follower in sync leads at Epoch+1 and it follows, both in sync;
//   - the metadata leader, ReplaceFollower: the follower is gone, a new one
//     is chosen by load and caught up by the leader, at Epoch+1;
//   - the partition's leader, RenewEpoch: it must start leading again,
//     after a restart or a failed replication, which it does at Epoch+1.
//
// Each refuses a Version other than the partition's with ErrStale: of two
// proposals made from the same record, one wins.

// pairs returns the new partitions of a topic of type typ with the record
// of a DoubleWrite pair: both replicas in sync, as they are empty, at
// version 1.
func pairs(typ uint8, parts []Partition) []Partition {
	if typ != TypeDoubleWrite {
		return parts
	}
	for i := range parts {
		parts[i].InSync = slices.Clone(parts[i].Replicas)
		parts[i].Version = 1
	}
	return parts
}

// pair returns the DoubleWrite partition a command names, checked against
// the Version it carries.
func (s *State) pair(topic string, part int, version uint64) (Topic, Partition, error) {
	t, ok := s.topics[topic]
	switch {
	case !ok:
		return Topic{}, Partition{}, fmt.Errorf("%w: %s", ErrNoTopic, topic)
	case t.Type != TypeDoubleWrite:
		return Topic{}, Partition{}, fmt.Errorf("%w: topic %s is of type %d, not DoubleWrite", ErrInvalid, topic, t.Type)
	case part < 0 || part >= len(t.Parts):
		return Topic{}, Partition{}, fmt.Errorf("%w: %s/%d: %d partitions", ErrInvalid, topic, part, len(t.Parts))
	}
	p := t.Parts[part]
	if version != p.Version {
		return Topic{}, Partition{}, fmt.Errorf("%w: %s/%d at version %d, the command read %d", ErrStale, topic, part, p.Version, version)
	}
	return t, p, nil
}

// withPart returns t with the record of partition i's chunk replaced by
// p's: the partitions sharing a pair share its record, so a command naming
// any of them changes all. t's slice is shared with older States, so it is
// copied, never modified.
func (s *State) withPart(t Topic, i int, p Partition) Topic {
	p.Version++
	first, n := t.Chunk(i)
	t.Parts = slices.Clone(t.Parts)
	for j := first; j < first+n; j++ {
		t.Parts[j] = p
	}
	s.topics[t.Name] = t
	return t
}

func (s *State) setInSync(c SetInSync) (Topic, error) {
	t, p, err := s.pair(c.Topic, c.Partition, c.Version)
	if err != nil {
		return Topic{}, err
	}
	switch {
	case len(c.InSync) < 1 || len(c.InSync) > len(p.Replicas) || c.InSync[0] != p.Leader:
		return Topic{}, fmt.Errorf("%w: %s/%d: in sync %q, the leader %s first", ErrInvalid, c.Topic, c.Partition, c.InSync, p.Leader)
	case len(c.InSync) == 2 && (c.InSync[1] == p.Leader || !slices.Contains(p.Replicas, c.InSync[1])):
		return Topic{}, fmt.Errorf("%w: %s/%d: in sync %q, replicas %q", ErrInvalid, c.Topic, c.Partition, c.InSync, p.Replicas)
	}
	if len(p.InSync) == 0 {
		// The leader's copy was lost (lostCopies): it cannot vouch for
		// anyone, itself included.
		return Topic{}, fmt.Errorf("%w: %s/%d: its leader %s holds no intact copy", ErrNotInSync, c.Topic, c.Partition, p.Leader)
	}
	p.InSync = slices.Clone(c.InSync)
	if len(p.InSync) == 2 {
		p.Accepted = 0 // the follower holds the leader's fence too
	}
	return s.withPart(t, c.Partition, p), nil
}

// lostCopies takes the replicas of node id, whose data directory was
// replaced (a new incarnation), out of every DoubleWrite record: a
// follower is out of sync at once, and its leader replicates to it anew
// at the next epoch, from nothing; a leader hands the pair to its
// follower in sync, which leads at the next epoch with the node as its
// follower (the promoted one may be down: the pair then waits for it, the
// only intact copy). A leader without a follower in sync keeps the record
// with no replica in sync: no copy is known to hold what was acked, and
// nothing is served until an operator decides.
func (s *State) lostCopies(id string) {
	for _, name := range s.Topics() {
		t := s.topics[name]
		if t.Type == TypeRaft3 {
			s.lostRaft3(t, id)
			continue
		}
		if t.Type != TypeDoubleWrite {
			continue
		}
		for i := range t.Parts {
			p := t.Parts[i]
			if p.Chunk != i || !slices.Contains(p.Replicas, id) {
				continue
			}
			f := p.Follower()
			switch {
			case p.Leader == id && f != "" && slices.Contains(p.InSync, f):
				p.Replicas, p.Leader, p.InSync = []string{f, id}, f, []string{f}
			case p.Leader == id:
				p.InSync = nil
			default:
				p.InSync = slices.DeleteFunc(slices.Clone(p.InSync), func(n string) bool { return n == id })
			}
			p.Epoch++
			t = s.withPart(t, i, p)
		}
	}
}

func (s *State) promote(c Promote) (Topic, error) {
	t, p, err := s.pair(c.Topic, c.Partition, c.Version)
	if err != nil {
		return Topic{}, err
	}
	switch {
	case c.Leader == p.Leader:
		return Topic{}, fmt.Errorf("%w: %s/%d: %s leads already", ErrInvalid, c.Topic, c.Partition, c.Leader)
	case !slices.Contains(p.InSync, c.Leader):
		return Topic{}, fmt.Errorf("%w: %s/%d: %s (in sync: %q)", ErrNotInSync, c.Topic, c.Partition, c.Leader, p.InSync)
	case !s.nodes[c.Leader].Up:
		return Topic{}, fmt.Errorf("%w: %s, to lead %s/%d", ErrNodeDown, c.Leader, c.Topic, c.Partition)
	}
	old := p.Leader
	follower := s.LeastLoaded(c.Leader, old)
	if follower == "" {
		follower = old // no other node up: the old leader follows once it is back
	}
	p.Replicas, p.Leader, p.Epoch, p.InSync = []string{c.Leader, follower}, c.Leader, p.Epoch+1, []string{c.Leader}
	return s.withPart(t, c.Partition, p), nil
}

func (s *State) handOver(c HandOver) (Topic, error) {
	t, p, err := s.pair(c.Topic, c.Partition, c.Version)
	if err != nil {
		return Topic{}, err
	}
	old := p.Leader
	switch {
	case c.Leader == old:
		return Topic{}, fmt.Errorf("%w: %s/%d: %s leads already", ErrInvalid, c.Topic, c.Partition, c.Leader)
	case !slices.Contains(p.InSync, c.Leader) || !slices.Contains(p.InSync, old):
		return Topic{}, fmt.Errorf("%w: %s/%d: %s and %s (in sync: %q)", ErrNotInSync, c.Topic, c.Partition, c.Leader, old, p.InSync)
	case !s.nodes[c.Leader].Up || !s.nodes[old].Up:
		return Topic{}, fmt.Errorf("%w: %s to lead %s/%d, %s to follow", ErrNodeDown, c.Leader, c.Topic, c.Partition, old)
	case s.nodes[c.Leader].Draining:
		return Topic{}, fmt.Errorf("%w: %s drains: it takes no leadership of %s/%d", ErrInvalid, c.Leader, c.Topic, c.Partition)
	}
	p.Replicas, p.Leader, p.Epoch, p.InSync = []string{c.Leader, old}, c.Leader, p.Epoch+1, []string{c.Leader, old}
	return s.withPart(t, c.Partition, p), nil
}

func (s *State) acceptLoss(c AcceptLoss) (Topic, error) {
	t, p, err := s.pair(c.Topic, c.Partition, c.Version)
	if err != nil {
		return Topic{}, err
	}
	switch {
	case len(p.InSync) > 0:
		return Topic{}, fmt.Errorf("%w: %s/%d: %q in sync hold every acked batch: no loss to accept", ErrInvalid, c.Topic, c.Partition, p.InSync)
	case c.Leader == p.Leader:
		// Its copy is the one lost: its empty log would contradict what
		// the follower holds committed, which refuses it.
		return Topic{}, fmt.Errorf("%w: %s/%d: %s, the leader, lost its copy: name the follower %s", ErrInvalid, c.Topic, c.Partition, c.Leader, p.Follower())
	case c.Leader != p.Follower():
		return Topic{}, fmt.Errorf("%w: %s/%d: %s is not the follower (replicas %q)", ErrInvalid, c.Topic, c.Partition, c.Leader, p.Replicas)
	case !s.nodes[c.Leader].Up:
		return Topic{}, fmt.Errorf("%w: %s, to lead %s/%d", ErrNodeDown, c.Leader, c.Topic, c.Partition)
	}
	p.Replicas, p.Leader, p.Epoch, p.InSync = []string{c.Leader, p.Leader}, c.Leader, p.Epoch+1, []string{c.Leader}
	p.Accepted = p.Epoch
	return s.withPart(t, c.Partition, p), nil
}

// errNoIntactCopy refuses a change that would record the leader of pair p
// in sync while its record holds no replica in sync (lostCopies): only an
// operator's AcceptLoss ends that.
func errNoIntactCopy(c string, topic string, i int, p Partition) error {
	return fmt.Errorf("%w: %s of %s/%d: its leader %s holds no intact copy; an operator decides (AcceptLoss)", ErrNotInSync, c, topic, i, p.Leader)
}

func (s *State) replaceFollower(c ReplaceFollower) (Topic, error) {
	t, p, err := s.pair(c.Topic, c.Partition, c.Version)
	if err != nil {
		return Topic{}, err
	}
	if len(p.InSync) == 0 {
		return Topic{}, errNoIntactCopy("ReplaceFollower", c.Topic, c.Partition, p)
	}
	follower := s.LeastLoaded(p.Leader, p.Follower())
	if follower == "" {
		return Topic{}, fmt.Errorf("%w: %s/%d: no node up besides its leader and follower", ErrNotEnoughNodes, c.Topic, c.Partition)
	}
	p.Replicas, p.InSync, p.Epoch = []string{p.Leader, follower}, []string{p.Leader}, p.Epoch+1
	return s.withPart(t, c.Partition, p), nil
}

func (s *State) renewEpoch(c RenewEpoch) (Topic, error) {
	t, p, err := s.pair(c.Topic, c.Partition, c.Version)
	if err != nil {
		return Topic{}, err
	}
	p.Epoch++
	return s.withPart(t, c.Partition, p), nil
}

// LeastLoaded returns the node that is up, not draining, not one of not,
// and holds the fewest replicas, ties broken by id as in place; "" when
// there is none.
func (s *State) LeastLoaded(not ...string) string {
	count := s.replicaCounts()
	best := ""
	for id, nd := range s.nodes {
		if !nd.Up || nd.Draining || slices.Contains(not, id) {
			continue
		}
		if best == "" || cmp.Or(cmp.Compare(count[id], count[best]), strings.Compare(id, best)) < 0 {
			best = id
		}
	}
	return best
}

// lostRaft3 marks node id's replicas of topic t's Raft3 groups lost
// (Partition.Lost): they rejoin their groups as new servers.
func (s *State) lostRaft3(t Topic, id string) {
	changed := false
	parts := slices.Clone(t.Parts)
	for i := range parts {
		p := parts[i]
		if !slices.Contains(p.Replicas, id) || slices.Contains(p.Lost, id) {
			continue
		}
		p.Lost = append(slices.Clone(p.Lost), id)
		slices.Sort(p.Lost)
		parts[i], changed = p, true
	}
	if changed {
		t.Parts = parts
		s.topics[t.Name] = t
	}
}

func (s *State) rejoined(c Rejoined) (Topic, error) {
	t, ok := s.topics[c.Topic]
	switch {
	case !ok:
		return Topic{}, fmt.Errorf("%w: %s", ErrNoTopic, c.Topic)
	case t.Type != TypeRaft3:
		return Topic{}, fmt.Errorf("%w: topic %s is of type %d, not Raft3", ErrInvalid, c.Topic, t.Type)
	case c.Partition < 0 || c.Partition >= len(t.Parts):
		return Topic{}, fmt.Errorf("%w: %s/%d: %d partitions", ErrInvalid, c.Topic, c.Partition, len(t.Parts))
	}
	if nd, ok := s.nodes[c.Node]; !ok || nd.Incarnation != c.Incarnation {
		return Topic{}, fmt.Errorf("%w: node %s is incarnation %q, not %q", ErrStale, c.Node, nd.Incarnation, c.Incarnation)
	}
	first, n := t.Chunk(c.Partition)
	if !slices.Contains(t.Parts[first].Lost, c.Node) {
		return t, nil
	}
	t.Parts = slices.Clone(t.Parts)
	for j := first; j < first+n; j++ {
		p := t.Parts[j]
		p.Lost = slices.DeleteFunc(slices.Clone(p.Lost), func(id string) bool { return id == c.Node })
		if len(p.Lost) == 0 {
			p.Lost = nil
		}
		t.Parts[j] = p
	}
	s.topics[t.Name] = t
	return t, nil
}
