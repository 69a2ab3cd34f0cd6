package mq_test

import (
	"context"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

// openNode opens a node in dir (a new temporary directory when dir is "")
// and closes it when the test ends.
func openNode(t testing.TB, dir string, opts ...mq.Option) *mq.MQ {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	m, err := mq.Open(dir, opts...)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return m
}

// mustCreate creates topic with n partitions.
func mustCreate(t testing.TB, m *mq.MQ, topic string, n int) {
	t.Helper()
	if err := m.CreateMQ(context.Background(), topic, n, mq.Options{Type: mq.Single}); err != nil {
		t.Fatalf("CreateMQ(%s, %d): %v", topic, n, err)
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
