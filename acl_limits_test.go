package mq_test

import (
	"context"
	"errors"
	"testing"

	"github.com/zeze-go/mq"
)

// TestMQ_SetACLRuleLimit checks that SetACL takes MaxACLRules rules and
// refuses one more with ErrInvalidOption before anything is proposed: the
// metadata decoder refuses a longer list, so that a proposal cannot make
// the leader allocate far more than its bytes.
func TestMQ_SetACLRuleLimit(t *testing.T) {
	c := newCluster(t, 1)
	n1 := c.nodes["n1"]
	ctx := context.Background()
	rules := make([]mq.ACLRule, mq.MaxACLRules+1)
	for i := range rules {
		rules[i] = mq.ACLRule{Identity: "n1", Topic: "*", Rights: mq.Produce | mq.Consume | mq.Admin}
	}
	if err := n1.SetACL(ctx, rules); !errors.Is(err, mq.ErrInvalidOption) {
		t.Fatalf("SetACL of %d rules: %v, want ErrInvalidOption", len(rules), err)
	}
	if got := len(n1.ACL()); got != 0 {
		t.Fatalf("%d rules after a refused SetACL, want none", got)
	}
	if err := n1.SetACL(ctx, rules[:mq.MaxACLRules]); err != nil {
		t.Fatalf("SetACL of %d rules: %v", mq.MaxACLRules, err)
	}
	if got := len(n1.ACL()); got != mq.MaxACLRules {
		t.Fatalf("%d rules after SetACL of %d", got, mq.MaxACLRules)
	}
}
