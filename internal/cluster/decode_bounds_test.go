package cluster

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/zeze-go/mq/internal/fuzzseed"
	"github.com/zeze-go/mq/internal/metastate"
)

// mpArray is a msgpack array32 header of n elements.
func mpArray(n int) []byte { return binary.BigEndian.AppendUint32([]byte{0xdd}, uint32(n)) }

// mpMap is a msgpack map32 header of n pairs.
func mpMap(n int) []byte { return binary.BigEndian.AppendUint32([]byte{0xdf}, uint32(n)) }

// mpStr is a msgpack str32 of n bytes.
func mpStr(n int) []byte {
	return append(binary.BigEndian.AppendUint32([]byte{0xdb}, uint32(n)), bytes.Repeat([]byte{'a'}, n)...)
}

// cheapest are the smallest encodings of an element: an empty array (a
// struct or a list), an empty string, a zero, an empty map.
var cheapest = map[string][]byte{"EmptyArrays": {0x90}, "EmptyStrings": {0xa0}, "Zeros": {0x00}, "EmptyMaps": {0x80}, "Rules": {0x93, 0xa0, 0xa0, 0x00}}

// hostileBodies are msgpack values of about size bytes that make a
// decoder allocate the most per byte: a list of the cheapest elements,
// alone, as the last field of a struct of fields fields, and as a map; and
// strings as long as the bytes hold.
func hostileBodies(size, fields int) map[string][]byte {
	out := map[string][]byte{}
	for name, e := range cheapest {
		n := size / len(e)
		list := append(mpArray(n), bytes.Repeat(e, n)...)
		out["List"+name] = list
		last := mpArray(fields)
		for range fields - 1 {
			last = append(last, 0xa0)
		}
		out["LastField"+name] = append(last, list...)
		m := mpMap(n / 2)
		for i := range n / 2 {
			m = append(m, byte(0xa1), byte('a'+i%26))
			m = append(m, e...)
		}
		out["Map"+name] = m
	}
	strs := mpArray(fields)
	for range fields {
		strs = append(strs, mpStr(size/fields)...)
	}
	out["LongStrings"] = strs
	return out
}

// TestDecodeMsg_AllocationBounded checks that no request of the cluster's
// ops (opWhoLeads .. opReport) makes the receiver's decoder allocate more
// than fuzzseed.RequestAllocK times its bytes plus RequestAllocC. A 16 MiB
// check-back request of empty PartRefs, one byte each, made a node
// allocate 1.5 GiB while every list was bounded by the bytes alone.
func TestDecodeMsg_AllocationBounded(t *testing.T) {
	msgs := map[string]struct {
		fields int
		v      func() bounded
	}{
		"JoinReq":    {2, func() bounded { return &joinReq{} }}, // opJoin, opHeartbeat, opAnnounce, opReport
		"CheckTxReq": {2, func() bounded { return &checkTxReq{} }},
		// Replies, which a node decodes from the leader or a peer.
		"WhoLeads":    {2, func() bounded { return &whoLeads{} }},
		"CheckTxResp": {1, func() bounded { return &checkTxResp{} }},
		"ResultMsg":   {9, func() bounded { return &resultMsg{} }},
	}
	for name, m := range msgs {
		for shape, req := range hostileBodies(1<<20, m.fields) {
			t.Run(name+"/"+shape, func(t *testing.T) {
				fuzzseed.CheckRequestAlloc(t, req, fuzzseed.RequestAllocK, fuzzseed.RequestAllocC, func(b []byte) {
					if err := decodeMsg(b, m.v()); err != nil && !errors.Is(err, metastate.ErrCorrupt) {
						t.Errorf("error %v is not ErrCorrupt", err)
					}
				})
			})
		}
	}
	t.Run("CheckTxReq/16MiB", func(t *testing.T) {
		req := append([]byte{0x92, 0xa2, 't', 'x'}, mpArray(16<<20)...)
		req = append(req, bytes.Repeat([]byte{0x90}, 16<<20)...)
		fuzzseed.CheckRequestAlloc(t, req, fuzzseed.RequestAllocK, fuzzseed.RequestAllocC, func(b []byte) {
			if err := decodeMsg(b, &checkTxReq{}); err == nil {
				t.Errorf("%d parts decoded, more than MaxCheckParts %d", 16<<20, MaxCheckParts)
			}
		})
	})
}

// TestDecodeMsg_CheckPartsLimit checks the limit of a check-back request:
// MaxCheckParts parts decode, one more is refused.
func TestDecodeMsg_CheckPartsLimit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		parts int
		ok    bool
	}{{"AtLimit", MaxCheckParts, true}, {"OverLimit", MaxCheckParts + 1, false}} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := encodeMsg(&checkTxReq{TxID: "tx", Parts: make([]PartRef, tc.parts)})
			if err != nil {
				t.Fatal(err)
			}
			var q checkTxReq
			err = decodeMsg(b, &q)
			if tc.ok && (err != nil || len(q.Parts) != tc.parts) {
				t.Fatalf("%d parts: %d decoded, %v", tc.parts, len(q.Parts), err)
			}
			if !tc.ok && !errors.Is(err, metastate.ErrCorrupt) {
				t.Fatalf("%d parts: %v, want ErrCorrupt", tc.parts, err)
			}
		})
	}
}

// TestDecodeCommand_AllocationBounded checks opPropose's decoding, for
// every metadata command kind: no command makes the leader allocate more
// than fuzzseed.RequestAllocK times its bytes plus RequestAllocC. A SetACL
// of a million empty rules, one byte each, allocated 40 bytes a byte.
func TestDecodeCommand_AllocationBounded(t *testing.T) {
	kinds := map[string]metastate.Command{
		"RegisterNode": metastate.RegisterNode{}, "NodeDown": metastate.NodeDown{}, "CreateTopic": metastate.CreateTopic{},
		"AlterTopic": metastate.AlterTopic{}, "JoinGroup": metastate.JoinGroup{}, "LeaveGroup": metastate.LeaveGroup{},
		"Released": metastate.Released{}, "SetACL": metastate.SetACL{}, "SetInSync": metastate.SetInSync{},
		"Promote": metastate.Promote{}, "ReplaceFollower": metastate.ReplaceFollower{}, "RenewEpoch": metastate.RenewEpoch{},
		"HandOver": metastate.HandOver{},
	}
	for name, c := range kinds {
		valid, err := metastate.EncodeCommand(c)
		if err != nil {
			t.Fatal(err)
		}
		head, fields := valid[:3], int(valid[3]&0x0f) // every command is a fixarray
		for _, size := range []int{64 << 10, 1 << 20} {
			for shape, body := range hostileBodies(size, fields) {
				req := append(bytes.Clone(head), body...)
				t.Run(fmt.Sprintf("%s/%s/%dKiB", name, shape, size>>10), func(t *testing.T) {
					fuzzseed.CheckRequestAlloc(t, req, fuzzseed.RequestAllocK, fuzzseed.RequestAllocC, func(b []byte) {
						if _, err := metastate.DecodeCommand(b); err != nil && !errors.Is(err, metastate.ErrCorrupt) && !errors.Is(err, metastate.ErrInvalid) {
							t.Errorf("error %v is neither ErrCorrupt nor ErrInvalid", err)
						}
					})
				})
			}
		}
	}
}
