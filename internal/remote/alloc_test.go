package remote

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/zeze-go/mq/internal/fuzzseed"
	"github.com/zeze-go/mq/internal/partition"
	"github.com/zeze-go/mq/store"
)

// worstRequests are, for every partition op, the requests of about size
// bytes that make the server's decoder allocate the most per byte: the
// longest strings a request carries and, for OpApply, commands of the
// cheapest messages, of one message with the most tags or properties, and
// a count claiming more messages than follow.
func worstRequests(size int) map[string][]byte {
	h := func(r partReq) *partReq { r.topic, r.index = strings.Repeat("t", maxTopicBytes), 1<<31-1; return &r }
	key := strings.Repeat("k", store.MaxKeyBytes)
	out := map[string][]byte{
		"Fetch": appendRequest(nil, OpFetch, h(partReq{from: 1<<64 - 1, max: 1<<31 - 1, maxBytes: 1<<31 - 1, waitMS: 1<<64 - 1})),
		"Get":   appendRequest(nil, OpGet, h(partReq{offset: 1<<64 - 1})), "Stats": appendRequest(nil, OpStats, h(partReq{})),
		"Group": appendRequest(nil, OpGroup, h(partReq{name: key})), "GroupStates": appendRequest(nil, OpGroupStates, h(partReq{})),
		"SeekTime": appendRequest(nil, OpSeekTime, h(partReq{t: -1 << 63})), "NextDue": appendRequest(nil, OpNextDue, h(partReq{})),
		"HalfTxs":  appendRequest(nil, OpHalfTxs, h(partReq{name: key, limit: 1<<31 - 1})),
		"Decision": appendRequest(nil, OpDecision, h(partReq{name: key})),
	}
	apply := func(msgs []store.Message) []byte {
		return appendRequest(nil, OpApply, h(partReq{cmd: &store.Command{Op: store.OpAppend, Group: key, TxID: key, Producer: key, Msgs: msgs}}))
	}
	// The cheapest message: a one-byte length, a record of ten one-byte
	// fields (version 1, empty strings, no tags or properties, a nil body,
	// zeros), its flags.
	cheapest := []byte{11, 0x9a, 0x01, 0xa0, 0xa0, 0x90, 0x80, 0xc0, 0, 0, 0, 0, 0}
	none := apply(nil)
	out["ApplyCheapestMessages"] = append(binary.AppendUvarint(bytes.Clone(none[:len(none)-1]), uint64(size/len(cheapest))),
		bytes.Repeat(cheapest, size/len(cheapest))...)
	tags := store.Message{Tags: make([]string, size)}
	out["ApplyEmptyTags"] = apply([]store.Message{tags})
	oneByte := store.Message{Tags: make([]string, size/2)}
	for i := range oneByte.Tags {
		oneByte.Tags[i] = string(rune('a' + i%26))
	}
	out["ApplyOneByteTags"] = apply([]store.Message{oneByte})
	props := store.Message{Properties: map[string]string{}}
	for i := 0; len(props.Properties) < size/6; i++ {
		props.Properties[fmt.Sprintf("%x", i)] = ""
	}
	out["ApplyProperties"] = apply([]store.Message{props})
	out["ApplyClaimedMessages"] = append(none[:len(none)-1], 0xff, 0xff, 0xff, 0x7f) // 2^28 messages, none there
	return out
}

// TestDecodeRequest_AllocationBounded checks that no partition request
// makes the server's decoder allocate more than fuzzseed.RequestAllocK
// times its bytes plus RequestAllocC.
func TestDecodeRequest_AllocationBounded(t *testing.T) {
	for name, req := range worstRequests(1 << 20) {
		op := map[bool]uint16{true: OpApply}[strings.HasPrefix(name, "Apply")]
		if op == 0 {
			op = opOf(t, name)
		}
		t.Run(name, func(t *testing.T) {
			n := fuzzseed.CheckRequestAlloc(t, req, fuzzseed.RequestAllocK, fuzzseed.RequestAllocC, func(b []byte) {
				if _, err := decodeRequest(op, b); err != nil && !errors.Is(err, ErrProtocol) && !errors.Is(err, store.ErrBadCommand) {
					t.Errorf("error %v", err)
				}
			})
			t.Logf("%d bytes: %d allocated", len(req), n)
			if strings.HasPrefix(name, "ApplyCheapest") {
				if _, err := decodeRequest(op, req); err != nil {
					t.Fatalf("the cheapest messages do not decode: %v", err)
				}
			}
		})
	}
}

// opOf is the partition op named name.
func opOf(t testing.TB, name string) uint16 {
	t.Helper()
	for op, n := range map[uint16]string{OpFetch: "Fetch", OpGet: "Get", OpStats: "Stats", OpGroup: "Group", OpGroupStates: "GroupStates",
		OpSeekTime: "SeekTime", OpNextDue: "NextDue", OpHalfTxs: "HalfTxs", OpDecision: "Decision"} {
		if n == name {
			return op
		}
	}
	t.Fatalf("no op %s", name)
	return 0
}

// TestServePartitions_AuthorizesBeforeMessages checks that an Apply's
// messages are decoded only after authorize allowed its head: a refused
// caller's request costs the decoding of a head, whatever it carries.
func TestServePartitions_AuthorizesBeforeMessages(t *testing.T) {
	sv := &service{
		lookup: func(string, int) (partition.Partition, error) { return nil, errors.New("no partition") },
		authorize: func(_, _ string, _ int, _ uint16, cmd *store.Command) error {
			if cmd.Msgs != nil {
				t.Errorf("authorize got %d messages decoded", len(cmd.Msgs))
			}
			return errDenied
		},
		budget: 1 << 20,
	}
	req := worstRequests(1 << 20)["ApplyCheapestMessages"]
	n := fuzzseed.Allocated(func() {
		if _, err := sv.serve(context.Background(), "outsider", OpApply, req); !errors.Is(err, errDenied) {
			t.Errorf("serve: %v, want the refusal", err)
		}
	})
	if n > 64<<10 {
		t.Errorf("a refused Apply of %d bytes allocated %d bytes", len(req), n)
	}
}

var errDenied = errors.New("denied")
