// Package remote is node-to-node RPC over the transport's authenticated
// connections, and the partition service built on it.
package remote

// The ops of the protocol itself; handlers take FirstOp and above.
const (
	opReply  = 0 // server → client: the handler's payload
	opError  = 1 // server → client: an error payload (errors.go)
	opCancel = 2 // client → server: cancel the request of this id; no reply
	// FirstOp is the first op Handle accepts.
	FirstOp uint16 = 16
)
