package remote

import (
	"testing"
	"time"

	"github.com/zeze-go/mq/store/storetest"
)

// The conformance suite over the network: a store partition served by one
// node, reached from another through a remote Partition. The store is
// served as it is (not as partition.Local), so that a command without Now
// is ErrBadCommand, as the suite requires.
func TestRun_Remote(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Partition {
		return serve(t, t.TempDir(), nil, PartitionConfig{MaxWait: 200 * time.Millisecond})
	})
}

func TestRunDurable_Remote(t *testing.T) {
	storetest.RunDurable(t, func(t *testing.T, dir string) storetest.Partition {
		return serve(t, dir, nil, PartitionConfig{})
	})
}
