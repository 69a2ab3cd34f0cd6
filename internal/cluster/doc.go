// Package cluster runs the metadata group, the draft's master: one
// hashicorp/raft group among the cluster's nodes, up to MaxVoters of them
// voters and the others nonvoters, over the state machine of
// internal/metastate, which holds the nodes, the topics and their
// placement, the consumer groups and the ACL rules. Beside it are the
// node's agent, which runs its port, the RPC server and the peer clients,
// and makes the joins, heartbeats, proposals and check-backs; the leader's
// session loop and DoubleWrite failover; and the consumer groups'
// coordinator across nodes.
//
// Meta.State returns the current metastate.State; its Changed channel is
// closed when the next is published.
//
// # Raft
//
// OpenMeta runs the group over an injected raft.Transport with the log and
// stable store in Dir/raft.db, a raft-boltdb/v2 store, and the last two
// snapshots in Dir. Propose works on the leader only, elsewhere returning
// ErrNotLeader with the leader's name, and reports ErrUnknownOutcome when
// a command may have been applied. Raft's logs go to the slog logger,
// silent by default.
package cluster
