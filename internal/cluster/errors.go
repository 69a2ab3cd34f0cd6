package cluster

import (
	"errors"
	"fmt"
)

// Errors returned by the metadata group. Apply's errors leave the state as it
// was, on every node alike.
var (
	// ErrClosed is returned by the methods of a closed Meta.
	ErrClosed = errors.New("cluster: closed")

	// ErrNotLeader is returned by Propose, AddNode and Heartbeat on a node
	// that is not the metadata leader; the error is a *NotLeaderError naming
	// the leader if one is known. The command was not applied.
	ErrNotLeader = errors.New("cluster: not the metadata leader")

	// ErrUnknownOutcome is returned by Propose when the command may or may
	// not have been applied: leadership was lost while committing it, or ctx
	// ended after it was handed to raft. Read the state to find out.
	ErrUnknownOutcome = errors.New("cluster: outcome unknown")
)

// NotLeaderError is the ErrNotLeader of a node, naming the metadata leader
// it knows of; both fields are empty when it knows none.
type NotLeaderError struct {
	LeaderID   string
	LeaderAddr string
}

// Error names the leader, or says that none is known.
func (e *NotLeaderError) Error() string {
	if e.LeaderID == "" {
		return ErrNotLeader.Error() + " (leader unknown)"
	}
	return fmt.Sprintf("%s (leader %s at %s)", ErrNotLeader, e.LeaderID, e.LeaderAddr)
}

// Is makes errors.Is(err, ErrNotLeader) true.
func (e *NotLeaderError) Is(target error) bool { return target == ErrNotLeader }
