package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/zeze-go/mq"
)

// The node process's settings, set by the launcher.
const (
	nodeIDEnv     = "ZEZE_EXAMPLE_NODE"   // node id
	nodeDirEnv    = "ZEZE_EXAMPLE_DIR"    // data directory
	nodeSeedsEnv  = "ZEZE_EXAMPLE_SEEDS"  // comma-separated addresses; empty bootstraps
	nodeSecretEnv = "ZEZE_EXAMPLE_SECRET" // hex cluster secret
	nodeCertsEnv  = "ZEZE_EXAMPLE_CERTS"  // ca.pem, <id>.pem and <id>-key.pem
)

// Short timeouts, so a dead node is noticed within seconds.
const (
	sessionTimeout  = 2 * time.Second
	electionTimeout = 300 * time.Millisecond
	sendInterval    = 4 * time.Millisecond // the producer's pace
)

// The lines a node writes on stdout, one event each:
//
//	addr <host:port>               opened, listening there
//	created                        the topic exists
//	consuming                      the consumer is subscribed
//	assigned <p,p,...>             the consumer's partitions changed ("-" for none)
//	sent <id>                      the producer's message was acknowledged
//	send-error <id> <error>        a send failed; the same message is sent again
//	consumed <id> <partition>      delivered to the listener (before it returns)
//	stopped <n>                    the producer stopped after n acknowledged
//	leading <t/p,...>              the Raft3 partitions this node leads ("-" for none)
//	error <text>                   a command failed; the node goes on
//
// Commands on stdin, one a line: "create <topic> <partitions> <nodes>
// [raft3]", once that many nodes are up, Single unless raft3; "consume
// <topic> <group>"; "produce <topic>"; "stop", which stops the producer;
// "leading". End of input closes the node.

// node is a node process: one MQ, its consumer and producer.
type node struct {
	m *mq.MQ

	outMu sync.Mutex // guards writes to stdout, so lines never interleave

	wg       sync.WaitGroup // the producer and the assignment watcher
	cons     *mq.Consumer   // set by consume, read after wg.Wait
	stopProd chan struct{}  // closed by stop
	prodDone chan int       // the producer's count of acknowledged messages
}

// nodeMain runs a node until its stdin closes and returns the exit code.
func nodeMain() int {
	secret, err := hex.DecodeString(os.Getenv(nodeSecretEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, "node: bad secret:", err)
		return 2
	}
	var seeds []string
	if s := os.Getenv(nodeSeedsEnv); s != "" {
		seeds = strings.Split(s, ",")
	}
	id := os.Getenv(nodeIDEnv)
	certs := os.Getenv(nodeCertsEnv)
	serverTLS, clientTLS, err := mq.ClusterTLSFiles(filepath.Join(certs, "ca.pem"),
		filepath.Join(certs, id+".pem"), filepath.Join(certs, id+"-key.pem"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "node %s: %v\n", id, err)
		return 1
	}
	m, err := mq.Open(os.Getenv(nodeDirEnv), mq.WithCluster(mq.ClusterConfig{
		NodeID: id, Bind: "127.0.0.1:0", Seeds: seeds, Bootstrap: len(seeds) == 0, Secret: secret,
		ServerTLS: serverTLS, ClientTLS: clientTLS,
		SessionTimeout: sessionTimeout, ElectionTimeout: electionTimeout,
	}))
	if err != nil {
		fmt.Fprintf(os.Stderr, "node %s: %v\n", id, err)
		return 1
	}
	n := &node{m: m}
	n.emit("addr", m.ClusterStatus().Addr)

	// Commands come from stdin; its end, when the launcher closed it or
	// died, cancels ctx, which ends any command waiting.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lines := make(chan string)
	go func() {
		defer cancel()
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case line := <-lines:
			if err := n.command(ctx, strings.Fields(line)); err != nil {
				n.emit("error", fmt.Sprintf("%s: %v", line, err))
			}
		}
	}
	return n.close()
}

// close stops the producer and the consumer and closes the node; it exits
// the process if that takes too long.
func (n *node) close() int {
	t := time.AfterFunc(10*time.Second, func() {
		fmt.Fprintln(os.Stderr, "node: close took more than 10s")
		os.Exit(1)
	})
	defer t.Stop()
	n.wg.Wait() // ctx is cancelled: the goroutines return
	code := 0
	if n.cons != nil {
		if err := n.cons.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "node: close consumer:", err)
			code = 1
		}
	}
	if err := n.m.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "node: close:", err)
		code = 1
	}
	return code
}

// emit writes one event line on stdout.
func (n *node) emit(kind string, args ...string) {
	n.outMu.Lock()
	defer n.outMu.Unlock()
	fmt.Fprintln(os.Stdout, strings.Join(append([]string{kind}, args...), " "))
}

func (n *node) command(ctx context.Context, f []string) error {
	switch {
	case (len(f) == 4 || len(f) == 5 && f[4] == "raft3") && f[0] == "create":
		parts, err1 := strconv.Atoi(f[2])
		nodes, err2 := strconv.Atoi(f[3])
		if err := errors.Join(err1, err2); err != nil {
			return err
		}
		typ := mq.Single
		if len(f) == 5 {
			typ = mq.Raft3
		}
		return n.create(ctx, f[1], parts, nodes, typ)
	case len(f) == 1 && f[0] == "leading":
		n.emit("leading", cmp.Or(strings.Join(n.m.ClusterStatus().Leading, ","), "-"))
		return nil
	case len(f) == 3 && f[0] == "consume":
		return n.consume(ctx, f[1], f[2])
	case len(f) == 2 && f[0] == "produce":
		return n.produce(ctx, f[1])
	case len(f) == 1 && f[0] == "stop":
		if n.stopProd == nil {
			return errors.New("not producing")
		}
		close(n.stopProd)
		n.emit("stopped", strconv.Itoa(<-n.prodDone))
		n.stopProd = nil
		return nil
	}
	return errors.New("unknown command")
}

// create creates topic once nodes nodes are up, so that its partitions are
// placed over all of them.
func (n *node) create(ctx context.Context, topic string, partitions, nodes int, typ mq.Type) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := poll(ctx, func() bool {
		up := 0
		for _, nd := range n.m.ClusterStatus().Nodes {
			if nd.Up {
				up++
			}
		}
		return up >= nodes
	}); err != nil {
		return fmt.Errorf("waiting for %d nodes: %w", nodes, err)
	}
	if err := n.m.CreateMQ(ctx, topic, partitions, mq.Options{Type: typ}); err != nil {
		return err
	}
	n.emit("created")
	return nil
}

// consume subscribes to topic as a member of group once this node knows the
// topic; each message is reported before the listener returns nil, so a
// message whose offset is committed has been reported.
func (n *node) consume(ctx context.Context, topic, group string) error {
	if n.cons != nil {
		return errors.New("already consuming")
	}
	wait, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := poll(wait, func() bool { return n.m.Topics()[topic] > 0 }); err != nil {
		return fmt.Errorf("waiting for topic %s: %w", topic, err)
	}
	c, err := n.m.NewConsumer(topic, group, mq.ListenerFunc(
		func(_ context.Context, _ string, msg *mq.Message) error {
			n.emit("consumed", msg.ID, strconv.Itoa(msg.PartitionIndex))
			return nil
		}))
	if err != nil {
		return err
	}
	n.cons = c
	n.emit("consuming")
	n.wg.Go(func() {
		n.watchAssigned(ctx, c)
	})
	return nil
}

// watchAssigned reports the consumer's partitions whenever they change,
// until ctx ends.
func (n *node) watchAssigned(ctx context.Context, c *mq.Consumer) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	var last []int
	for first := true; ; first = false {
		if a := c.Assigned(); first || !slices.Equal(a, last) {
			last = a
			s := make([]string, len(a))
			for i, p := range a {
				s[i] = strconv.Itoa(p)
			}
			n.emit("assigned", cmp.Or(strings.Join(s, ","), "-"))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// produce sends keyed messages one after another, every sendInterval,
// until stop. A failed send is retried with the same message, and so the
// same ID, so that a copy stored by the failed attempt is not stored twice.
func (n *node) produce(ctx context.Context, topic string) error {
	if n.stopProd != nil {
		return errors.New("already producing")
	}
	p, err := n.m.NewProducer(topic)
	if err != nil {
		return err
	}
	stop, done := make(chan struct{}), make(chan int, 1)
	n.stopProd, n.prodDone = stop, done
	n.wg.Go(func() {
		acked := 0
		defer func() { done <- acked }()
		t := time.NewTicker(sendInterval)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-stop:
				return
			case <-t.C:
			}
			msg := &mq.Message{
				ID:   fmt.Sprintf("m-%06d", i),
				Key:  fmt.Sprintf("user-%02d", i%16),
				Body: fmt.Appendf(nil, "order %d", i),
			}
			for {
				sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := p.SendMessage(sctx, msg)
				cancel()
				if err == nil {
					acked++
					n.emit("sent", msg.ID)
					break
				}
				if ctx.Err() != nil {
					return
				}
				n.emit("send-error", msg.ID, err.Error())
				select {
				case <-ctx.Done():
					return
				case <-stop:
					return // unacknowledged: it may or may not have been stored
				case <-time.After(100 * time.Millisecond):
				}
			}
		}
	})
	return nil
}

// poll calls cond every 20ms until it returns true or ctx ends.
func poll(ctx context.Context, cond func() bool) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}
