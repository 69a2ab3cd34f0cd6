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
