package store

// Op names a store command. Every mutation of a partition is one Command,
// applied in order by the partition's writer; a replicator (raft, double
// write) ships the same commands and applies them in the same order on every
// replica, so replicas stay byte-for-byte equivalent.
type Op uint8

// The commands. Values are part of the replicated format: never renumber.
const (
	// OpAppend appends Msgs to the log (or to the delay index when a
	// message's DeliverAt is after Now). Messages whose ID is in the dedup
	// index are acknowledged with their first offset and stored once.
	OpAppend Op = 1
	// OpCommitOffset sets Group's committed offset to Offset.
	OpCommitOffset Op = 2
	// OpTrim deletes the head of the log: records stored before
	// Now-MaxAge, and the oldest records while the log holds more than
	// MaxBytes. It also prunes dedup entries older than Now-DedupWindow and
	// transaction decisions older than Now-DecisionTTL.
	OpTrim Op = 3
	// OpPrepare stores Msgs as half messages of transaction TxID.
	OpPrepare Op = 4
	// OpCommitTx makes the half messages of TxID, followed by Msgs (the
	// transaction's outbox for this partition), visible in one step.
	OpCommitTx Op = 5
	// OpRollbackTx discards the half messages of TxID.
	OpRollbackTx Op = 6
	// OpRelease moves delayed messages due at Now into the log, in
	// (DeliverAt, arrival) order, at most Limit of them.
	OpRelease Op = 7
	// OpTxChecked records one check-back of TxID that found no answer.
	OpTxChecked Op = 8
	// OpDeleteGroup removes Group's committed offset.
	OpDeleteGroup Op = 9
)

// Decision is the recorded outcome of a transaction in one partition.
type Decision uint8

// Decisions. The first one recorded wins.
const (
	Undecided  Decision = 0
	Committed  Decision = 1
	RolledBack Decision = 2
)

func (d Decision) String() string {
	switch d {
	case Committed:
		return "committed"
	case RolledBack:
		return "rolled back"
	}
	return "undecided"
}

// Command is one mutation of a partition. Inputs are set by the caller; the
// outputs (Acks, Count, More, Previous) are filled by the writer. Now is chosen
// by the proposer, not the applier, so every replica computes the same result.
type Command struct {
	Op Op

	// Index, when non-zero, is the replicated log index of this command.
	// Commands at or below the partition's applied index are skipped, which
	// makes replay after a crash idempotent.
	Index uint64

	Now       int64 // unix ns
	Msgs      []Message
	Group     string
	Offset    uint64
	TxID      string
	Producer  string // the node that prepared TxID (OpPrepare)
	Limit     int    // OpRelease: most messages moved; 0 means 10,000
	MaxAge    int64  // OpTrim: ns; 0 keeps all
	MaxBytes  int64  // OpTrim: 0 keeps all
	DedupTTL  int64  // OpTrim: ns; 0 keeps dedup entries
	DecideTTL int64  // OpTrim: ns; 0 keeps transaction decisions

	// Acks has one entry per message of Msgs after OpAppend or OpCommitTx
	// (half messages of OpCommitTx come first). The writer reuses the
	// slice's capacity, so a caller that keeps its Command allocates nothing.
	Acks []Ack
	// Count is the number of messages moved (OpRelease, OpCommitTx) or
	// deleted (OpTrim, OpRollbackTx).
	Count int
	// More reports that OpRelease or OpTrim stopped at Limit with work left.
	More bool
	// Previous is the decision already recorded for TxID when OpCommitTx or
	// OpRollbackTx arrives after the first decision; the command changed
	// nothing.
	Previous Decision
}

// Ack is where one appended message went.
type Ack struct {
	Offset    uint64 // meaningful unless Delayed
	Delayed   bool   // held in the delay index until its DeliverAt
	Duplicate bool   // its ID was seen within the dedup window; Offset is the first copy's
}
