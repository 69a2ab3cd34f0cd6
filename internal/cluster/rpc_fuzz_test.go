package cluster

import (
	"errors"
	"reflect"
	"testing"

	"github.com/zeze-go/mq/internal/fuzzseed"
	"github.com/zeze-go/mq/internal/metastate"
)

// rpcMessages are the request and reply structs of the cluster's RPC ops,
// each a fresh value to decode into.
var rpcMessages = []func() bounded{
	func() bounded { return &whoLeads{} },
	func() bounded { return &joinReq{} },
	func() bounded { return &checkTxReq{} },
	func() bounded { return &checkTxResp{} },
	func() bounded { return &resultMsg{} },
}

func rpcSeeds() fuzzseed.Seeds {
	valid := []any{
		&whoLeads{ID: "n1", Addr: "127.0.0.1:7400"},
		&joinReq{ID: "n2", Addr: "10.0.0.2:7400"},
		&checkTxReq{TxID: "tx-1", Parts: []PartRef{{Topic: "orders", Part: 3}, {Topic: "audit"}}},
		&checkTxResp{Decision: 1},
		toResultMsg(metastate.Result{Index: 9, Generation: 2, Topic: metastate.Topic{Name: "orders", Type: metastate.TypeSingle, Created: 5,
			Parts: []metastate.Partition{{Replicas: []string{"n1"}, Leader: "n1", Epoch: 1}}}}),
	}
	var seeds [][]any
	for i, v := range valid {
		b, err := encodeMsg(v)
		if err != nil {
			panic(err)
		}
		seeds = append(seeds, []any{byte(i), b}, []any{byte(i), b[:len(b)/2]})
	}
	for _, hostile := range [][]byte{
		{0xdd, 0xff, 0xff, 0xff, 0xff}, {0xdf, 0xff, 0xff, 0xff, 0xff},
		{0xdb, 0xff, 0xff, 0xff, 0xff}, {0xc6, 0xff, 0xff, 0xff, 0xff},
		{0x92, 0xa1, 'x', 0xdd, 0xff, 0xff, 0xff, 0xff}, // checkTxReq claiming 4G parts
		{0x97, 0x01, 0x02, 0x03, 0xa0, 0x01, 0x02, 0xdc, 0xff, 0xff},
	} {
		for i := range rpcMessages {
			seeds = append(seeds, []any{byte(i), hostile})
		}
	}
	return fuzzseed.Seeds{"FuzzRPCMessages": seeds}
}

// FuzzRPCMessages decodes arbitrary bytes as each cluster RPC message: no
// panic, every error is ErrCorrupt, little is allocated, and what decodes
// comes back the same from its encoding.
func FuzzRPCMessages(f *testing.F) {
	fuzzseed.Add(f, rpcSeeds())
	f.Fuzz(func(t *testing.T, kind byte, b []byte) {
		v := rpcMessages[int(kind)%len(rpcMessages)]()
		var err error
		fuzzseed.CheckAlloc(t, len(b), func() { err = decodeMsg(b, v) })
		if err != nil {
			if !errors.Is(err, metastate.ErrCorrupt) {
				t.Fatalf("error %v is not ErrCorrupt", err)
			}
			return
		}
		again, err := encodeMsg(v)
		if err != nil {
			t.Fatal(err)
		}
		w := reflect.New(reflect.TypeOf(v).Elem()).Interface().(bounded)
		if err := decodeMsg(again, w); err != nil || !reflect.DeepEqual(v, w) {
			t.Fatalf("%#v came back as %#v, %v", v, w, err)
		}
	})
}
