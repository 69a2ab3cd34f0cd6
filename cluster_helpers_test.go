package mq_test

import (
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/internal/testlog"
)

var clusterSecret = []byte("cluster-test-secret-0123456789")

// testCluster is nodes of one cluster in this process, on 127.0.0.1.
type testCluster struct {
	t     testing.TB
	root  string
	nodes map[string]*mq.MQ
	seed  string                      // the first node's address
	opts  func(id string) []mq.Option // more options of node id; nil for none
	sess  time.Duration               // the nodes' SessionTimeout; 0 for a second
	// tls gives node id's ServerTLS and ClientTLS; nil for none.
	tls func(id string) (server, client *tls.Config)
}

// clusterOption is an option of newCluster.
type clusterOption func(*clusterSetup)

// clusterSetup is what newCluster's options set.
type clusterSetup struct {
	opts   func(id string) []mq.Option
	sess   time.Duration
	tls    func(id string) (server, client *tls.Config)
	topics []topicSetup
}

// topicSetup is a topic that newCluster creates once its nodes are up.
type topicSetup struct {
	name  string
	parts int
	opts  mq.Options
}

// withNodeOptions gives node id the options opts(id) too.
func withNodeOptions(opts func(id string) []mq.Option) clusterOption {
	return func(s *clusterSetup) { s.opts = opts }
}

// withSession sets the nodes' SessionTimeout (a second without it).
func withSession(d time.Duration) clusterOption {
	return func(s *clusterSetup) { s.sess = d }
}

// withTLS gives node id the ServerTLS and ClientTLS certs(id) returns.
func withTLS(certs func(id string) (server, client *tls.Config)) clusterOption {
	return func(s *clusterSetup) { s.tls = certs }
}

// withTopic creates topic name with parts partitions and opts through n1
// once the nodes are up, and waits until every node has it.
func withTopic(name string, parts int, opts mq.Options) clusterOption {
	return func(s *clusterSetup) { s.topics = append(s.topics, topicSetup{name, parts, opts}) }
}

// withRaft3 is withTopic of the Raft3 topic r3 with parts partitions.
func withRaft3(parts int) clusterOption {
	return withTopic(r3, parts, mq.Options{Type: mq.Raft3})
}

// withDoubleWrite is withTopic of the DoubleWrite topic "d" with parts
// partitions (opts' other fields as given).
func withDoubleWrite(parts int, opts mq.Options) clusterOption {
	opts.Type = mq.DoubleWrite
	return withTopic("d", parts, opts)
}

// newCluster is the root tests' one cluster: it starts n nodes, n1 to
// n<n> (none when n is 0: the test sets more fields, then calls startAll),
// waits until each sees every node up, and creates the topics of its
// withTopic options. The nodes are closed when the test ends.
func newCluster(t testing.TB, n int, opts ...clusterOption) *testCluster {
	t.Helper()
	var s clusterSetup
	for _, o := range opts {
		o(&s)
	}
	c := &testCluster{t: t, root: t.TempDir(), nodes: map[string]*mq.MQ{}, opts: s.opts, sess: s.sess, tls: s.tls}
	if n == 0 {
		return c
	}
	c.startAll(n)
	for _, tp := range s.topics {
		c.createTopic(tp.name, tp.parts, tp.opts)
	}
	return c
}

// createTopic creates topic name with parts partitions and opts through n1
// and waits until every open node has it.
func (c *testCluster) createTopic(name string, parts int, opts mq.Options) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.nodes["n1"].CreateMQ(ctx, name, parts, opts); err != nil {
		c.t.Fatalf("CreateMQ %s (%v): %v", name, opts.Type, err)
	}
	for id, m := range c.nodes {
		waitFor(c.t, 10*time.Second, "the topic on "+id, func() bool { return m.Topics()[name] == parts })
	}
}

// startAll starts nodes n1 (which starts the cluster) to n<n> and waits
// until each sees every node up.
func (c *testCluster) startAll(n int) {
	c.t.Helper()
	c.start("n1")
	c.seed = c.nodes["n1"].ClusterStatus().Addr
	for i := 2; i <= n; i++ {
		c.start(fmt.Sprintf("n%d", i))
	}
	c.waitUp(n)
}

// waitUp waits until every open node sees n nodes up.
func (c *testCluster) waitUp(n int) {
	c.t.Helper()
	waitFor(c.t, 30*time.Second, "every node up", func() bool {
		for _, m := range c.nodes {
			up := 0
			for _, nd := range m.ClusterStatus().Nodes {
				if nd.Up {
					up++
				}
			}
			if up != n {
				return false
			}
		}
		return true
	})
}

// start opens node id on its directory; every node but the first joins
// through the first's address (or, once it is gone, another's).
func (c *testCluster) start(id string) *mq.MQ {
	c.t.Helper()
	var seeds []string
	if c.seed != "" {
		for other, m := range c.nodes {
			if other != id {
				seeds = append(seeds, m.ClusterStatus().Addr)
			}
		}
	}
	cc := mq.ClusterConfig{
		NodeID: id, Bind: "127.0.0.1:0", Seeds: seeds, Secret: clusterSecret,
		SessionTimeout: cmp.Or(c.sess, time.Second), ElectionTimeout: 200 * time.Millisecond,
	}
	if c.tls != nil {
		cc.ServerTLS, cc.ClientTLS = c.tls(id)
	}
	opts := []mq.Option{mq.WithCluster(cc)}
	if c.opts != nil {
		opts = append(opts, c.opts(id)...)
	}
	m, err := mq.Open(filepath.Join(c.root, id), opts...)
	if err != nil {
		c.t.Fatalf("open %s: %v", id, err)
	}
	c.nodes[id] = m
	c.t.Cleanup(func() { closeNode(id, m) })
	return m
}

// kill closes node id (its data stays).
func (c *testCluster) kill(id string) {
	c.t.Helper()
	if err := closeNode(id, c.nodes[id]); err != nil {
		c.t.Logf("close %s: %v", id, err)
	}
	delete(c.nodes, id)
}

// closeHangs is how long a node's Close may take before closeNode calls it
// a hang.
const closeHangs = 2 * time.Minute

// closeNode closes m. A Close still waiting after closeHangs ends the test
// binary, after printing the goroutines blocked for a minute or more: the
// whole dump of a package timeout, with every node of every test still in
// the process, is too long to read the hang from.
func closeNode(id string, m *mq.MQ) error {
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-stop:
		case <-time.After(closeHangs):
			fmt.Fprintf(os.Stderr, "closing %s hangs after %v; the goroutines blocked for minutes:\n%s\n",
				id, closeHangs, testlog.Goroutines(testlog.BlockedMinutes))
			os.Exit(3)
		}
	}()
	return m.Close()
}

// testCerts makes a CA and, per node id, a certificate naming it (its DNS
// SAN), usable as ServerTLS and ClientTLS.
func testCerts(t testing.TB) func(id string) (server, client *tls.Config) {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey := key()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test cluster CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	var mu sync.Mutex
	serial := int64(1)
	return func(id string) (*tls.Config, *tls.Config) {
		mu.Lock()
		serial++
		n := serial
		mu.Unlock()
		k := key()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(n), Subject: pkix.Name{CommonName: id}, DNSNames: []string{id},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k}
		return &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool},
			&tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool}
	}
}

// isolate cuts (or restores) every link of node id, on both ends.
func (c *testCluster) isolate(id string, down bool) {
	for other, m := range c.nodes {
		if other == id {
			continue
		}
		mq.SetLinkDown(m, id, down)
		if x := c.nodes[id]; x != nil {
			mq.SetLinkDown(x, other, down)
		}
	}
}

// cut cuts (or restores) the link between nodes a and b, both ends.
func (c *testCluster) cut(a, b string, down bool) {
	mq.SetLinkDown(c.nodes[a], b, down)
	mq.SetLinkDown(c.nodes[b], a, down)
}

// othersThan returns the ids of c's open nodes but not, sorted.
func othersThan(c *testCluster, not ...string) []string {
	var out []string
	for id := range c.nodes {
		if !slices.Contains(not, id) {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}
