package main

import (
	"bytes"
	"encoding/hex"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zeze-go/mq"
)

// TestMqcert: ca, node and secret write what a node's ClusterConfig
// takes; bad usage exits 2, a failure 1, and files are never overwritten.
func TestMqcert(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	call := func(want int, args ...string) string {
		t.Helper()
		var out, errs bytes.Buffer
		if got := run(args, &out, &errs); got != want {
			t.Fatalf("mqcert %v: exit %d, want %d; stderr: %s", args, got, want, errs.String())
		}
		return out.String() + errs.String()
	}
	call(0, "ca", "-dir", dir)
	call(0, "node", "-dir", dir, "-id", "n1")
	if _, _, err := mq.ClusterTLSFiles(filepath.Join(dir, "ca.pem"), filepath.Join(dir, "n1.pem"), filepath.Join(dir, "n1-key.pem")); err != nil {
		t.Fatal(err)
	}
	if out := call(1, "node", "-dir", dir, "-id", "n1"); !strings.Contains(out, "exists") {
		t.Fatalf("second node n1: %s", out)
	}
	call(1, "ca", "-dir", dir)
	call(1, "node", "-dir", dir, "-id", "bad id")
	call(1, "node", "-dir", t.TempDir(), "-id", "n2")
	call(2)
	call(2, "nope")
	call(2, "node", "-dir", dir)
	call(2, "ca", "-dir", dir, "-days", "-1")
	s := strings.TrimSpace(call(0, "secret"))
	if b, err := hex.DecodeString(s); err != nil || len(b) != 32 {
		t.Fatalf("secret %q: %v", s, err)
	}
	m, err := mq.Open(t.TempDir(), mq.WithCluster(mq.ClusterConfig{NodeID: "n1", Bind: "127.0.0.1:0", Bootstrap: true, Secret: []byte(s), InsecurePlaintext: true}))
	if err != nil {
		t.Fatalf("Open with the printed secret: %v", err)
	}
	m.Close()
}
