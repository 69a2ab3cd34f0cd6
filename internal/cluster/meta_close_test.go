package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// unanswered is a raft future that is never answered, as hashicorp/raft
// v1.7.3 leaves the future of a committed entry still queued for its FSM
// when it shuts down.
type unanswered struct{ never chan struct{} }

func (f unanswered) Error() error {
	<-f.never
	return nil
}

// TestMeta_CloseDoesNotWaitForUnansweredFutures: a proposal whose ctx ended
// returns ErrUnknownOutcome, and Close returns within its grace even when
// raft never answers that proposal's future. Close waited for ever when
// raft dropped such a future at its shutdown.
func TestMeta_CloseDoesNotWaitForUnansweredFutures(t *testing.T) {
	m, err := openMetaAlone(t.TempDir(), discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	never := make(chan struct{})
	defer close(never) // the given-up waiter ends with the test
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := m.wait(ctx, func() raft.Future { return unanswered{never} }); !errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("a wait whose ctx ended: %v, want ErrUnknownOutcome", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- m.Close() }()
	select {
	case <-closed:
	case <-time.After(waitersGrace + 10*time.Second):
		t.Fatal("Close still waits for a raft future that is never answered")
	}
}
