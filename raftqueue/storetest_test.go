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
	// The suite tests no failover: timeouts long enough that its parallel
	// cases keep their leaders on a loaded machine.
	c := newClusterWith(t, 3, raftConfig(time.Second))
	g := c.group(c.leader())
	p, err := g.Partition()
	if err != nil {
		t.Fatal(err)
	}
	return &leaderPartition{Partition: p, c: c, g: g}
}

func TestRun_Group(t *testing.T) {
	storetest.Run(t, openLeaderPartition)
}
