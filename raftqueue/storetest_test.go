package raftqueue

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq/store"
	"github.com/zeze-go/mq/store/storetest"
)

// leaderPartition serves a three-replica group as one partition: commands
// go through the leader's proposer, reads to the leader's partition. The
// suite's commands carry their own Now (a zero Now must be
// store.ErrBadCommand), so nothing is stamped here.
type leaderPartition struct {
	*store.Partition
	c    *cluster
	g    *Group
	once sync.Once
	err  error
}

func (p *leaderPartition) Apply(ctx context.Context, cmd *store.Command) (store.Result, error) {
	res, err := p.g.Apply(ctx, cmd)
	if errors.Is(err, ErrClosed) {
		return res, store.ErrClosed
	}
	return res, err
}

func (p *leaderPartition) Close() error {
	p.once.Do(func() {
		for i := range p.c.groups {
			if g := p.c.group(i); g != nil {
				p.c.mu.Lock()
				p.c.groups[i] = nil
				p.c.mu.Unlock()
				if err := g.Close(); err != nil && p.err == nil {
					p.err = err
				}
			}
		}
	})
	return p.err
}

func openLeaderPartition(t *testing.T) storetest.Partition {
	return openLeaderPartitionIn(t, t.TempDir())
}

// openLeaderPartitionIn opens the group kept in dir (three replicas'
// directories), creating it on first use.
func openLeaderPartitionIn(t *testing.T, dir string) storetest.Partition {
	// The suite tests no failover: timeouts long enough that its parallel
	// cases keep their leaders on a loaded machine.
	c := newClusterIn(t, dir, 3, raftConfig(500*time.Millisecond))
	g := c.group(c.leader())
	// A new leader may not have applied all that its predecessor acked.
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	p, err := g.LeaderPartition(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	return &leaderPartition{Partition: p, c: c, g: g}
}

func TestRun_Group(t *testing.T) {
	storetest.Run(t, openLeaderPartition)
}

func TestRunDurable_Group(t *testing.T) {
	storetest.RunDurable(t, openLeaderPartitionIn)
}
