package metastate

import "errors"

// Errors returned by the state machine. Apply's errors leave the state as it
// was, on every node alike.
var (
	// ErrInvalid is returned for a command whose fields are out of range: a
	// bad name, a partition count or replica count outside its limits, an
	// unknown type or right.
	ErrInvalid = errors.New("cluster: invalid command")

	// ErrCorrupt is returned for a command or snapshot that does not decode:
	// a wrong magic or version, damaged msgpack, or values that break the
	// state's invariants.
	ErrCorrupt = errors.New("cluster: corrupt")

	// ErrTopicExists is returned by CreateTopic for a topic that exists.
	ErrTopicExists = errors.New("cluster: topic exists")

	// ErrNoTopic is returned by AlterTopic, JoinGroup and the commands of
	// DoubleWrite pairs for a topic that does not exist.
	ErrNoTopic = errors.New("cluster: no such topic")

	// ErrPartitionDecrease is returned by AlterTopic for a partition count
	// below the topic's current one: partitions are never removed.
	ErrPartitionDecrease = errors.New("cluster: partition count cannot decrease")

	// ErrNotEnoughNodes is returned by CreateTopic and AlterTopic when fewer
	// nodes are up than a partition needs replicas, and by ReplaceFollower
	// when no node is free.
	ErrNotEnoughNodes = errors.New("cluster: not enough live nodes")

	// ErrNoNode is returned for a node id that never registered.
	ErrNoNode = errors.New("cluster: no such node")

	// ErrNodeDown is returned by JoinGroup, Promote and Heartbeat for a
	// node marked down: it must register again (AddNode) first.
	ErrNodeDown = errors.New("cluster: node is down")

	// ErrStaleSession is returned by NodeDown for a session the node has
	// already replaced by registering again.
	ErrStaleSession = errors.New("cluster: stale node session")

	// ErrNoGroup is returned by LeaveGroup and Released for a consumer group
	// that has no state.
	ErrNoGroup = errors.New("cluster: no such consumer group")

	// ErrNoMember is returned by LeaveGroup for a member not in the group.
	ErrNoMember = errors.New("cluster: no such group member")

	// ErrMemberExists is returned by JoinGroup for a member id already in
	// the group on another node.
	ErrMemberExists = errors.New("cluster: member exists on another node")

	// ErrNotRevoking is returned by Released when the partition is not being
	// revoked from that member, or the release is older than the
	// revocation: a stale or repeated release changes nothing.
	ErrNotRevoking = errors.New("cluster: partition is not being revoked from this member")

	// ErrStale is returned by SetInSync, Promote, ReplaceFollower and
	// RenewEpoch when the DoubleWrite partition's record changed since the
	// proposer read its Version: the proposal lost a race and changes
	// nothing.
	ErrStale = errors.New("cluster: stale partition version")

	// ErrWrongCluster is returned for a node whose data directory belongs
	// to another cluster than this one (State.ClusterID): it never joins
	// with that data.
	ErrWrongCluster = errors.New("cluster: the node's data belongs to another cluster")

	// ErrNotInSync is returned by Promote for a replica outside the
	// partition's in-sync set: it may lack acked batches, and is never
	// promoted automatically.
	ErrNotInSync = errors.New("cluster: replica not in sync")

	// ErrNodeUp is returned by RemoveNode for a node still up.
	ErrNodeUp = errors.New("cluster: node is up")

	// ErrNodeHolds is returned by RemoveNode for a node still holding
	// replicas.
	ErrNodeHolds = errors.New("cluster: node holds replicas")
)
