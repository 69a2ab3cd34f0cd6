package mq_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
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

// copyTree copies src to dst, leaving runs of zeros as holes (WAL segments
// are mostly zeros allocated ahead).
func copyTree(t testing.TB, src, dst string) {
	t.Helper()
	err := filepath.Walk(src, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		to := filepath.Join(dst, rel)
		if info.IsDir() {
			return os.MkdirAll(to, 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		out, err := os.Create(to)
		if err != nil {
			return err
		}
		defer out.Close()
		const blk = 64 << 10
		for off := 0; off < len(b); off += blk {
			chunk := b[off:min(off+blk, len(b))]
			if !bytes.ContainsFunc(chunk, func(r rune) bool { return r != 0 }) {
				continue
			}
			if _, err := out.WriteAt(chunk, int64(off)); err != nil {
				return err
			}
		}
		return out.Truncate(int64(len(b)))
	})
	if err != nil {
		t.Fatal(err)
	}
}

// startChild runs the test named test again, in a child process of the
// test binary, with env added to its environment, and returns it started,
// with its standard output and the buffer its standard error goes to.
func startChild(t testing.TB, test string, env ...string) (*exec.Cmd, io.ReadCloser, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	stderr := &bytes.Buffer{}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child: %v", err)
	}
	return cmd, stdout, stderr
}
