package cluster

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zeze-go/mq/internal/metastate"
)

// TestAgent_WildcardUserRuleDoesNotAdmitNodes: with the ACL on, a new
// identity joins only if a rule names it exactly. The common rule
// "everyone may read topic public" (Identity "*", Consume on "public")
// must not admit x9, a holder of a certificate of the cluster's CA, as a
// node and a metadata voter with every node-only power. (Before,
// joinAllowed took any rule whose identity pattern matched.)
func TestAgent_WildcardUserRuleDoesNotAdmitNodes(t *testing.T) {
	a := &agents{t: t, dirs: map[string]string{}, all: map[string]*Agent{}}
	var asked atomic.Int32
	n1, _ := a.startLogged("n1", countingTx(&asked))
	eventually(t, "n1 up", func() bool { return a.allUp(1) })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := n1.Propose(ctx, metastate.SetACL{Rules: []metastate.Rule{
		{Identity: "n1", Topic: "*", Rights: metastate.RightAdmin | metastate.RightConsume | metastate.RightProduce},
		{Identity: "*", Topic: "public", Rights: metastate.RightConsume}}}); err != nil {
		t.Fatal(err)
	}
	x9 := newOutsider(t, "x9")
	req, _ := encodeMsg(&joinReq{ID: "x9", Addr: x9.Addr()})
	if _, err := x9.call(n1.Addr(), opJoin, req); !errors.Is(err, ErrDenied) {
		t.Errorf("x9, which only a read rule for everyone names, joins: %v, want ErrDenied", err)
	}
	if _, ok := n1.Meta().State().Node("x9"); ok || n1.IsNode("x9") {
		t.Errorf("x9 registered as a node of the cluster")
	}
}
