package replica

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/remote"
	"github.com/zeze-go/mq/raftqueue"
	"github.com/zeze-go/mq/raftqueue/pairlog"
)

// OpPairAppend carries a DoubleWrite leader's batch to its follower's node
// (pairlog.Append → the follower's raftqueue.Pair.Append), OpPairInstall a
// piece of its snapshot (pairlog.Install → raftqueue.Pair.Install).
const (
	OpPairAppend  = remote.FirstOp + 80
	OpPairInstall = remote.FirstOp + 81
)

// Codes of pairlog's errors on the wire.
const (
	codeCommitted = remote.FirstUserCode + 102
	codeBadAppend = remote.FirstUserCode + 103
	codeNoInSync  = remote.FirstUserCode + 104
	// A leader whose replica cannot serve says why to the node that
	// forwarded the call, which returns it at once.
	codeReplicaFailed = remote.FirstUserCode + 105
)

func init() {
	remote.RegisterError(codeCommitted, pairlog.ErrCommitted)
	remote.RegisterError(codeBadAppend, pairlog.ErrBadAppend)
	remote.RegisterError(codeNoInSync, ErrNoInSync)
	remote.RegisterError(codeReplicaFailed, ErrReplicaFailed)
}

// The request, version 1, after the partition's head (appendPairHead):
// the version byte, a flags byte (1: Reset), then uvarints Epoch,
// PrevIndex, PrevEpoch, Commit, the number of entries and, per entry, its
// Index, Term, Type and data length, then the data. The reply: the version
// byte, a status byte and a uvarint. The status is statusOK with the end,
// or one of the refusals whose fields pairlog's callers read: statusEpoch
// with the epoch the follower serves, statusMismatch with where the leader
// resumes.
const (
	pairVersion    = 1
	flagReset      = 1
	statusOK       = 0
	statusEpoch    = 1
	statusMismatch = 2
)

// minEntryBytes is the least an entry takes on the wire: a decoder
// allocates no more entries than the bytes could hold. maxPairEntries
// bounds the entries of one request, since a raft.Log in memory takes
// about thirty times its smallest encoding: pairlog's leader sends no more
// (LeaderConfig.MaxBatch is at most pairlog.MaxAppendEntries).
const (
	minEntryBytes  = 4
	maxPairEntries = pairlog.MaxAppendEntries
)

// appendPairRequest encodes a.
func appendPairRequest(dst []byte, a pairlog.Append) []byte {
	flags := byte(0)
	if a.Reset {
		flags |= flagReset
	}
	dst = append(dst, pairVersion, flags)
	for _, v := range []uint64{a.Epoch, a.PrevIndex, a.PrevEpoch, a.Commit, uint64(len(a.Entries))} {
		dst = binary.AppendUvarint(dst, v)
	}
	for _, e := range a.Entries {
		dst = binary.AppendUvarint(dst, e.Index)
		dst = binary.AppendUvarint(dst, e.Term)
		dst = binary.AppendUvarint(dst, uint64(e.Type))
		dst = binary.AppendUvarint(dst, uint64(len(e.Data)))
		dst = append(dst, e.Data...)
	}
	return dst
}

// errPairFormat is a request or reply that does not decode.
var errPairFormat = fmt.Errorf("%w: malformed pair append", pairlog.ErrBadAppend)

// decodePairRequest decodes a request. The entries' data alias b.
func decodePairRequest(b []byte) (pairlog.Append, error) {
	var a pairlog.Append
	if len(b) < 2 || b[0] != pairVersion || b[1]&^flagReset != 0 {
		return a, errPairFormat
	}
	a.Reset = b[1]&flagReset != 0
	r := uvarints{b: b[2:]}
	a.Epoch, a.PrevIndex, a.PrevEpoch, a.Commit = r.next(), r.next(), r.next(), r.next()
	n := r.next()
	if r.bad || n > uint64(len(r.b)/minEntryBytes) || n > maxPairEntries {
		return a, errPairFormat
	}
	a.Entries = make([]*raft.Log, n)
	logs := make([]raft.Log, n)
	for i := range logs {
		e := &logs[i]
		e.Index, e.Term = r.next(), r.next()
		typ, size := r.next(), r.next()
		if r.bad || typ > 255 || size > uint64(len(r.b)) {
			return a, errPairFormat
		}
		e.Type, e.Data, r.b = raft.LogType(typ), r.b[:size:size], r.b[size:]
		a.Entries[i] = e
	}
	if len(r.b) != 0 {
		return a, errPairFormat
	}
	return a, nil
}

// uvarints reads uvarints off b; bad once one did not decode.
type uvarints struct {
	b   []byte
	bad bool
}

func (r *uvarints) next() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.bad = true
		return 0
	}
	r.b = r.b[n:]
	return v
}

// pairReply encodes Append's answer: the end, or the refusals whose fields
// the leader reads; other errors go as errors.
func pairReply(end uint64, err error) ([]byte, error) {
	var ee *pairlog.EpochError
	var me *pairlog.MismatchError
	switch {
	case err == nil:
		return binary.AppendUvarint([]byte{pairVersion, statusOK}, end), nil
	case errors.As(err, &ee):
		return binary.AppendUvarint([]byte{pairVersion, statusEpoch}, ee.Epoch), nil
	case errors.As(err, &me):
		return binary.AppendUvarint([]byte{pairVersion, statusMismatch}, me.Last), nil
	}
	return nil, err
}

// decodePairReply decodes a reply into Append's result.
func decodePairReply(b []byte) (uint64, error) {
	if len(b) < 3 || b[0] != pairVersion {
		return 0, errPairFormat
	}
	v, n := binary.Uvarint(b[2:])
	if n <= 0 || n != len(b)-2 {
		return 0, errPairFormat
	}
	switch b[1] {
	case statusOK:
		return v, nil
	case statusEpoch:
		return 0, &pairlog.EpochError{Epoch: v}
	case statusMismatch:
		return 0, &pairlog.MismatchError{Last: v}
	}
	return 0, errPairFormat
}

// PairPeer is a DoubleWrite leader's way to its follower on another node:
// a pairlog.Peer over the RPC client of the follower's node.
type PairPeer struct {
	Client *remote.Client
	Topic  string
	Index  int
}

// Append sends a to the follower's node.
func (p PairPeer) Append(ctx context.Context, a pairlog.Append) (uint64, error) {
	req := appendPairHead(nil, p.Topic, p.Index)
	req = appendPairRequest(req, a)
	resp, err := p.Client.Call(ctx, OpPairAppend, req)
	if err != nil {
		return 0, err
	}
	return decodePairReply(resp)
}

// Install sends a piece of a snapshot to the follower's node.
func (p PairPeer) Install(ctx context.Context, in pairlog.Install) error {
	req := appendPairHead(nil, p.Topic, p.Index)
	req = appendInstallRequest(req, in)
	resp, err := p.Client.Call(ctx, OpPairInstall, req)
	if err != nil {
		return err
	}
	_, err = decodePairReply(resp)
	return err
}

// The install request, version 1, after the partition's head: the version
// byte, a flags byte (1: Done), uvarints Epoch, Index, Offset, then the
// piece's data. The reply is Append's, with 0 for the end.
const flagDone = 1

// appendInstallRequest encodes in.
func appendInstallRequest(dst []byte, in pairlog.Install) []byte {
	flags := byte(0)
	if in.Done {
		flags |= flagDone
	}
	dst = append(dst, pairVersion, flags)
	for _, v := range []uint64{in.Epoch, in.Index, in.Offset} {
		dst = binary.AppendUvarint(dst, v)
	}
	return append(dst, in.Data...)
}

// decodeInstallRequest decodes an install request. Data aliases b.
func decodeInstallRequest(b []byte) (pairlog.Install, error) {
	var in pairlog.Install
	if len(b) < 2 || b[0] != pairVersion || b[1]&^flagDone != 0 {
		return in, errPairFormat
	}
	in.Done = b[1]&flagDone != 0
	r := uvarints{b: b[2:]}
	in.Epoch, in.Index, in.Offset = r.next(), r.next(), r.next()
	if r.bad {
		return in, errPairFormat
	}
	in.Data = r.b
	return in, nil
}

// appendPairHead names the partition: a uvarint length and the topic, then
// the partition's index as a uvarint.
func appendPairHead(dst []byte, topic string, index int) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(topic)))
	dst = append(dst, topic...)
	return binary.AppendUvarint(dst, uint64(index))
}

// decodePairHead reads the partition a request names, and the rest.
func decodePairHead(b []byte) (topic string, index int, rest []byte, err error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) || n > 255 {
		return "", 0, nil, errPairFormat
	}
	topic, b = string(b[k:k+int(n)]), b[k+int(n):]
	i, k := binary.Uvarint(b)
	if k <= 0 || i > 1<<16 {
		return "", 0, nil, errPairFormat
	}
	return topic, int(i), b[k:], nil
}

// ServePairs registers OpPairAppend and OpPairInstall on srv: lookup finds
// this node's replica of a partition for a call from node peer, and
// returns an error when it holds none or peer does not lead it.
func ServePairs(srv *remote.Server, lookup func(peer, topic string, index int) (*raftqueue.Pair, error)) {
	srv.Handle(OpPairInstall, pairHandler(lookup, decodeInstallRequest, func(ctx context.Context, p *raftqueue.Pair, in pairlog.Install) ([]byte, error) {
		return pairReply(0, p.Install(ctx, in))
	}))
	srv.Handle(OpPairAppend, pairHandler(lookup, decodePairRequest, func(ctx context.Context, p *raftqueue.Pair, a pairlog.Append) ([]byte, error) {
		return pairReply(p.Append(ctx, a))
	}))
}

// pairHandler is the handler of a pair op: the partition its request
// names (decodePairHead), this node's replica found by lookup, which
// refuses a peer that does not lead it, then the rest decoded by decode,
// so that only the pair's leader gets a body decoded, then call.
func pairHandler[R any](lookup func(peer, topic string, index int) (*raftqueue.Pair, error), decode func([]byte) (R, error),
	call func(ctx context.Context, p *raftqueue.Pair, r R) ([]byte, error)) remote.Handler {
	return func(ctx context.Context, peer string, req []byte) ([]byte, error) {
		topic, index, rest, err := decodePairHead(req)
		if err != nil {
			return nil, err
		}
		p, err := lookup(peer, topic, index)
		if err != nil {
			return pairReply(0, err) // an *pairlog.EpochError tells a deposed leader so
		}
		r, err := decode(rest)
		if err != nil {
			return nil, err
		}
		return call(ctx, p, r)
	}
}
