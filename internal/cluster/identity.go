package cluster

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/zeze-go/mq/internal/metastate"
	"github.com/zeze-go/mq/store"
)

// Who may call what on the node's RPC port. Every connection's peer id is
// proven by the transport (a certificate naming it; in InsecurePlaintext
// mode, the secret). A current node of the cluster is one the metadata
// state records, up or down (nodes are never removed), or one the saved
// address book names while the state is not back yet. The node-only ops,
// opHeartbeat, opPropose, opAnnounce, opReport and opCheckTx, are refused
// to any other identity before their body is decoded; opWhoLeads is open
// to every authenticated peer, and opJoin makes an identity a node, or
// moves a node (joinAllowed).

// IsNode reports whether peer is a current node of the cluster: this node,
// one the metadata state records, up or down, or one the saved address
// book names.
func (n *Agent) IsNode(peer string) bool {
	if peer == n.cfg.ID {
		return true
	}
	if _, ok := n.meta.State().Node(peer); ok {
		return true
	}
	if book := n.book.Load(); book != nil {
		_, ok := (*book)[peer]
		return ok
	}
	return false
}

// refuse logs err, a refusal of peer's call, once per identity and cause
// (Refusals.First), and returns it. cause is fixed text, never a value
// the caller chose.
func (n *Agent) refuse(peer, cause string, err error) error {
	if ok, unlogged := n.refused.First(peer + "\x00" + cause); ok {
		n.log.Warn("refused a call", "identity", peer, "cause", cause, "err", err, "unlogged", unlogged)
	}
	return err
}

// maxRefusals bounds the keys Refusals remembers; refusalEvery is how often
// a refusal of a new key is logged past that bound.
const (
	maxRefusals  = 1024
	refusalEvery = time.Minute
)

// Refusals remembers the refusals logged, by key (an identity and a fixed
// cause), so that each key is logged once. It remembers at most
// maxRefusals keys, since identities are the callers' to choose: past
// that, a refusal of a key it does not hold is logged at most once every
// refusalEvery, with the number of such refusals not logged before it.
// The zero value is ready; safe for concurrent use.
type Refusals struct {
	mu       sync.Mutex
	seen     map[string]struct{} // guarded by mu
	unlogged int                 // refusals of new keys not logged since the last one past the bound; guarded by mu
	last     time.Time           // when the last one past the bound was logged; guarded by mu
}

// First reports whether a refusal of key is to be logged, and how many
// refusals were not logged, past the bound, before it.
func (r *Refusals) First(key string) (ok bool, unlogged int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, seen := r.seen[key]; seen {
		return false, 0
	}
	if len(r.seen) < maxRefusals {
		if r.seen == nil {
			r.seen = map[string]struct{}{}
		}
		r.seen[key] = struct{}{}
		return true, 0
	}
	if now := time.Now(); now.Sub(r.last) >= refusalEvery {
		r.last, unlogged, r.unlogged = now, r.unlogged, 0
		return true, unlogged
	}
	r.unlogged++
	return false, 0
}

// ErrBehind is what a peer this node does not know gets while the node's
// metadata state is behind the cluster's (Behind): the peer may have
// joined since, and tries again. It wraps store.ErrClosed, which callers
// of a partition retry.
var ErrBehind = fmt.Errorf("%w: metadata behind", store.ErrClosed)

// NodeOnly returns nil if peer is a current node of the cluster, for a
// call of op: ErrBehind while this node's metadata is behind and does not
// know peer, else ErrDenied, logged.
func (n *Agent) NodeOnly(peer, op string) error {
	if n.IsNode(peer) {
		return nil
	}
	if n.Behind() {
		return fmt.Errorf("%w: %s is unknown to node %s (%s)", ErrBehind, peer, n.cfg.ID, op)
	}
	return n.refuse(peer, "not a node: "+op, fmt.Errorf("%w: %s is not a node of this cluster (%s)", ErrDenied, peer, op))
}

// dialBackTimeout bounds joinAllowed's dial to a joining node.
const dialBackTimeout = 5 * time.Second

// joinAllowed decides whether peer may register at addr:
//
//   - this node registers itself freely, and a node the metadata state
//     records at addr comes back up there;
//   - with the ACL on, an identity that is not a node yet joins only if a
//     rule names it exactly (an identity pattern without '*'), whatever
//     the rule grants: the operator names a node in the ACL before it
//     joins, as etcd adds a member before it starts, and a rule for
//     everyone ("*") or for a prefix names no node;
//   - otherwise, a new node as a node registering another address, the
//     leader dials peer back at addr and the node there must prove it is
//     peer: with TLS its certificate names peer and serves the server
//     side (the connection peer made proved the client side), so only an
//     identity with a node certificate (mq.ClusterCA.IssueNode) joins,
//     never one that can only dial, such as a client's; and the address
//     it registers is one where it listens, never another's.
func (n *Agent) joinAllowed(ctx context.Context, peer, addr string) error {
	if peer == n.cfg.ID {
		return nil
	}
	st := n.meta.State()
	if nd, ok := st.Node(peer); ok && nd.Addr == addr {
		return nil
	}
	if acl := st.ACL(); len(acl) > 0 && !n.IsNode(peer) && !metastate.NamesIdentity(acl, peer) {
		return n.refuse(peer, "join: not in the ACL", fmt.Errorf("%w: no ACL rule names %s, which may not join", ErrDenied, peer))
	}
	ctx, cancel := context.WithTimeout(ctx, dialBackTimeout)
	defer cancel()
	c, err := n.dial(ctx, addr, peer)
	if err != nil {
		return n.refuse(peer, "join: dial-back failed",
			fmt.Errorf("%w: %s cannot be reached as itself at %q, where it joins: %v", ErrDenied, peer, addr, err))
	}
	c.Close()
	return nil
}

// holdsAll returns ErrDenied unless parts is not empty and peer holds a
// replica of each of them.
func (n *Agent) holdsAll(peer string, parts []PartRef) error {
	if len(parts) == 0 {
		return fmt.Errorf("%w: %s checks back no partition", ErrDenied, peer)
	}
	st := n.meta.State()
	for _, r := range parts {
		if p, ok := st.Partition(r.Topic, r.Part); !ok || !slices.Contains(p.Replicas, peer) {
			return fmt.Errorf("%w: %s holds no replica of %s/%d", ErrDenied, peer, r.Topic, r.Part)
		}
	}
	return nil
}

// OwnMember reports whether member is a group member of node: named
// MemberName(node, …).
func OwnMember(node, member string) bool { return ownMember(node, member) }
