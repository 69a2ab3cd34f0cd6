package remote

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/zeze-go/mq/internal/fuzzseed"
	"github.com/zeze-go/mq/store"
)

// worstReply is a reply of op answering req, and whether it decodes.
type worstReply struct {
	op      uint16
	req     *partReq
	b       []byte
	decodes bool
}

// worstReplies are, for the replies holding lists, those of about size
// bytes that make the caller's decoder allocate the most per byte: the
// cheapest elements for the request asking the most (askMost), messages
// of the most tags or properties, and lists longer than the request asked
// for, or than the bytes hold, which are refused.
func worstReplies(t testing.TB, size int) map[string]worstReply {
	t.Helper()
	enc := func(op uint16, a *partResp) []byte {
		b, _, err := appendReply(nil, op, a, 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	fetch := func(msgs []store.Message) []byte { return enc(OpFetch, &partResp{msgs: msgs}) }
	// The cheapest message: offset 0, a one-byte length, a record of ten
	// one-byte fields (version 1, empty strings, no tags or properties, a
	// nil body, zeros).
	one := []byte{0, 11, 0x9a, 0x01, 0xa0, 0xa0, 0x90, 0x80, 0xc0, 0, 0, 0, 0}
	cheapest := append(binary.AppendUvarint(fetch(nil)[:6], uint64(size/len(one))), bytes.Repeat(one, size/len(one))...)
	oneByte := store.Message{Tags: make([]string, size/2)}
	for i := range oneByte.Tags {
		oneByte.Tags[i] = string(rune('a' + i%26))
	}
	props := store.Message{Properties: map[string]string{}}
	for i := 0; len(props.Properties) < size/6; i++ {
		props.Properties[fmt.Sprintf("%x", i)] = ""
	}
	// The shortest distinct names, sorted for HalfTxs: the empty one, the
	// 256 of one byte, then of two and three.
	names := []string{""}
	for i := 0; len(names) < size/6; i++ {
		switch {
		case i < 1<<8:
			names = append(names, string([]byte{byte(i)}))
		case i < 1<<8+1<<16:
			names = append(names, string([]byte{byte(i >> 8), byte(i)}))
		default:
			names = append(names, string([]byte{byte(i >> 16), byte(i >> 8), byte(i)}))
		}
	}
	slices.Sort(names)
	halves := make([]store.HalfTx, len(names))
	for i := range halves {
		halves[i].TxID = names[i]
	}
	groups := make(map[string]store.GroupState, len(names))
	for _, n := range names {
		groups[n] = store.GroupState{}
	}
	acks := enc(OpApply, &partResp{res: store.Result{Acks: make([]store.Ack, size/minAckBytes)}})
	claimed := append(fetch(nil)[:7], 0xff, 0xff, 0xff, 0x7f) // 2^28 messages, none there
	return map[string]worstReply{
		"FetchCheapestMessages": {OpFetch, askMost(), cheapest, true},
		"FetchEmptyTags":        {OpFetch, askMost(), fetch([]store.Message{{Tags: make([]string, size)}}), true},
		"FetchOneByteTags":      {OpFetch, askMost(), fetch([]store.Message{oneByte}), true},
		"FetchProperties":       {OpFetch, askMost(), fetch([]store.Message{props}), true},
		"FetchMoreThanAsked":    {OpFetch, &partReq{max: 100}, cheapest, false},
		"FetchClaimedMessages":  {OpFetch, askMost(), claimed, false},
		"HalfTxsFullPage":       {OpHalfTxs, askMost(), enc(OpHalfTxs, &partResp{halves: halves[:maxHalfPage]}), true},
		"HalfTxsMoreThanAsked":  {OpHalfTxs, askMost(), enc(OpHalfTxs, &partResp{halves: halves}), false},
		"ApplyCommitAcks":       {OpApply, askMost(), acks, true},
		"ApplyMoreAcksThanSent": {OpApply, &partReq{cmd: &store.Command{Op: store.OpAppend, Msgs: make([]store.Message, 8)}}, acks, false},
		"GroupStatesCheapest":   {OpGroupStates, askMost(), enc(OpGroupStates, &partResp{groups: groups}), true},
	}
}

// TestDecodeReply_AllocationBounded checks that no reply makes the
// caller's decoder allocate more than fuzzseed.RequestAllocK times its
// bytes plus RequestAllocC, whatever the peer sends: a node answering with
// lists of small elements, or longer than the call asked for, once made
// its caller allocate up to 43 times the reply's bytes, GiBs for a frame.
func TestDecodeReply_AllocationBounded(t *testing.T) {
	for name, c := range worstReplies(t, 1<<20) {
		t.Run(name, func(t *testing.T) {
			n := fuzzseed.CheckRequestAlloc(t, c.b, fuzzseed.RequestAllocK, fuzzseed.RequestAllocC, func(b []byte) {
				_, err := decodeReply(c.op, b, c.req, nil)
				if c.decodes && err != nil {
					t.Errorf("decode: %v", err)
				}
				if !c.decodes && !errors.Is(err, ErrProtocol) {
					t.Errorf("decode: %v, want ErrProtocol", err)
				}
			})
			t.Logf("%s: %d bytes: %d allocated (%.1f per byte)", name, len(c.b), n, float64(n)/float64(len(c.b)))
		})
	}
}
