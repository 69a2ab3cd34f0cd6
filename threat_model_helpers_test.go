package mq_test

import (
	"context"
	"encoding/binary"
	"net"
	"sync"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/zeze-go/mq/internal/remote"
	"github.com/zeze-go/mq/internal/transport"
	"github.com/zeze-go/mq/internal/transport/transporttest"
)

// impostor holds a certificate of testCA naming id and the cluster
// secret, and calls the cluster's nodes from its own transport: a client
// identity when id is no node, or a node's credentials used by hand, as a
// hostile node would. Everything is closed when the test ends.
type impostor struct {
	t  testing.TB
	tr *transport.Transport

	mu  sync.Mutex
	cli map[string]*remote.Client // guarded by mu, by address
}

func newImpostor(t testing.TB, id string) *impostor {
	t.Helper()
	st, ct := nodeTLS(t, id)
	tr, err := transport.Listen(transport.Config{NodeID: id, Bind: "127.0.0.1:0", Secret: clusterSecret, ServerTLS: st, ClientTLS: ct})
	if err != nil {
		t.Fatal(err)
	}
	im := &impostor{t: t, tr: tr, cli: map[string]*remote.Client{}}
	t.Cleanup(func() {
		im.mu.Lock()
		defer im.mu.Unlock()
		for _, c := range im.cli {
			c.Close()
		}
		tr.Close()
	})
	return im
}

// client is the impostor's RPC client of the node at addr.
func (im *impostor) client(addr string) *remote.Client {
	im.mu.Lock()
	defer im.mu.Unlock()
	c, ok := im.cli[addr]
	if !ok {
		c = remote.NewClient(func(ctx context.Context) (*transport.Conn, error) {
			return im.tr.Dial(ctx, addr, transport.ProtoRPC)
		}, remote.ClientConfig{})
		im.cli[addr] = c
	}
	return c
}

// partition is partition i of topic on the node at addr, through the
// partition service, as the impostor.
func (im *impostor) partition(addr, topic string, i int) *remote.Partition {
	return remote.NewPartition(im.client(addr), topic, i, remote.PartitionConfig{})
}

// raft returns a NetworkTransport sending requests of raft group group
// to the node at addr, over streams of the impostor's own session.
func (im *impostor) raft(addr, group string) *raft.NetworkTransport {
	im.t.Helper()
	return transporttest.Forge(im.t, func(ctx context.Context) (net.Conn, error) {
		return im.tr.Dial(ctx, addr, transport.ProtoRaft)
	}, group, im.tr.Addr())
}

// pairAppend is an OpPairAppend request (replica's layout, version 1) for
// partition i of topic: one entry at index, in epoch, its data data.
func pairAppend(topic string, i int, epoch, index uint64, data []byte) []byte {
	b := binary.AppendUvarint(nil, uint64(len(topic)))
	b = append(b, topic...)
	b = binary.AppendUvarint(b, uint64(i))
	b = append(b, 1, 0) // version, flags
	for _, v := range []uint64{epoch, index - 1, epoch, index, 1, index, epoch, uint64(raft.LogCommand), uint64(len(data))} {
		b = binary.AppendUvarint(b, v)
	}
	return append(b, data...)
}
