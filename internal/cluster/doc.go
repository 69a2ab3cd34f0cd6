// Package cluster runs the metadata group, the draft's master: one
// hashicorp/raft group among the cluster's nodes (up to MaxVoters voters,
// further nodes nonvoters) over the state machine of internal/metastate
// (nodes, topics and their placement, consumer groups, ACL rules). Beside
// it: the node's agent (its port, the RPC server and peer clients, joins,
// heartbeats, proposals, check-backs), the leader's session loop and
// DoubleWrite failover, and the consumer groups' coordinator across nodes.
//
// Meta.State returns the current metastate.State; its Changed channel is
// closed when the next is published.
//
// # Raft
//
// OpenMeta runs the group over an injected raft.Transport with the log and
// stable store in Dir/raft.db (raft-boltdb/v2) and snapshots in Dir
// (retain 2). Propose works on the leader only (ErrNotLeader names the
// leader) and reports ErrUnknownOutcome when a command may have been
// applied. Raft's logs go to the slog logger, silent by default.
package cluster
