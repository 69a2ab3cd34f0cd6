// Package metastate is the metadata's state machine, pure: the state that
// internal/cluster's metadata group, the draft's master, replicates, the
// commands that change it and its snapshot, with no raft and no network.
// The state records
//
//   - nodes: id, address, voter or not, up or down, session;
//   - topics: partition count, replication type, creation time, and per
//     partition its replicas, leader and epoch, with a DoubleWrite pair's
//     in-sync set and version;
//   - consumer groups, per topic: generation, members and the node each
//     runs on, the partition owners, and the partitions being revoked;
//   - ACL rules: identity pattern, topic pattern, rights. Access control
//     is on once any rule exists.
//
// # Commands
//
// Every change is a Command (RegisterNode, NodeDown, CreateTopic,
// AlterTopic, JoinGroup, LeaveGroup, Released, SetACL, and the DoubleWrite
// pair's SetInSync, Promote, ReplaceFollower, RenewEpoch) carrying inputs
// only, encoded with a magic and version byte before a msgpack array. Apply
// is deterministic: every node applies the same entries to the same bytes
// (EncodeSnapshot), a failed command changes nothing, and its error is one
// of the sentinels (ErrTopicExists, ErrNoTopic, ErrPartitionDecrease,
// ErrNotEnoughNodes, …).
//
// # Placement
//
// CreateTopic and AlterTopic place each new partition on the live nodes
// holding the fewest replicas, ties by node id; the first is its leader at
// epoch 1. Too few live nodes is ErrNotEnoughNodes. AlterTopic places only
// the added partitions. A Single or Raft3 partition is never moved: the
// partitions of a node marked down stay on it, and a Single partition there
// is unavailable until it returns. A DoubleWrite pair moves only by its
// own commands (Promote, ReplaceFollower: doublewrite.go).
//
// # Consumer groups
//
// The state machine is the one coordinator of every group, whatever nodes
// its members run on. Each membership change, by JoinGroup, LeaveGroup or
// the NodeDown of a member's node, raises the generation and computes the
// target assignment: the P partitions spread over the n members by id,
// ⌊P/n⌋ or one more each, a member keeping what it owns while within its
// share (sticky), free partitions to the member with the fewest. A partition
// whose target differs from a live owner is not moved: it is revoking, still
// its owner's, until the owner's node proposes Released, once it stopped
// consuming and committed, or the owner leaves or its node goes down. Only
// then does it go to its target, at a new generation. A Released older than
// the revocation is refused, so a release for a cancelled revocation cannot
// complete a later one.
//
// # Fencing
//
// A partition has at most one owner per generation of its group, and the
// owner of a partition changes only with the generation: State.Owns(topic,
// group, member, partition, gen) is the check an offset commit passes,
// refusing members acting on an older generation. Node sessions fence nodes:
// the leader keeps each node's last heartbeat in memory, never in the log,
// proposes NodeDown for the session it saw once SessionTimeout passes, and
// starts every session afresh when it is elected. A NodeDown for an older
// session is refused, and a node marked down comes back only by registering
// again (AddNode), with a new session. Partition epochs fence the
// DoubleWrite leaders the metadata moves (doublewrite.go).
//
// # Reading
//
// The State is immutable: Apply builds the next one beside it, copying what
// a command changes, and the metadata group publishes it atomically, so a
// State and its methods need no lock.
// Each State's Changed channel is closed (Replaced) when the next is
// published.
package metastate
