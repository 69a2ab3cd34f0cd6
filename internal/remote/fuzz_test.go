package remote

import (
	"errors"
	"math"
	"reflect"
	"testing"

	"github.com/zeze-go/mq/internal/fuzzseed"
	"github.com/zeze-go/mq/internal/wire"
	"github.com/zeze-go/mq/store"
)

// hostilePrefixes are msgpack-like headers claiming 4 GiB of elements or
// bytes.
var hostilePrefixes = [][]byte{
	{0xdd, 0xff, 0xff, 0xff, 0xff},
	{0xdf, 0xff, 0xff, 0xff, 0xff},
	{0xdb, 0xff, 0xff, 0xff, 0xff},
	{0xc6, 0xff, 0xff, 0xff, 0xff},
}

// addHostile adds, for op, each hostile prefix alone, after the version
// byte, and after a valid start.
func addHostile(f *testing.F, op uint16, valid []byte) {
	for _, p := range hostilePrefixes {
		f.Add(int(op), p)
		f.Add(int(op), append([]byte{payloadVersion}, p...))
		f.Add(int(op), append(append([]byte{}, valid[:min(len(valid), 4)]...), p...))
	}
}

var sampleMsg = store.Message{ID: "id", Key: "k", Tags: []string{"t"}, Properties: map[string]string{"p": "v"},
	Body: []byte("body"), Timestamp: -1, DeliverAt: 2, StoredAt: 3, ReconsumeTimes: 4, Offset: 9}

func sampleRequests() map[uint16]*partReq {
	h := func(r partReq) *partReq { r.topic, r.index = "topic", 3; return &r }
	return map[uint16]*partReq{
		OpApply: h(partReq{cmd: &store.Command{Op: store.OpAppend, Now: 1, Msgs: []store.Message{sampleMsg, {FreshID: true, ID: "x"}}}}),
		OpFetch: h(partReq{from: 5, max: 100, maxBytes: 1 << 20, waitMS: 5000}),
		OpGet:   h(partReq{offset: 1 << 40}), OpStats: h(partReq{}), OpGroup: h(partReq{name: "g"}),
		OpGroupStates: h(partReq{}), OpSeekTime: h(partReq{t: -5}), OpNextDue: h(partReq{}),
		OpHalfTxs: h(partReq{name: "tx-1", limit: 128}), OpDecision: h(partReq{name: "tx"}),
	}
}

func sampleReplies() map[uint16]*partResp {
	st := store.Stats{Low: 1, Next: 9, Bytes: 100, Delayed: 2, LastStored: -7}
	g := store.GroupState{Offset: 4, Generation: 2, Updated: 99, Reset: true}
	return map[uint16]*partResp{
		OpApply: {err: store.ErrDecided, res: store.Result{Acks: []store.Ack{{Offset: 1}, {Offset: 2, Delayed: true, Duplicate: true}},
			Count: 3, More: true, Previous: store.Committed, Offset: 7, Generation: 8, Found: true}, stats: st},
		OpFetch:       {stats: st, msgs: []store.Message{sampleMsg, {Offset: 10}}},
		OpGet:         {ok: true, msgs: []store.Message{sampleMsg}},
		OpStats:       {stats: st},
		OpGroup:       {ok: true, group: g},
		OpGroupStates: {err: store.ErrCorrupt, groups: map[string]store.GroupState{"a": g, "b": {}}},
		OpSeekTime:    {offset: 77},
		OpNextDue:     {ok: true, due: -3},
		OpHalfTxs:     {halves: []store.HalfTx{{TxID: "a", Producer: "n", FirstSeen: 1, LastCheck: 2, Checks: 3, Messages: 4}, {TxID: "b"}}, more: true},
		OpDecision:    {decision: store.RolledBack},
	}
}

// FuzzDecodeRequest: no request panics its decoder or allocates beyond its
// length; errors are ErrProtocol, ErrUnknownOp or (a command)
// store.ErrBadCommand; what decodes encodes to what decodes the same, and
// a cut encoding does not decode.
func FuzzDecodeRequest(f *testing.F) {
	for op, r := range sampleRequests() {
		b := appendRequest(nil, op, r)
		f.Add(int(op), b)
		addHostile(f, op, b)
	}
	f.Fuzz(func(t *testing.T, op int, b []byte) {
		var (
			r   *partReq
			err error
		)
		fuzzseed.CheckAlloc(t, len(b), func() { r, err = decodeRequest(uint16(op), b) })
		if err != nil {
			if !errors.Is(err, ErrProtocol) && !errors.Is(err, ErrUnknownOp) && !errors.Is(err, store.ErrBadCommand) {
				t.Fatalf("error %v", err)
			}
			return
		}
		enc := appendRequest(nil, uint16(op), r)
		again, err := decodeRequest(uint16(op), enc)
		if err != nil || !reflect.DeepEqual(again, r) {
			t.Fatalf("re-encoded request decodes to %+v, %v; want %+v", again, err, r)
		}
		if _, err := decodeRequest(uint16(op), enc[:len(enc)-1]); err == nil {
			t.Fatalf("a cut request (%x) decodes", enc[:len(enc)-1])
		}
	})
}

// sameErr reports that two decoded embedded errors match: both nil, or the
// same message and sentinel.
func sameErr(a, b error) bool {
	var ea, eb *Error
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return errors.As(a, &ea) && errors.As(b, &eb) && ea.Message == eb.Message && ea.err == eb.err
}

// askMost is a request asking for the most any reply may hold: a Fetch of
// MaxInt32 messages, a full HalfTxs page, a commit's acks.
func askMost() *partReq {
	return &partReq{max: math.MaxInt32, limit: maxHalfPage, cmd: &store.Command{Op: store.OpCommitTx}}
}

// elements is the count of the elements a reply of op holds that its
// request bounds (replyLimit).
func elements(op uint16, a *partResp) int {
	switch op {
	case OpFetch:
		return len(a.msgs)
	case OpHalfTxs:
		return len(a.halves)
	case OpApply:
		return len(a.res.Acks)
	}
	return 0
}

// FuzzDecodeReply: as FuzzDecodeRequest, for every op's reply, decoded for
// the request asking the most.
func FuzzDecodeReply(f *testing.F) {
	for op, a := range sampleReplies() {
		b, _, err := appendReply(nil, op, a, 1<<20)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(int(op), b)
		addHostile(f, op, b)
	}
	f.Fuzz(func(t *testing.T, op int, b []byte) {
		var (
			a   *partResp
			err error
		)
		fuzzseed.CheckAlloc(t, len(b), func() { a, err = decodeReply(uint16(op), b, askMost(), nil) })
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("error %v is not ErrProtocol", err)
			}
			return
		}
		enc, n, err := appendReply(nil, uint16(op), a, 1<<30)
		if err != nil || (uint16(op) == OpFetch && n != len(a.msgs)) {
			t.Fatalf("re-encoding %+v: %d messages, %v", a, n, err)
		}
		again, err := decodeReply(uint16(op), enc, askMost(), nil)
		if err != nil || !sameErr(again.err, a.err) {
			t.Fatalf("re-encoded reply decodes to %+v, %v; want %+v", again, err, a)
		}
		again.err, a.err = nil, nil
		if !reflect.DeepEqual(again, a) {
			t.Fatalf("re-encoded reply decodes to %+v; want %+v", again, a)
		}
		if _, err := decodeReply(uint16(op), enc[:len(enc)-1], askMost(), nil); err == nil {
			t.Fatalf("a cut reply (%x) decodes", enc[:len(enc)-1])
		}
	})
}

// FuzzDecodeReplyLimit: a reply is decoded for the request it answers; one
// holding more elements than the request asked for (replyLimit) is
// refused, and one within it decodes as for the request asking the most.
func FuzzDecodeReplyLimit(f *testing.F) {
	for op, a := range sampleReplies() {
		b, _, err := appendReply(nil, op, a, 1<<20)
		if err != nil {
			f.Fatal(err)
		}
		for _, limit := range []int{0, 1, 2, 3} {
			f.Add(int(op), limit, b)
		}
		for _, p := range hostilePrefixes {
			f.Add(int(op), 1, append(append([]byte{}, b[:min(len(b), 4)]...), p...))
		}
	}
	f.Fuzz(func(t *testing.T, op, limit int, b []byte) {
		limit = int(uint(limit) % 1024)
		r := &partReq{max: limit, limit: limit, cmd: &store.Command{Op: store.OpAppend, Msgs: make([]store.Message, limit)}}
		most := replyLimit(uint16(op), r)
		var (
			a   *partResp
			err error
		)
		fuzzseed.CheckAlloc(t, len(b), func() { a, err = decodeReply(uint16(op), b, r, nil) })
		wide, werr := decodeReply(uint16(op), b, askMost(), nil)
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("error %v is not ErrProtocol", err)
			}
			if werr == nil && elements(uint16(op), wide) <= most {
				t.Fatalf("a reply of %d elements, within the %d asked for, is refused: %v", elements(uint16(op), wide), most, err)
			}
			return
		}
		if n := elements(uint16(op), a); n > most {
			t.Fatalf("a reply of %d elements decodes for a request of %d", n, most)
		}
		if werr != nil || !sameErr(wide.err, a.err) {
			t.Fatalf("decodes for a request of %d, not for the widest: %v", most, werr)
		}
		wide.err, a.err = nil, nil
		if !reflect.DeepEqual(wide, a) {
			t.Fatalf("decodes to %+v for a request of %d; to %+v for the widest", a, most, wide)
		}
	})
}

// FuzzDecodeError: error payloads and reply frames of any op never panic;
// what decodes encodes to the same message and sentinel.
func FuzzDecodeError(f *testing.F) {
	for _, err := range sentinels {
		f.Add(int(opError), appendError(nil, err))
	}
	f.Add(int(opError), appendError(nil, errors.New(string(make([]byte, maxErrMessage+10)))))
	f.Add(int(opError), []byte{errVersion, 0x03, 0xe8, 'x'}) // a user code
	f.Add(int(opError), []byte{errVersion, 0xff, 0xff})
	f.Add(int(opReply), []byte("payload"))
	for _, p := range hostilePrefixes {
		f.Add(int(opError), p)
		f.Add(int(opError), append([]byte{errVersion, 0, 1}, p...))
	}
	f.Fuzz(func(t *testing.T, op int, b []byte) {
		var r reply
		fuzzseed.CheckAlloc(t, len(b), func() { r = frameReply(wire.Frame{Op: uint16(op), Payload: b}, nil) })
		switch {
		case uint16(op) == opReply:
			if r.err != nil || string(r.payload) != string(b) {
				t.Fatalf("reply %x = %x, %v", b, r.payload, r.err)
			}
			return
		case uint16(op) != opError:
			if !errors.Is(r.err, ErrProtocol) {
				t.Fatalf("reply frame of op %d: %v, want ErrProtocol", op, r.err)
			}
			return
		}
		var e *Error
		if !errors.As(r.err, &e) {
			if !errors.Is(r.err, ErrProtocol) {
				t.Fatalf("error payload %x: %v, want *Error or ErrProtocol", b, r.err)
			}
			return
		}
		if !errors.Is(e, sentinelOf(e.Code)) {
			t.Fatalf("error of code %d does not match its sentinel", e.Code)
		}
		again, err := decodeError(appendError(nil, e))
		if err != nil || again.Message != e.Message || again.err != e.err {
			t.Fatalf("re-encoded error decodes to %+v, %v; want %+v", again, err, e)
		}
	})
}

// FuzzFrameScan: the server's deadline reader follows frame boundaries the
// same whatever the reads' split, and is between frames after whole
// frames.
func FuzzFrameScan(f *testing.F) {
	f.Add([]byte{0, 0, 0, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 3)
	f.Add(append(rawFrame(f, 1, OpApply, []byte("abc")), rawFrame(f, 2, OpFetch, nil)...), 9)
	for _, p := range hostilePrefixes {
		f.Add(p, 2)
	}
	f.Fuzz(func(t *testing.T, b []byte, cut int) {
		cut = int(uint(cut) % uint(len(b)+1))
		var whole, split deadlineReader
		whole.scan(b)
		split.scan(b[:cut])
		split.scan(b[cut:])
		type state struct {
			inFrame bool
			hdr     [4]byte
			nh      int
			left    uint64
		}
		sw := state{whole.inFrame, whole.hdr, whole.nh, whole.left}
		if ss := (state{split.inFrame, split.hdr, split.nh, split.left}); sw != ss {
			t.Fatalf("scan of %x whole: %+v; split at %d: %+v", b, whole, cut, split)
		}
		// Whole frames after any bytes: between frames iff it was.
		var frames []byte
		for i := 0; i < 3; i++ {
			frames = append(frames, rawFrame(t, uint64(i), FirstOp, b[:min(len(b), i*7)])...)
		}
		var r deadlineReader
		r.scan(frames)
		if r.inFrame {
			t.Fatalf("in a frame after whole frames: %+v", r)
		}
	})
}
