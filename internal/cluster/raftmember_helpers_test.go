//lint:file-ignore SA1019 raft v1.7.3 still sends the deprecated Leader and Candidate, and the codec handle raft uses, which these tests forge

package cluster

import (
	"context"
	"net"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/metastate"
	"github.com/zeze-go/mq/internal/transport"
	"github.com/zeze-go/mq/internal/transport/transporttest"
)

// forgeMeta returns a NetworkTransport that sends, as node id (which holds
// the cluster secret), requests of the metadata group to the node at addr;
// Cleanup closes it.
func forgeMeta(t testing.TB, id, addr string) *raft.NetworkTransport {
	t.Helper()
	tr, err := transport.Listen(transport.Config{NodeID: id, Bind: "127.0.0.1:0", Secret: testSecret, InsecurePlaintext: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return forgeMetaOver(t, tr, addr)
}

// forgeMetaOver is forgeMeta over tr: requests of the metadata group sent,
// from tr's proven identity, to the node at addr.
func forgeMetaOver(t testing.TB, tr *transport.Transport, addr string) *raft.NetworkTransport {
	t.Helper()
	return transporttest.Forge(t, func(ctx context.Context) (net.Conn, error) { return tr.Dial(ctx, addr, transport.ProtoRaft) },
		metaGroup, tr.Addr())
}

// raftStat is r's statistic name as a number.
var raftStat = transporttest.RaftStat

// forgedSetACL is an AppendEntries, in the name of node as, that would
// append and commit at m's next index, in its term, a SetACL giving as
// every right on every topic.
func forgedSetACL(t testing.TB, m *Meta, as string) *raft.AppendEntriesRequest {
	t.Helper()
	cmd, err := metastate.EncodeCommand(metastate.SetACL{Rules: []metastate.Rule{{Identity: as, Topic: "*",
		Rights: metastate.RightAdmin | metastate.RightProduce | metastate.RightConsume}}})
	if err != nil {
		t.Fatal(err)
	}
	return transporttest.NextAppend(t, m.raft, as, cmd)
}
