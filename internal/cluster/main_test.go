package cluster

import (
	"log/slog"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// A waiter of a raft future that hashicorp/raft v1.7.3 never answers
	// (cluster.Meta.awaitWaiters) outlives the Close that gave it up.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/zeze-go/mq/internal/cluster.(*Meta).wait.func1"))
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
