package replica

import (
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/raftqueue"
)

// rejoinTimeout bounds each membership change Rejoin makes.
const rejoinTimeout = 5 * time.Second

// Rejoin brings a Raft3 group's raft configuration to its placement,
// replicas, while the replicas in lost (metastate.Partition.Lost) rejoin
// as new servers; self is this node, g its replica. A lost replica's node
// came back with its data directory replaced: it forgot its log and its
// votes, which raft's safety needs, so it must not count as the voter it
// was.
//
// On the leader, if not lost itself: a lost replica still a voter is
// removed, then added back as a nonvoter, caught up from nothing by the
// leader; a replica placed and not lost that is not a voter is made one.
// Once every placed replica is a voter and none is lost, a server no
// longer placed (moved away, metastate.MoveReplica) is removed. A leader
// no longer placed hands its leadership over before anything else.
// Each lost voter is removed before any is added back, so two lost
// replicas leave the intact one alone as the voters, and the group never
// counts a lost copy toward a quorum.
//
// A lost replica takes entries only from a leader that vouched for it
// (GroupConfig.Vouched): the leader names in Vouch the lost replicas that
// its committed configuration has as nonvoters, and the node tells each
// of them. A leader whose configuration counts none of them as a voter
// cannot commit with their acknowledgements, deposed or not.
//
// A lost replica that leads (one that caught up while still a voter may
// be elected) hands the leadership over. Otherwise it reports CaughtUp
// once the configuration has it as a nonvoter (removed and added back)
// and it has applied what its leader last told it was committed: the
// node then records it rejoined (metastate.Rejoined), and the leader
// makes it a voter again.
//
// It returns what it did, for the log, and the first change that failed.
func Rejoin(g *raftqueue.Group, self string, replicas, lost []string) (RejoinStep, error) {
	var step RejoinStep
	r := g.Raft()
	isLost := slices.Contains(lost, self)
	if !isLost && r.State() != raft.Leader {
		return step, nil // only the leader and lost replicas act
	}
	f := r.GetConfiguration()
	if err := f.Error(); err != nil {
		return step, err
	}
	servers := f.Configuration().Servers
	suffrage := func(id string) (raft.ServerSuffrage, bool) {
		for _, s := range servers {
			if string(s.ID) == id {
				return s.Suffrage, true
			}
		}
		return 0, false
	}
	if isLost {
		if r.State() == raft.Leader {
			// Caught up while still a voter, it won an election, which is
			// safe; but a lost leader cannot remove itself, so it hands
			// the leadership to a replica that is not lost.
			if err := r.LeadershipTransfer().Error(); err != nil {
				return step, fmt.Errorf("hand the leadership over: %w", err)
			}
			step.Did = []string{"lost, the leadership handed over"}
			return step, nil
		}
		s, ok := suffrage(self)
		if !ok || s != raft.Nonvoter || time.Since(r.LastContact()) > 2*time.Second {
			return step, nil
		}
		commit := r.CommitIndex()
		step.CaughtUp = commit > 0 && r.AppliedIndex() >= commit
		return step, nil
	}
	if !slices.Contains(replicas, self) {
		// Moved away (metastate.MoveReplica): the replica that takes its
		// place accepts raft streams from placed replicas only, so a
		// placed one leads the move.
		if err := r.LeadershipTransfer().Error(); err != nil {
			return step, fmt.Errorf("hand the leadership over, moved away: %w", err)
		}
		step.Did = []string{"moved away, the leadership handed over"}
		return step, nil
	}
	// The configuration read is committed once the commit index reached
	// its entry: the lost replicas it has as nonvoters may take this
	// leader's entries.
	if f.Index() <= r.CommitIndex() {
		for _, id := range lost {
			if s, ok := suffrage(id); ok && s == raft.Nonvoter {
				step.Vouch = append(step.Vouch, id)
			}
		}
	}
	change := func(what string, fut raft.IndexFuture) error {
		if err := fut.Error(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		step.Did = append(step.Did, what)
		return nil
	}
	for _, id := range lost {
		if s, ok := suffrage(id); ok && s == raft.Voter {
			if err := change("remove lost "+id, r.RemoveServer(raft.ServerID(id), 0, rejoinTimeout)); err != nil {
				return step, err
			}
		}
	}
	for _, id := range lost {
		if s, ok := suffrage(id); !ok || s == raft.Voter {
			if err := change("add back "+id+" as a nonvoter", r.AddNonvoter(raft.ServerID(id), raft.ServerAddress(id), 0, rejoinTimeout)); err != nil {
				return step, err
			}
		}
	}
	for _, id := range replicas {
		if slices.Contains(lost, id) {
			continue
		}
		if s, ok := suffrage(id); !ok || s != raft.Voter {
			if err := change("promote "+id, r.AddVoter(raft.ServerID(id), raft.ServerAddress(id), 0, rejoinTimeout)); err != nil {
				return step, err
			}
		}
	}
	if len(step.Did) > 0 || len(lost) > 0 {
		return step, nil // the rest once every placed replica is a voter
	}
	// A replica moved away (metastate.MoveReplica) leaves once the one
	// that took its place is a voter.
	for _, s := range servers {
		if id := string(s.ID); !slices.Contains(replicas, id) {
			if err := change("remove "+id+", moved away", r.RemoveServer(s.ID, 0, rejoinTimeout)); err != nil {
				return step, err
			}
		}
	}
	return step, nil
}

// RejoinStep is what Rejoin did and found.
type RejoinStep struct {
	// CaughtUp: this lost replica, a nonvoter, applied what its leader
	// last told it was committed; the node records it rejoined.
	CaughtUp bool
	// Did lists the changes made, for the log.
	Did []string
	// Vouch lists, on the leader, the lost replicas that its committed
	// configuration has as nonvoters: each is told that this leader's
	// entries may be taken (GroupConfig.Vouched).
	Vouch []string
}
