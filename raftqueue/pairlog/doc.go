// Package pairlog replicates a DoubleWrite partition: a leader and a
// follower, each with a copy of the partition's log, written synchronously.
// The metadata group's pair records, internal/cluster's, choose and fence
// the leader; nothing is elected.
//
// A pair's log is a sequence of entries {index, epoch, data}, kept in a
// raft.LogStore with raft's Term as the epoch: in a node, a
// raftqueue.WALLog, a stream of the node's WAL. Each replica persists the
// epoch it serves before it writes or accepts anything of that epoch, and
// accepts appends of that epoch only: once a promoted follower has
// persisted epoch E+1, the old leader, whose appends carry E, can never
// again have a batch on two copies, so it can never ack one.
//
// Log is a replica's copy; a follower takes the leader's batches with its
// Append. Leader is the writing side: each proposed entry goes to its own
// log and, at the same time, to the follower, and commits once both hold
// it; committed entries are applied in order and answered. raftqueue.Pair
// puts on top the store's state machine and the proposer, which packs many
// sends into an entry: a replica that leads or follows as the metadata
// says.
package pairlog
