package mq_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves a goroutine behind. It is the only
// TestMain of package mq_test: tests that need set-up of their own (child
// processes of the crash tests) do it in their own test function.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
