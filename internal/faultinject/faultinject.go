// Package faultinject holds the switches that make a build deliberately
// broken: the negative controls of the fault tests, which must fail with
// them. Only tests set them, before the nodes they break open.
package faultinject

import "sync/atomic"

// AckBeforeCommit makes every replicated partition's proposer opened
// after it is set answer its callers as soon as their entry is handed to
// the replication, before it commits (raftqueue's ackBeforeCommit): an
// acknowledged message may then be lost with its leader.
var AckBeforeCommit atomic.Bool

// ShareOwnership makes every consumer of a group deliver every partition
// at once: each node's coordinator gives its members every partition
// (cluster.Coordinator.Share), and a worker's claim takes the partition
// from an owner whose lease holds (delivery's claimCommand).
var ShareOwnership atomic.Bool
