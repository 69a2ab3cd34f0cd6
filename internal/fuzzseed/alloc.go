package fuzzseed

import (
	"runtime"
	"testing"
)

// A request's decoding may allocate at most RequestAllocK times the
// request's bytes plus RequestAllocC: the bound the cluster port keeps for
// every op (docs/DESIGN.md §7, "Frames"). k covers what a decoded value
// costs beside its bytes (a one-byte empty string becomes a 16-byte
// header), C the lists bounded by their type's maximum and the heap
// counter's grain, a span per size class.
const (
	RequestAllocK = 16
	RequestAllocC = 512 << 10
)

// Allocated returns the bytes fn allocates, by runtime.MemStats.TotalAlloc:
// the least of three runs, so that another goroutine's allocation during
// one run does not count. fn must do the same each time.
func Allocated(fn func()) uint64 {
	least := ^uint64(0)
	var ms runtime.MemStats
	for range 3 {
		runtime.ReadMemStats(&ms)
		before := ms.TotalAlloc
		fn()
		runtime.ReadMemStats(&ms)
		least = min(least, ms.TotalAlloc-before)
	}
	return least
}

// CheckRequestAlloc fails t unless decoding the request req with decode
// allocates at most k·len(req) + c bytes; it returns what decode
// allocated. decode's result is not checked: a refused request must stay
// within the bound too.
func CheckRequestAlloc(t testing.TB, req []byte, k, c uint64, decode func([]byte)) uint64 {
	t.Helper()
	n := Allocated(func() { decode(req) })
	if bound := k*uint64(len(req)) + c; n > bound {
		t.Errorf("decoding a request of %d bytes allocated %d bytes (%.1f per byte), more than %d·%d + %d = %d",
			len(req), n, float64(n)/float64(max(len(req), 1)), k, len(req), c, bound)
	}
	return n
}
