package main

import (
	"context"
	"crypto/tls"

	"github.com/zeze-go/mq"
)

func init() {
	register("remote-tls", "remote with both nodes on mutual TLS 1.3 (certificates of an mq.NewClusterCA), against remote's InsecurePlaintext: ratio remote-tls/remote", withTLS(runRemote))
	register("raft3-tls", "raft3 with the three nodes on mutual TLS 1.3: ratio raft3-tls/raft3", withTLS(runRaft3Node))
	register("doublewrite-tls", "doublewrite with the three nodes on mutual TLS 1.3: ratio doublewrite-tls/doublewrite", withTLS(runDoubleWrite))
}

// withTLS is run with the case's cluster nodes on mutual TLS.
func withTLS(run caseFunc) caseFunc {
	return func(ctx context.Context, b *bench) (result, error) {
		b.tls = true
		return run(ctx, b)
	}
}

// nodeTLS returns node id's ServerTLS and ClientTLS, issued by the case's
// CA, which the first call makes.
func (b *bench) nodeTLS(id string) (server, client *tls.Config, err error) {
	if b.ca == nil {
		if b.ca, err = mq.NewClusterCA("mqbench", 0); err != nil {
			return nil, nil, err
		}
	}
	return b.ca.NodeTLS(id)
}
