package testlog

import (
	"strings"
	"testing"
	"time"
)

//go:noinline
func parkedForStacksTest(stop <-chan struct{}) { <-stop }

// TestGoroutines: the kept stacks are whole, and only those kept.
func TestGoroutines(t *testing.T) {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); parkedForStacksTest(stop) }()
	defer func() { close(stop); <-done }()
	var got string
	for range 100 { // until the goroutine has parked
		if got = Goroutines(func(s string) bool { return strings.Contains(s, "parkedForStacksTest") }); got != "" {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if !strings.HasPrefix(got, "goroutine ") || strings.Contains(got, "\n\n") || !strings.Contains(got, "[chan receive") {
		t.Fatalf("kept:\n%s", got)
	}
	if none := Goroutines(func(string) bool { return false }); none != "" {
		t.Fatalf("nothing kept, got:\n%s", none)
	}
	if !BlockedMinutes("goroutine 7 [chan receive, 3 minutes]:\nmain.f()") || BlockedMinutes("goroutine 7 [chan receive]:\nx 3 minutes]") {
		t.Fatal("BlockedMinutes reads the first line only")
	}
}
