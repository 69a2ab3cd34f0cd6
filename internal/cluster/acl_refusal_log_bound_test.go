package cluster

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/metastate"
)

// TestAgent_ACLRefusalsLoggedOncePerIdentity: a node whose ACL rights are
// limited (n2: none) proposes commands it may not, each naming another
// topic. The leader refuses every one and must log a bounded number of
// lines about one identity. (Before, it remembered the refusals by their
// error text, which holds the topic name the node chose, so each new name
// was a new log line and a new entry kept forever: a node with no rights
// filled the leader's log and memory.)
func TestAgent_ACLRefusalsLoggedOncePerIdentity(t *testing.T) {
	a := &agents{t: t, dirs: map[string]string{}, all: map[string]*Agent{}}
	n1, logs := a.startLogged("n1", noTx)
	eventually(t, "n1 up", func() bool { return a.allUp(1) })
	n2 := a.start("n2", n1.Addr())
	eventually(t, "n2 up", func() bool { return a.allUp(2) })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := n1.Propose(ctx, metastate.SetACL{Rules: []metastate.Rule{
		{Identity: "n1", Topic: "*", Rights: metastate.RightAdmin | metastate.RightProduce | metastate.RightConsume},
	}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the ACL on n2", func() bool { return len(n2.Meta().State().ACL()) > 0 })
	const calls = 200
	for i := range calls {
		_, err := n2.Propose(ctx, metastate.CreateTopic{Name: fmt.Sprintf("t%d", i), Partitions: 1, Type: metastate.TypeSingle, Now: 1})
		if !errors.Is(err, ErrDenied) {
			t.Fatalf("call %d: %v, want ErrDenied", i, err)
		}
	}
	if n := logs.count("refused by the cluster's ACL", "n2"); n > 10 {
		t.Errorf("%d refused calls of n2 made %d log lines on the leader", calls, n)
	}
}
