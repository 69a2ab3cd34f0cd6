package txn

import (
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/zeze-go/mq/internal/fuzzseed"
	"github.com/zeze-go/mq/store"
)

// FuzzTxRows decodes arbitrary marker and outbox rows: no panic, any error
// is ErrCorrupt, little is allocated, and what decodes (in either version)
// comes back the same from the encoding written now.
func FuzzTxRows(f *testing.F) {
	fuzzseed.Add(f, fuzzSeeds())
	f.Fuzz(func(t *testing.T, marker, row []byte) {
		var (
			owner  string
			halves []Ref
			err    error
		)
		fuzzseed.CheckAlloc(t, len(marker), func() { owner, halves, err = decodeMarker("tx", marker) })
		switch {
		case err != nil && !errors.Is(err, ErrCorrupt):
			t.Fatalf("marker error %v is not ErrCorrupt", err)
		case err == nil:
			owner2, again, err := decodeMarker("tx", encodeMarker(owner, halves))
			if err != nil || owner2 != owner || !slices.Equal(again, halves) {
				t.Fatalf("marker %q %v came back as %q %v, %v", owner, halves, owner2, again, err)
			}
		}
		var (
			ref Ref
			m   store.Message
		)
		fuzzseed.CheckAlloc(t, len(row), func() { ref, m, err = decodeOutboxRow("tx", row) })
		switch {
		case err != nil && !errors.Is(err, ErrCorrupt):
			t.Fatalf("outbox error %v is not ErrCorrupt", err)
		case err == nil:
			ref2, m2, err := decodeOutboxRow("tx", encodeOutboxRow(ref, &m))
			if err != nil || ref2 != ref || !reflect.DeepEqual(m2, m) {
				t.Fatalf("outbox row %v %+v came back as %v %+v, %v", ref, m, ref2, m2, err)
			}
		}
	})
}
