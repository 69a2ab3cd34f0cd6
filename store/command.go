package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Op names a store command. Every mutation of a partition is one Command,
// applied in order by the partition's writer; a replicator, a raft group or
// a DoubleWrite pair, ships the same commands and applies them in the same
// order on every replica, so replicas stay byte-for-byte equivalent.
type Op uint8

// The commands. Values are part of the replicated format: never renumber.
const (
	// OpAppend appends Msgs to the log; a message whose DeliverAt is after
	// Now goes to the delay index instead. Messages whose ID is in the dedup
	// index are acknowledged with their first offset and stored once.
	OpAppend Op = 1
	// OpCommitOffset sets Group's committed offset to Offset, if Generation
	// is the group's generation; otherwise it fails with ErrStaleGeneration
	// and changes nothing. A group without a record has generation 0, and
	// the commit creates the record.
	OpCommitOffset Op = 2
	// OpTrim deletes the head of the log: records stored before
	// Now-MaxAge, and the oldest records while the log holds more than
	// MaxBytes, and, with Consumed, the records below the committed offset
	// of every consumer group stored before Now-DedupTTL, none when the
	// partition has no group. A consumed record's dedup entry goes with it,
	// so it waits for the dedup window. It also prunes dedup entries older
	// than Now-DedupTTL and transaction decisions older than Now-DecideTTL.
	OpTrim Op = 3
	// OpPrepare stores Msgs as half messages of transaction TxID.
	OpPrepare Op = 4
	// OpCommitTx makes the half messages of TxID, followed by Msgs, the
	// transaction's outbox for this partition, visible in one step.
	OpCommitTx Op = 5
	// OpRollbackTx discards the half messages of TxID.
	OpRollbackTx Op = 6
	// OpRelease moves delayed messages due at Now into the log, in
	// (DeliverAt, arrival) order, at most Limit of them.
	OpRelease Op = 7
	// OpTxChecked records one check-back of TxID that found no answer.
	OpTxChecked Op = 8
	// OpDeleteGroup removes Group's record, with Result.Count 1, or with
	// MaxAge only a record last changed before Now-MaxAge; one of unknown
	// age, written before format 3, is kept. The partition's generation
	// counter keeps its value: a later claim never reuses a generation.
	OpDeleteGroup Op = 9
	// OpClaim takes ownership of Group: it gets a new generation, which its
	// commits must carry. A group without a record starts at the offset
	// Start names (StartAt with the Generation of an owner from before
	// OpFence: not past FenceRecord's offset); one with a record keeps its
	// offset. With MaxAge the
	// claim respects a lease: while the record's owner changed it within
	// MaxAge, without letting go with OpUnclaim or a reset taking it, the
	// claim fails with ErrClaimed and changes nothing, unless Generation is
	// the record's: the owner claiming again is not held off by its own
	// lease.
	OpClaim Op = 10
	// OpResetOffset sets Group's offset to Offset with a new generation,
	// creating the record if absent, fencing whoever owned the group. The
	// owner's lease, if it held one, is kept in GroupState.Lease: another
	// claim waits for it, the owner claims with the reset's generation.
	OpResetOffset Op = 11
	// OpUnclaim is the owner's last commit: OpCommitOffset, which also
	// lets go of the group, so that the next claim needs not wait for the
	// lease.
	OpUnclaim Op = 12
	// OpRenew is an owner's lease renewal: with Generation the group's, the
	// record's Updated becomes Now and its offset stays; otherwise it fails
	// with ErrStaleGeneration and changes nothing.
	OpRenew Op = 13
	// OpFreeze freezes the partition at Offset, non-zero, a token of the
	// caller's (the move's version in the cluster's metadata): every later
	// command but OpFreeze and OpThaw fails with ErrFrozen and changes
	// nothing, until OpThaw. A Single partition is frozen while its node
	// hands it to another (docs/DESIGN.md, Nodes over their life): what
	// its file holds then is all it ever acked.
	OpFreeze Op = 14
	// OpThaw ends a freeze; on a partition that is not frozen it changes
	// nothing.
	OpThaw Op = 15
	// OpFence fences every group, at Offset, the epoch (non-zero, below
	// 2^31) at which a DoubleWrite pair's operator gave up the tail its
	// lost copy alone held: its leader writes it first, since new sends
	// take that tail's offsets and a position taken from it must not skip
	// them. Each record gets a new generation past Offset<<32 (past every
	// generation a copy handed out under an earlier epoch's fence or none),
	// marked Reset as OpResetOffset marks it, its offset lowered to the
	// log's next offset when past it, and an owner's lease kept: each
	// owner's next commit or renewal fails with ErrStaleGeneration, and it
	// claims again from the offset stored. It also writes FenceRecord.
	// Result.Count is the records fenced; a damaged one is left as it is.
	OpFence Op = 16

	maxOp = OpFence
)

// FenceRecord is the name of the group record OpFence leaves, which no
// command may name: its Offset is the log's next offset when the fence was
// applied, its Generation the fence's. An owner from before the fence
// whose group has no record here (its commits were on the copy given up)
// claims where it was (OpClaim at an offset, with its generation), but
// not past that offset. GroupStates and the trim leave it out.
const FenceRecord = "\x00fence"

// Start is where OpClaim puts a group that has no record yet. Values are
// part of the replicated format.
type Start uint8

// Start positions, computed when the claim is applied.
const (
	StartAt    Start = 0 // Command.Offset
	StartFirst Start = 1 // the log's low offset: the oldest message still stored
	StartLast  Start = 2 // the log's next offset: only messages appended later
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

// Limits every command is checked against before anything is written.
const (
	// MaxKeyBytes bounds a message ID, a group name, a transaction id and a
	// producer name: each becomes a bbolt key or a part of one.
	MaxKeyBytes = 1024
	// MaxCommandBytes bounds the encoded effects of one command: the write
	// that stores it, and what recovery reads back, is never larger.
	MaxCommandBytes = 1 << 30
)

// Command is one mutation of a partition: inputs only. Now is chosen by the
// proposer, the node leading the partition, not by the applier, so every
// replica computes the same result; a Now that is zero or before 1970 is
// ErrBadCommand. The store reads Msgs while it applies the command and
// never after Apply returns.
type Command struct {
	Op         Op
	Now        int64 // unix ns, non-zero
	Msgs       []Message
	Group      string
	Offset     uint64
	Generation uint64 // OpCommitOffset, OpUnclaim, OpRenew: the owner's generation, 0 unfenced before any claim; OpClaim: the claimer's, if it owns one
	Start      Start  // OpClaim: where a group without a record starts
	TxID       string
	Producer   string // OpPrepare: the node that prepared TxID
	Limit      int    // OpRelease, OpTrim: most messages moved or deleted; 0: the default
	MaxAge     int64  // OpTrim: ns; 0 keeps all. OpDeleteGroup: only a record unchanged for longer. OpClaim: the lease
	MaxBytes   int64  // OpTrim: 0 keeps all
	DedupTTL   int64  // OpTrim: ns; 0 keeps dedup entries
	DecideTTL  int64  // OpTrim: ns; 0 keeps transaction decisions
	Consumed   bool   // OpTrim: also delete what every group has committed past
}

// Result is what applying a command produced. A send is acknowledged with
// exactly this value: it is computed once, by the code that wrote the
// command's effects.
type Result struct {
	// Acks has one entry per message of Msgs after OpAppend or OpCommitTx,
	// the half messages of OpCommitTx first; none when OpCommitTx found
	// the transaction decided already.
	Acks []Ack
	// Count is the number of messages moved by OpRelease and OpCommitTx,
	// stored by OpPrepare, deleted by OpTrim and OpRollbackTx, or the checks
	// counted so far by OpTxChecked; for OpDeleteGroup, 1 when it removed
	// the record; for OpFence, the records fenced.
	Count int
	// More reports that OpRelease or OpTrim stopped at Limit with work left.
	More bool
	// Previous is the decision already recorded for TxID when OpCommitTx,
	// OpRollbackTx or OpPrepare arrives after the first decision; the
	// command changed nothing, and OpPrepare fails with ErrDecided.
	Previous Decision
	// Offset and Generation are Group's record after OpCommitOffset,
	// OpUnclaim, OpClaim or OpResetOffset: for a commit refused with
	// ErrStaleGeneration or a claim refused with ErrClaimed, the record
	// that refused it.
	Offset     uint64
	Generation uint64
	// Found reports that Group had a record before OpCommitOffset,
	// OpUnclaim, OpClaim, OpResetOffset or OpDeleteGroup.
	Found bool
}

// Ack is where one appended message went.
type Ack struct {
	Offset    uint64 // meaningful unless Delayed
	Delayed   bool   // held in the delay index until its DeliverAt
	Duplicate bool   // its ID was seen within the dedup window; Offset is the first copy's
}

// check validates c's inputs: every limit the reader of its effects will
// enforce, and every field the op needs.
func (c *Command) check() error {
	if c.Op == 0 || c.Op > maxOp {
		return fmt.Errorf("%w: op %d", ErrBadCommand, c.Op)
	}
	if c.Now <= 0 {
		return fmt.Errorf("%w: op %d with Now %d (unix ns after 1970 required)", ErrBadCommand, c.Op, c.Now)
	}
	if len(c.Group) > MaxKeyBytes || len(c.TxID) > MaxKeyBytes || len(c.Producer) > MaxKeyBytes {
		return fmt.Errorf("%w: group, txid or producer over %d bytes", ErrBadCommand, MaxKeyBytes)
	}
	if c.Group == FenceRecord {
		return fmt.Errorf("%w: op %d names the fence's record", ErrBadCommand, c.Op)
	}
	if c.Limit < 0 || c.MaxAge < 0 || c.MaxBytes < 0 || c.DedupTTL < 0 || c.DecideTTL < 0 {
		return fmt.Errorf("%w: negative limit", ErrBadCommand)
	}
	if c.Limit > math.MaxInt32 { // the encoding's bound, as DecodeCommand checks
		return fmt.Errorf("%w: limit %d over %d", ErrBadCommand, c.Limit, math.MaxInt32)
	}
	if c.Start > StartLast || c.Start != StartAt && c.Op != OpClaim {
		return fmt.Errorf("%w: op %d with start %d", ErrBadCommand, c.Op, c.Start)
	}
	if c.Consumed && c.Op != OpTrim {
		return fmt.Errorf("%w: op %d with consumed", ErrBadCommand, c.Op)
	}
	if c.Generation != 0 && c.Op != OpCommitOffset && c.Op != OpUnclaim && c.Op != OpRenew && c.Op != OpClaim {
		return fmt.Errorf("%w: op %d with a generation", ErrBadCommand, c.Op)
	}
	switch c.Op {
	case OpCommitOffset, OpUnclaim, OpRenew, OpDeleteGroup, OpClaim, OpResetOffset:
		if c.Group == "" {
			return fmt.Errorf("%w: op %d without group", ErrBadCommand, c.Op)
		}
	case OpPrepare, OpCommitTx, OpRollbackTx, OpTxChecked:
		if c.TxID == "" {
			return fmt.Errorf("%w: op %d without txid", ErrBadCommand, c.Op)
		}
	}
	if c.Op == OpFreeze && c.Offset == 0 {
		return fmt.Errorf("%w: freeze at 0", ErrBadCommand)
	}
	if c.Op == OpFence && (c.Offset == 0 || c.Offset > maxFenceEpoch) {
		return fmt.Errorf("%w: fence at epoch %d (1 to %d)", ErrBadCommand, c.Offset, maxFenceEpoch)
	}
	switch c.Op {
	case OpAppend, OpPrepare, OpCommitTx:
	default:
		if len(c.Msgs) > 0 {
			return fmt.Errorf("%w: op %d with messages", ErrBadCommand, c.Op)
		}
	}
	var total int64
	for i := range c.Msgs {
		m := &c.Msgs[i]
		if len(m.ID) > MaxKeyBytes {
			return fmt.Errorf("%w: message %d: ID of %d bytes (max %d)", ErrBadCommand, i, len(m.ID), MaxKeyBytes)
		}
		if m.FreshID && m.ID == "" {
			return fmt.Errorf("%w: message %d: FreshID without ID", ErrBadCommand, i)
		}
		total += int64(m.recordBound()) + effectOverhead + int64(len(m.ID))
	}
	if total > MaxCommandBytes {
		return fmt.Errorf("%w: %d messages of about %d bytes (max %d)", ErrTooLarge, len(c.Msgs), total, MaxCommandBytes)
	}
	return nil
}

// Command encoding: the one layout of a command, for raft entries and
// replication.
//
//	magic   'Z' 'C'
//	version uint8 (cmdVersion)
//	op      uint8
//	now     int64 BE
//	offset  uint64 BE
//	limit, max age, max bytes, dedup TTL, decide TTL: uvarint each
//	generation uvarint, start uint8 (since version 2; version 1 has
//	        neither, and decodes with both zero)
//	flags   uint8 (since version 3; 1: Consumed; other bits are
//	        ErrBadCommand)
//	group, txid, producer: uvarint length + bytes each
//	count   uvarint, then each message: uvarint length + its record
//	        payload (message.go's msgpack array) + flags byte (1: FreshID)
const (
	cmdMagic0  = 'Z'
	cmdMagic1  = 'C'
	cmdVersion = 3
	cmdFixed   = 4 + 8 + 8

	cmdConsumed = 1 // flags bits
)

// AppendCommand appends the encoding of c to dst.
func AppendCommand(dst []byte, c *Command) []byte {
	dst = append(dst, cmdMagic0, cmdMagic1, cmdVersion, byte(c.Op))
	dst = binary.BigEndian.AppendUint64(dst, uint64(c.Now))
	dst = binary.BigEndian.AppendUint64(dst, c.Offset)
	dst = binary.AppendUvarint(dst, uint64(c.Limit))
	dst = binary.AppendUvarint(dst, uint64(c.MaxAge))
	dst = binary.AppendUvarint(dst, uint64(c.MaxBytes))
	dst = binary.AppendUvarint(dst, uint64(c.DedupTTL))
	dst = binary.AppendUvarint(dst, uint64(c.DecideTTL))
	dst = binary.AppendUvarint(dst, c.Generation)
	dst = append(dst, byte(c.Start))
	flags := byte(0)
	if c.Consumed {
		flags |= cmdConsumed
	}
	dst = append(dst, flags)
	dst = appendString(dst, c.Group)
	dst = appendString(dst, c.TxID)
	dst = appendString(dst, c.Producer)
	dst = binary.AppendUvarint(dst, uint64(len(c.Msgs)))
	for i := range c.Msgs {
		m := &c.Msgs[i]
		start := len(dst)
		dst = append(dst, make([]byte, binary.MaxVarintLen32)...) // length, filled below
		body := len(dst)
		dst = appendMessage(dst, m)
		dst = putUvarintBack(dst, start, body)
		flags := byte(0)
		if m.FreshID {
			flags = 1
		}
		dst = append(dst, flags)
	}
	return dst
}

// putUvarintBack writes len(dst)-body as a uvarint at start, where
// MaxVarintLen32 bytes were reserved, and closes the gap.
func putUvarintBack(dst []byte, start, body int) []byte {
	var l [binary.MaxVarintLen32]byte
	n := binary.PutUvarint(l[:], uint64(len(dst)-body))
	copy(dst[start:], l[:n])
	return append(dst[:start+n], dst[body:]...)
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

var errShort = errors.New("short input")

// DecodeCommand decodes a command encoded by AppendCommand. Its messages'
// Body slices point into b. Malformed input returns an error wrapping
// ErrBadCommand; nothing is allocated beyond what the input's length allows:
// a message takes at least minCommandMessage bytes, and what it becomes in
// memory about ten times that, its strings their bytes.
func DecodeCommand(b []byte) (*Command, error) {
	c, msgs, err := DecodeCommandHead(b)
	if err != nil {
		return nil, err
	}
	if err := DecodeMessages(c, msgs); err != nil {
		return nil, err
	}
	return c, nil
}

// DecodeCommandHead decodes a command encoded by AppendCommand but for its
// messages, and returns the bytes that hold them, for DecodeMessages: a
// server decides from the head whether the caller may make the command
// before it decodes the rest. Errors wrap ErrBadCommand.
func DecodeCommandHead(b []byte) (c *Command, msgs []byte, err error) {
	c, msgs, err = decodeCommandHead(b)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: decode: %v", ErrBadCommand, err)
	}
	return c, msgs, nil
}

// DecodeMessages decodes msgs, the rest of a command after its head
// (DecodeCommandHead), into c.Msgs. The messages' Body slices point into
// msgs. Errors wrap ErrBadCommand.
func DecodeMessages(c *Command, msgs []byte) error {
	if err := decodeMessages(c, msgs); err != nil {
		return fmt.Errorf("%w: decode: %v", ErrBadCommand, err)
	}
	return nil
}

// minCommandMessage is the least a message takes in a command: a one-byte
// length, a record of ten one-byte fields in a one-byte array, the flags.
const minCommandMessage = 1 + 1 + recordFields + 1

func decodeCommandHead(b []byte) (*Command, []byte, error) {
	if len(b) < cmdFixed {
		return nil, nil, errShort
	}
	if b[0] != cmdMagic0 || b[1] != cmdMagic1 {
		return nil, nil, errors.New("bad magic")
	}
	version := b[2]
	if version < 1 || version > cmdVersion {
		return nil, nil, fmt.Errorf("version %d, want 1 to %d", version, cmdVersion)
	}
	c := &Command{Op: Op(b[3])}
	c.Now = int64(binary.BigEndian.Uint64(b[4:]))
	c.Offset = binary.BigEndian.Uint64(b[12:])
	r := reader{b: b[cmdFixed:]}
	limit := r.uvarint()
	if limit > math.MaxInt32 {
		return nil, nil, errors.New("limit out of range")
	}
	c.Limit = int(limit)
	for _, f := range []*int64{&c.MaxAge, &c.MaxBytes, &c.DedupTTL, &c.DecideTTL} {
		v := r.uvarint()
		if v > math.MaxInt64 {
			return nil, nil, errors.New("duration out of range")
		}
		*f = int64(v)
	}
	if version >= 2 {
		c.Generation = r.uvarint()
		c.Start = Start(r.byte())
	}
	if version >= 3 {
		flags := r.byte()
		if flags&^cmdConsumed != 0 {
			return nil, nil, fmt.Errorf("flags %#x", flags)
		}
		c.Consumed = flags&cmdConsumed != 0
	}
	c.Group = r.str()
	c.TxID = r.str()
	c.Producer = r.str()
	if r.err != nil {
		return nil, nil, r.err
	}
	return c, r.b, nil
}

func decodeMessages(c *Command, b []byte) error {
	r := reader{b: b}
	n := r.uvarint()
	if r.err == nil && n > uint64(len(r.b)/minCommandMessage) {
		return fmt.Errorf("%d messages in %d bytes", n, len(r.b))
	}
	// Msgs is made once for the count, which the bytes can hold: growing
	// it by appends would allocate several times its final size.
	if r.err == nil && n > 0 {
		c.Msgs = make([]Message, 0, n)
	}
	for i := uint64(0); i < n && r.err == nil; i++ {
		rec := r.bytes()
		flags := r.byte()
		if r.err != nil {
			break
		}
		if flags > 1 {
			return fmt.Errorf("message %d: flags %#x", i, flags)
		}
		c.Msgs = append(c.Msgs, Message{})
		m := &c.Msgs[len(c.Msgs)-1]
		if err := decodeMessagePayload(rec, m, true); err != nil {
			return fmt.Errorf("message %d: %v", i, err)
		}
		m.FreshID = flags == 1
	}
	if r.err != nil {
		return r.err
	}
	if len(r.b) != 0 {
		return fmt.Errorf("%d bytes after the command", len(r.b))
	}
	return nil
}

type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errShort
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) bytes() []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.err = errShort
		return nil
	}
	out := r.b[:n:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) str() string { return string(r.bytes()) }

func (r *reader) byte() byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) == 0 {
		r.err = errShort
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}
