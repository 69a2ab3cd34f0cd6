package cluster

import (
	"errors"
	"testing"

	"github.com/zeze-go/mq/internal/metastate"
)

// TestCache_Damage: every damaged byte and every cut of a state cache is
// ErrCorrupt, never a State.
func TestCache_Damage(t *testing.T) {
	s, _, err := metastate.New().Apply(1, metastate.RegisterNode{ID: "n1", Addr: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	s, _, err = s.Apply(2, metastate.CreateTopic{Name: "t", Partitions: 2, Type: 1, Replicas: 1, Now: 1})
	if err != nil {
		t.Fatal(err)
	}
	b, err := encodeCache(s)
	if err != nil {
		t.Fatal(err)
	}
	back, err := decodeCache(b)
	if err != nil || back.Index() != 2 {
		t.Fatalf("decodeCache: %v, %v", back, err)
	}
	if _, ok := back.Topic("t"); !ok {
		t.Fatal("the cached state lost its topic")
	}
	for i := range b {
		d := append([]byte(nil), b...)
		d[i] ^= 0x5a
		if _, err := decodeCache(d); !errors.Is(err, metastate.ErrCorrupt) {
			t.Fatalf("byte %d damaged: %v, want ErrCorrupt", i, err)
		}
	}
	for n := range len(b) {
		if _, err := decodeCache(b[:n]); !errors.Is(err, metastate.ErrCorrupt) {
			t.Fatalf("cut at %d: %v, want ErrCorrupt", n, err)
		}
	}
}
