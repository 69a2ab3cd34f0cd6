// Package remote is node-to-node RPC over the transport's authenticated
// connections, transport.ProtoRPC, and the partition service built on it:
// a Server serving a node's partitions, and Partition, a
// partition.Partition whose every call goes to the node serving it.
//
// # Basics
//
// A Server answers requests with the Handler registered for their op; a
// Client keeps one connection to one peer, dialed on the first call and
// again after it breaks, and pipelines concurrent calls on it: each frame
// carries a request id, and replies come in any order. ServePartitions
// registers the partition service on a Server; NewPartition returns a
// remote handle of one partition through a Client.
//
// # Wire
//
// Frames are internal/wire's: [u32 length][u64 request id][u16 op]
// [payload], the length checked against MaxFrameBytes before anything is
// allocated. Ops below FirstOp are the protocol's: opReply = 0 carries a
// handler's payload, opError = 1 its error; opCancel = 2, sent by a client
// whose caller gave up, cancels the handler's ctx, and opPing = 3, which
// that client sends too, is answered by the server's reading loop with an
// empty opReply, no handler involved: a client that reads nothing for its
// ProbeTimeout after a ping closes the connection. An error crosses as a
// version byte, a u16 code and the message, laid out in errors.go: this
// package's codes name its own sentinels, store's, wire.ErrFrameTooLarge and
// ctx's errors; RegisterError adds a higher layer's from FirstUserCode on;
// the client's error errors.Is the sentinel and reads as the handler's
// message. The partition service's payloads are hand-written layouts with a
// version byte first, in codec.go and ops.go; commands travel as
// store.AppendCommand encodes them, messages as store.AppendMessage does
// with their offset beside.
//
// # Limits
//
// Per connection the server reads while the bytes of requests held and
// replies not yet written are under MaxInflightBytes, runs at most
// MaxConcurrent handlers, closes the connection when a frame takes longer
// than ReadTimeout from its first byte, a reply longer than WriteTimeout,
// or nothing happens for IdleTimeout. A reply holds at most a frame: a
// Fetch returns what fits, at least one message, or store.ErrTooLarge for
// a message no frame holds; a command larger than a frame is refused
// before it is sent. Decoders allocate at most in proportion to their
// input.
//
// # Caveats
//
// An error wrapping ErrUnavailable, for a connection that broke or a reply
// not in time, leaves the outcome unknown: the request may have been
// written and run. An Apply so failed may have been applied; resolve it
// from durable state, never by assuming it did not happen: a resend is
// deduplicated by message ID, and a Decision reads a transaction's
// outcome. A client closes its idle connection before the server would,
// ClientConfig's IdleTimeout being below ServerConfig's, so that no call
// races with the server's close; reads, every call but Apply, are still
// retried once when the connection broke.
//
// A remote Partition runs no upkeep, release or trim: that runs where the
// partition is, the only place that learns at once of growth, since a
// consumer elsewhere long-polls with Fetch. Stats, which has no error,
// returns the last stats it saw when the call fails.
package remote

// The ops of the protocol itself; handlers take FirstOp and above.
const (
	opReply  = 0 // server → client: the handler's payload
	opError  = 1 // server → client: an error payload, as errors.go lays out
	opCancel = 2 // client → server: cancel the request of this id; no reply
	opPing   = 3 // client → server: answered at once with an empty opReply
	// FirstOp is the first op Handle accepts.
	FirstOp uint16 = 16
)
