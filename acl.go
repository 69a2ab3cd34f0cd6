package mq

import (
	"context"
	"fmt"

	"github.com/zeze-go/mq/internal/metastate"
)

// Rights are what an ACL rule allows; combine them with |.
type Rights uint8

// The rights. They are independent: Admin does not imply Produce.
const (
	// Produce: send to the topic, with SendMessage or in a transaction.
	Produce Rights = Rights(metastate.RightProduce)
	// Consume: consume the topic in a group (NewConsumer), read it
	// (ReadMessage, Lag).
	Consume Rights = Rights(metastate.RightConsume)
	// Admin: create and alter the topic, reset and delete its groups'
	// offsets, resolve transactions; Admin on "*" also sets the ACL.
	Admin Rights = Rights(metastate.RightAdmin)
)

// ACLRule allows the nodes whose id matches Identity to do Rights on the
// topics whose name matches Topic. Where a call names a consumer group
// (consuming in a group, which claims, commits and releases its offsets;
// resetting or deleting them), the rule also needs Group to match the
// group's name: empty matches every group, as "*" does, so a rule without
// one covers every group of its topics. A broadcasting consumer's offsets
// are its group's. A pattern is a name, or a prefix followed by '*'; "*"
// alone matches everything.
type ACLRule struct {
	Identity string
	Topic    string
	Rights   Rights
	Group    string
}

// MaxACLRules is the most rules SetACL takes.
const MaxACLRules = metastate.MaxRules

// SetACL replaces the cluster's access rules, at most MaxACLRules of them
// (more return ErrInvalidOption). Once there is a rule, every call is
// refused with ErrDenied unless a rule allows the calling node's identity
// the right on the topic. The identity is the node id, which its
// certificate names when the cluster uses TLS; the node that refused logs
// the refusal once per identity, topic and right. No rules turn access
// control off, as it is at first. With rules, a node that is not in the
// cluster yet joins only if a rule names its id exactly, with no '*',
// whatever the rule grants. Keep a rule giving some node Admin on
// "*": only such a node can change the rules again. A group's retry and
// dead-letter topics are checked as the group's: a node that may consume
// some topic in the group may create, consume and read them, and its
// Concurrent consumers retry there, while resetting their offsets needs
// Admin; rules naming the system topics themselves grant nothing there.
// It needs Admin on "*"
// under the current rules, and a cluster: a standalone node returns
// ErrUnsupportedType.
func (m *MQ) SetACL(ctx context.Context, rules []ACLRule) error {
	if m.closed.Load() {
		return ErrClosed
	}
	if m.cluster == nil {
		return fmt.Errorf("%w: ACLs need a cluster", ErrUnsupportedType)
	}
	if len(rules) > MaxACLRules {
		return fmt.Errorf("%w: %d ACL rules, at most %d", ErrInvalidOption, len(rules), MaxACLRules)
	}
	cr := make([]metastate.Rule, len(rules))
	for i, r := range rules {
		cr[i] = metastate.Rule{Identity: r.Identity, Topic: r.Topic, Rights: metastate.Rights(r.Rights), Group: r.Group}
	}
	index, err := m.cluster.SetACL(ctx, cr)
	if err != nil {
		return clusterErr(err)
	}
	return m.cluster.AwaitIndex(ctx, index)
}

// ACL returns the cluster's access rules; a standalone node has none.
func (m *MQ) ACL() []ACLRule {
	if m.cluster == nil {
		return nil
	}
	var out []ACLRule
	for _, r := range m.cluster.ACL() {
		out = append(out, ACLRule{Identity: r.Identity, Topic: r.Topic, Rights: Rights(r.Rights), Group: r.Group})
	}
	return out
}

// allowed returns ErrDenied unless this node may do right on topic: always
// on a standalone node. A system topic's calls are its group's.
func (m *MQ) allowed(topic string, right Rights) error {
	if m.cluster == nil {
		return nil
	}
	return translate(m.cluster.Allowed(m.cluster.ID(), topic, metastate.Rights(right)))
}

// allowedGroup is allowed for a call naming consumer group group, which
// some rule's Group must match too.
func (m *MQ) allowedGroup(topic, group string, right Rights) error {
	if m.cluster == nil {
		return nil
	}
	return translate(m.cluster.AllowedGroup(m.cluster.ID(), topic, group, metastate.Rights(right)))
}

// String names the rights: "produce|consume|admin", "nothing" for none.
func (r Rights) String() string { return metastate.Rights(r).String() }
