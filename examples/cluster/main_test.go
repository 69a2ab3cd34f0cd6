package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary serve as a node process: run starts this
// binary again with roleEnv set.
func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) != "" {
		os.Exit(nodeMain())
	}
	os.Exit(m.Run())
}

// TestExample runs the example: three node processes, n3 killed and
// restarted while messages flow, none lost.
func TestExample(t *testing.T) { testExample(t, false) }

// TestExampleRaft3 runs the example with a Raft3 topic: the node leading
// most partitions killed and restarted while messages flow, none lost.
func TestExampleRaft3(t *testing.T) { testExample(t, true) }

func testExample(t *testing.T, raft3 bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out strings.Builder
	err := run(ctx, &out, raft3)
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "lost:       0\n") {
		t.Fatal("no summary with nothing lost")
	}
}
