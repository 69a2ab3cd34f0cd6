package mq_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/internal/testlog"
)

// TestAttack_CloseMutedNode: a node whose writes to every other node
// stall (SetLinkMuted on its side: it still hears them) is closed while
// it runs consumers of a Raft3 partition another node leads, one per
// group. Close must return in bounded time (promise 3), as it does when
// the same links are cut both ways (the "cut" case, the control).
//
// With muted links each consumer's close waits for its worker's last
// commit (store.OpUnclaim, a 10 s ctx) to time out, and the consumers are
// closed one after the other: Close takes about 10 s per consumer, with
// no bound of its own.
func TestAttack_CloseMutedNode(t *testing.T) {
	for _, how := range []string{"cut", "muted"} {
		t.Run(how, func(t *testing.T) { testCloseMutedNode(t, how == "muted") })
	}
}

func testCloseMutedNode(t *testing.T, mute bool) {
	const groups = 5
	const bound = 25 * time.Second
	c := newCluster(t, 3, withSession(time.Second), withRaft3(1))
	lead := leaderOf(t, c, 0)
	victim := othersThan(c, lead)[0]
	m := c.nodes[victim]
	log := &netLog{}
	for g := range groups {
		cons, err := m.NewConsumer(r3, fmt.Sprintf("g%d", g), netHandler(victim, time.Millisecond, log.add))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cons.Close() })
	}
	ctx := testCtx(t)
	p, err := c.nodes[lead].NewProducer(r3)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := p.SendMessage(ctx, &mq.Message{ID: fmt.Sprintf("m%d", i), Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 20*time.Second, "every group's deliveries on "+victim, func() bool { return len(log.all()) >= 10*groups })
	time.Sleep(500 * time.Millisecond) // the offsets committed: the workers wait in a fetch
	set := func(on bool) {
		for _, other := range othersThan(c, victim) {
			if mute {
				mq.SetLinkMuted(m, other, on)
			} else {
				mq.SetLinkDown(m, other, on)
				mq.SetLinkDown(c.nodes[other], victim, on)
			}
		}
	}
	set(true)
	time.Sleep(time.Second)
	began := time.Now()
	done := make(chan error, 1)
	go func() { done <- m.Close() }()
	if os.Getenv("ATTACK_TRACE") != "" {
		go func() {
			for i := 1; ; i++ {
				select {
				case <-done:
					return
				case <-time.After(2 * time.Second):
				}
				fmt.Fprintf(os.Stderr, "=== %v into Close:\n%s\n", time.Since(began).Round(time.Second), testlog.Goroutines(func(s string) bool {
					return strings.Contains(s, "(*MQ).Close(") || strings.Contains(s, "raft.(*Raft).replicate") || strings.Contains(s, "raft.(*Raft).heartbeat")
				}))
			}
		}()
	}
	select {
	case err := <-done:
		t.Logf("Close of %s (%d consumers, links %s) returned after %v: %v", victim, groups, map[bool]string{true: "muted", false: "cut"}[mute],
			time.Since(began).Round(time.Millisecond), err)
	case <-time.After(bound):
		stacks := testlog.Goroutines(func(s string) bool {
			return strings.Contains(s, "(*MQ).Close(") && strings.Contains(s, "zeze-go/mq")
		})
		set(false)
		<-done
		t.Errorf("Close of %s, whose writes to the other nodes are muted, did not return within %v (it returned %v after the links were restored); it was in:\n%s",
			victim, bound, time.Since(began).Round(time.Second), stacks)
	}
	delete(c.nodes, victim)
	set(false)
}
