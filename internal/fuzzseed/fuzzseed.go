// Package fuzzseed holds what the fuzz targets of several packages share:
// adding a target's seeds, writing them as the fuzzer's corpus files, and
// bounding what decoding one input may allocate. Only tests import it.
package fuzzseed

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"runtime/metrics"
	"testing"
)

// Seeds maps a fuzz target's name to its seed inputs, each the arguments of
// one f.Add.
type Seeds map[string][][]any

// Add adds the seeds of f's target; a target without seeds fails.
func Add(f *testing.F, seeds Seeds) {
	list, ok := seeds[f.Name()]
	if !ok {
		f.Fatalf("no seeds for %s", f.Name())
	}
	for _, s := range list {
		f.Add(s...)
	}
}

// WriteCorpus writes seeds to testdata/fuzz/<target>/ in the fuzzer's
// corpus format, named as the fuzzer names them; files already there are
// kept.
func WriteCorpus(t testing.TB, seeds Seeds) {
	t.Helper()
	for name, list := range seeds {
		dir := filepath.Join("testdata", "fuzz", name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, s := range list {
			b := []byte("go test fuzz v1\n")
			for _, v := range s {
				switch v := v.(type) {
				case []byte:
					b = fmt.Appendf(b, "[]byte(%q)\n", v)
				case string:
					b = fmt.Appendf(b, "string(%q)\n", v)
				case int:
					b = fmt.Appendf(b, "int(%d)\n", v)
				default:
					t.Fatalf("%s: seed value of type %T", name, v)
				}
			}
			path := filepath.Join(dir, fmt.Sprintf("%x", sha256.Sum256(b))[:16])
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// AllocBudget is what decoding n bytes may allocate: a constant, since the
// heap counter is approximate and counts small objects a span at a time,
// plus a small multiple of n. A length believed before it is checked
// allocates gigabytes.
func AllocBudget(n int) uint64 { return 4<<20 + 256*uint64(n) }

// CheckAlloc runs fn and fails t if it allocated more than AllocBudget(n).
func CheckAlloc(t testing.TB, n int, fn func()) {
	t.Helper()
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	before := s[0].Value.Uint64()
	fn()
	metrics.Read(s)
	if d := s[0].Value.Uint64() - before; d > AllocBudget(n) {
		t.Fatalf("decoding %d bytes allocated %d bytes", n, d)
	}
}
