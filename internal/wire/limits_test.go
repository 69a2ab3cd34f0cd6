package wire

import (
	"errors"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

type limitedMsg struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	Name     string
	List     []limitedElem
	Props    map[string]string
}

type limitedElem struct {
	_msgpack struct{} `msgpack:",as_array"` //lint:ignore U1000 msgpack reads its tag
	S        string
	N        int
}

var testLimits = Limits{Elems: 4, Bytes: 8}

func mustMarshal(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestUnmarshalLimited_Limits checks each limit at its value and one past
// it: a list, a map, a string, a binary and an extension.
func TestUnmarshalLimited_Limits(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    any
		ok   bool
	}{
		{"ListAtLimit", &limitedMsg{List: make([]limitedElem, 4)}, true},
		{"ListOverLimit", &limitedMsg{List: make([]limitedElem, 5)}, false},
		{"MapAtLimit", &limitedMsg{Props: map[string]string{"a": "", "b": "", "c": "", "d": ""}}, true},
		{"MapOverLimit", &limitedMsg{Props: map[string]string{"a": "", "b": "", "c": "", "d": "", "e": ""}}, false},
		{"StringAtLimit", &limitedMsg{Name: "12345678"}, true},
		{"StringOverLimit", &limitedMsg{Name: "123456789"}, false},
		{"NestedStringOverLimit", &limitedMsg{List: []limitedElem{{S: "123456789"}}}, false},
		{"BinaryOverLimit", &[]byte{1, 2, 3, 4, 5, 6, 7, 8, 9}, false},
		{"ExtAtLimit", &msgpack.RawMessage{0xd7, 0x01, 1, 2, 3, 4, 5, 6, 7, 8}, true},
		{"ExtOverLimit", &msgpack.RawMessage{0xd8, 0x01, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b []byte
			if raw, ok := tc.v.(*msgpack.RawMessage); ok {
				b = *raw
			} else {
				b = mustMarshal(t, tc.v)
			}
			_, err := skipMsgpack(b, 0, &testLimits)
			if tc.ok && err != nil {
				t.Fatalf("%x: %v", b, err)
			}
			if !tc.ok && !errors.Is(err, ErrOverLimit) {
				t.Fatalf("%x: %v, want ErrOverLimit", b, err)
			}
		})
	}
}

// FuzzUnmarshalLimited: no input panics the decoder or gets past a limit;
// what decodes encodes to what decodes the same, and a cut encoding does
// not decode.
func FuzzUnmarshalLimited(f *testing.F) {
	for _, v := range []*limitedMsg{
		{Name: "n", List: []limitedElem{{S: "a", N: 1}, {N: -3}}, Props: map[string]string{"k": "v"}},
		{}, {List: make([]limitedElem, 4)},
	} {
		f.Add(mustMarshal(f, v))
	}
	f.Add([]byte{0x93, 0xa0, 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0x93, 0xdb, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		var v limitedMsg
		if err := UnmarshalLimited(b, &v, testLimits); err != nil {
			return
		}
		if len(v.Name) > testLimits.Bytes || len(v.List) > testLimits.Elems || len(v.Props) > testLimits.Elems {
			t.Fatalf("%x decodes past the limits: %+v", b, v)
		}
		again := mustMarshal(t, &v)
		var w limitedMsg
		if err := UnmarshalLimited(again, &w, testLimits); err != nil || !reflect.DeepEqual(v, w) {
			t.Fatalf("%+v comes back as %+v, %v", v, w, err)
		}
		if err := UnmarshalLimited(again[:len(again)-1], &w, testLimits); err == nil {
			t.Fatalf("%x cut to %d bytes decodes", again, len(again)-1)
		}
	})
}
