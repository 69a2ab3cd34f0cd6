package mq_test

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/internal/testlog"
)

var clusterSecret = []byte("3f8a1c6e9b2d5f0a7c4e1b8d3a6f9c2e5b0d7a4f1c8e3b6d")

// testCluster is nodes of one cluster in this process, on 127.0.0.1.
type testCluster struct {
	t     testing.TB
	root  string
	nodes map[string]*mq.MQ
	seed  string                      // the first node's address
	opts  func(id string) []mq.Option // more options of node id; nil for none
	sess  time.Duration               // the nodes' SessionTimeout; 0 for a second
	frame int                         // the nodes' MaxFrameBytes; 0 for the default
	// tls gives node id's ServerTLS and ClientTLS; nil for none.
	tls func(id string) (server, client *tls.Config)
}

// clusterOption is an option of newCluster.
type clusterOption func(*clusterSetup)

// clusterSetup is what newCluster's options set.
type clusterSetup struct {
	opts   func(id string) []mq.Option
	sess   time.Duration
	frame  int
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

// withFrame sets the nodes' MaxFrameBytes.
func withFrame(n int) clusterOption {
	return func(s *clusterSetup) { s.frame = n }
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
	c := &testCluster{t: t, root: t.TempDir(), nodes: map[string]*mq.MQ{}, opts: s.opts, sess: s.sess, frame: s.frame, tls: s.tls}
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
	// Again while the outcome is unknown (a metadata leader lost while
	// committing, on a loaded machine): then an existing topic is this
	// call's, since nothing else creates it.
	err := c.nodes["n1"].CreateMQ(ctx, name, parts, opts)
	for unknown := false; ctx.Err() == nil && (errors.Is(err, mq.ErrUnknownOutcome) || (unknown && errors.Is(err, mq.ErrTopicExists))); {
		if errors.Is(err, mq.ErrTopicExists) {
			err = nil
			break
		}
		unknown = true
		err = c.nodes["n1"].CreateMQ(ctx, name, parts, opts)
	}
	if err != nil {
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
	// Each node's own session too: a process restarted within its
	// session shows up in the others' views before it has registered.
	waitFor(c.t, 30*time.Second, "every node up", func() bool {
		for _, m := range c.nodes {
			if !mq.SessionValid(m) {
				return false
			}
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
		NodeID: id, Bind: "127.0.0.1:0", Seeds: seeds, Bootstrap: len(seeds) == 0, Secret: clusterSecret,
		SessionTimeout: cmp.Or(c.sess, time.Second), ElectionTimeout: 200 * time.Millisecond, MaxFrameBytes: c.frame,
	}
	if c.tls != nil {
		cc.ServerTLS, cc.ClientTLS = c.tls(id)
	} else {
		cc.ServerTLS, cc.ClientTLS = nodeTLS(c.t, id)
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

// testCA is the CA of the root tests' clusters, made once.
var testCA = sync.OnceValues(func() (*mq.ClusterCA, error) { return mq.NewClusterCA("test cluster CA", time.Hour) })

// nodeTLS is node id's ServerTLS and ClientTLS under testCA.
func nodeTLS(t testing.TB, id string) (server, client *tls.Config) {
	t.Helper()
	ca, err := testCA()
	if err != nil {
		t.Fatal(err)
	}
	server, client, err = ca.NodeTLS(id)
	if err != nil {
		t.Fatal(err)
	}
	return server, client
}

// nodeCertsEnv names a child process node's certificate directory, as
// nodeCertsDir writes it.
const nodeCertsEnv = "ZEZE_MQ_NODE_CERTS"

// nodeCertsDir writes node id's certificate under testCA, its key and the
// CA's certificate to a new directory (ca.pem, node.pem, node-key.pem) for
// a node in a child process, and returns it as nodeCertsEnv's setting.
func nodeCertsDir(t testing.TB, id string) string {
	t.Helper()
	ca, err := testCA()
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := ca.IssueNode(id, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, b := range map[string][]byte{"ca.pem": ca.CertPEM(), "node.pem": cert, "node-key.pem": key} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return nodeCertsEnv + "=" + dir
}

// childTLS is the ServerTLS and ClientTLS of a node in a child process,
// from the directory nodeCertsEnv names.
func childTLS() (server, client *tls.Config, err error) {
	dir := os.Getenv(nodeCertsEnv)
	return mq.ClusterTLSFiles(filepath.Join(dir, "ca.pem"), filepath.Join(dir, "node.pem"), filepath.Join(dir, "node-key.pem"))
}

// testCerts makes a CA of its own and, per node id, a certificate naming
// it, as ServerTLS and ClientTLS.
func testCerts(t testing.TB) func(id string) (server, client *tls.Config) {
	t.Helper()
	ca, err := mq.NewClusterCA("another test cluster CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return func(id string) (*tls.Config, *tls.Config) {
		server, client, err := ca.NodeTLS(id)
		if err != nil {
			t.Fatal(err)
		}
		return server, client
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
