package mq_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/zeze-go/mq"
)

// The node process of the process fault test (cluster_process_faults_test.go):
// the test binary re-executed with pnodeEnv set runs one cluster node and
// its clients, driven by commands on its stdin, one per line, and writes
// what happened on its stdout, one line per event:
//
//	create <topic> <type> <parts>  → created <topic> | fail <why>
//	send <topic> <senders>         → ack <id> <topic> <part> <off> <key> <seq>,
//	                                 refused <id> <err>, unknown <id> per send
//	consume <topic>                → recv <id> <node.run> <topic> <part> <off> <begin> <end>
//	                                 per delivery to group "g": when its handler
//	                                 began and ended (Unix nanoseconds)
//	cut <peer> <0|1>               → cut: its side of the link to peer
//	mute <peer> <0|1>              → mute: what it writes to peer stalls
//	status <nodes>                 → status <ok|wait> <why>: whole with that many nodes
//	drain <node>                   → drained <node> <err>: DrainNode, then its replicas gone
//	remove <node>                  → removed <node> <err>: RemoveNode once the node is down
//	move <topic> <part>            → moved <from> <err>: MoveReplica of the pair's follower
//	stop                           → stopped, once every sender returned
//	dump <topic> <parts>           → msg <topic> <part> <off> <id> per message, then dumped <topic>
//	close                          → closed, then the process exits
//
// Each sender sends keyed messages one at a time, its own key, in sequence.
// A send whose outcome is unknown is sent again with its ID until it is
// acknowledged or refused; a refused one (definite: ErrNoQuorum with no
// ctx error in it) is given up, and the next message has a new ID.
const pnodeEnv = "ZEZE_MQ_PNODE"

// pnodeConfig is the node process's configuration, JSON in pnodeEnv.
type pnodeConfig struct {
	ID, Dir   string
	Seeds     []string
	Bootstrap bool
	Run       int // the process's number among the node's runs: in IDs and keys
	Broken    bool
	Session   time.Duration
}

// pnode is the running node process.
type pnode struct {
	cfg     pnodeConfig
	m       *mq.MQ
	outMu   sync.Mutex
	stop    chan struct{}
	senders sync.WaitGroup
}

func (p *pnode) println(format string, args ...any) {
	line := fmt.Sprintf(format, args...) + "\n"
	p.outMu.Lock()
	defer p.outMu.Unlock()
	if _, err := os.Stdout.WriteString(line); err != nil {
		os.Exit(4) // the test is gone
	}
}

// runProcessNode is the node process: it never returns.
func runProcessNode(env string) {
	var cfg pnodeConfig
	if err := json.Unmarshal([]byte(env), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "node process: config: %v\n", err)
		os.Exit(3)
	}
	fail := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "node process %s: "+format+"\n", append([]any{cfg.ID}, args...)...)
		os.Exit(3)
	}
	if cfg.Broken {
		mq.BreakAcks()
		mq.BreakOwnership()
	}
	server, client, err := childTLS()
	if err != nil {
		fail("certificates: %v", err)
	}
	m, err := mq.Open(cfg.Dir, mq.WithCluster(mq.ClusterConfig{
		NodeID: cfg.ID, Bind: "127.0.0.1:0", Seeds: cfg.Seeds, Bootstrap: cfg.Bootstrap, Secret: clusterSecret,
		ServerTLS: server, ClientTLS: client, SessionTimeout: cfg.Session, ElectionTimeout: 200 * time.Millisecond,
	}))
	if err != nil {
		fail("open: %v", err)
	}
	p := &pnode{cfg: cfg, m: m, stop: make(chan struct{})}
	p.println("addr %s", m.ClusterStatus().Addr)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "create":
			parts, _ := strconv.Atoi(f[3])
			p.create(f[1], f[2], parts)
		case "send":
			n, _ := strconv.Atoi(f[2])
			for s := range n {
				p.senders.Add(1)
				go p.send(f[1], s)
			}
		case "consume":
			p.consume(f[1])
		case "cut":
			mq.SetLinkDown(m, f[1], f[2] == "1")
		case "mute":
			mq.SetLinkMuted(m, f[1], f[2] == "1")
		case "status":
			n, _ := strconv.Atoi(f[1])
			p.status(n)
		case "drain":
			p.println("drained %s %v", f[1], oneLine(p.drain(f[1])))
		case "remove":
			p.println("removed %s %v", f[1], oneLine(p.remove(f[1])))
		case "move":
			part, _ := strconv.Atoi(f[2])
			leader, replicas, _, _ := mq.PairRecord(p.m, f[1], part)
			from := ""
			for _, r := range replicas {
				if r != leader {
					from = r
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			err := p.m.MoveReplica(ctx, f[1], part, from, "")
			cancel()
			p.println("moved %s %v", from, oneLine(err))
		case "balance":
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			moved, err := m.BalanceLeaders(ctx)
			cancel()
			p.println("balanced %d %v", moved, oneLine(err))
		case "stop":
			close(p.stop)
			p.senders.Wait()
			p.println("stopped")
		case "dump":
			parts, _ := strconv.Atoi(f[2])
			p.dump(f[1], parts)
		case "close":
			if err := m.Close(); err != nil {
				fail("close: %v", err)
			}
			p.println("closed")
			os.Exit(0)
		default:
			fail("unknown command %q", in.Text())
		}
	}
	os.Exit(0) // stdin closed: the test is gone
}

func (p *pnode) create(topic, typ string, parts int) {
	t := map[string]mq.Type{"raft3": mq.Raft3, "doublewrite": mq.DoubleWrite}[typ]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		err := p.m.CreateMQ(ctx, topic, parts, mq.Options{Type: t, PartitionsPerRaftGroup: map[mq.Type]int{mq.Raft3: 1}[t],
			PartitionsPerPair: map[mq.Type]int{mq.DoubleWrite: 1}[t]})
		switch {
		case err == nil || errors.Is(err, mq.ErrTopicExists):
			p.println("created %s", topic)
			return
		case ctx.Err() != nil:
			p.println("fail create %s: %v", topic, err)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// definite reports whether err says a send stored nothing.
func definite(err error) bool {
	return errors.Is(err, mq.ErrNoQuorum) && !errors.Is(err, mq.ErrUnknownOutcome) &&
		!errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled)
}

func (p *pnode) send(topic string, s int) {
	defer p.senders.Done()
	key := fmt.Sprintf("%s.%d.%s.%d", p.cfg.ID, p.cfg.Run, topic, s)
	var pr *mq.Producer
	for pr == nil {
		var err error
		if pr, err = p.m.NewProducer(topic); err != nil {
			select {
			case <-p.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	defer pr.Close()
	for seq := 0; ; seq++ {
		msg := &mq.Message{ID: fmt.Sprintf("%s.%d", key, seq), Key: key, Body: []byte(key)}
		for {
			select {
			case <-p.stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			res, err := pr.SendMessage(ctx, msg)
			cancel()
			if err == nil {
				p.println("ack %s %s %d %d %s %d", msg.ID, topic, res[0].Partition, res[0].Offset, key, seq)
				break
			}
			if definite(err) {
				p.println("refused %s %s", msg.ID, strings.ReplaceAll(err.Error(), "\n", " "))
				time.Sleep(20 * time.Millisecond)
				break
			}
			p.println("unknown %s", msg.ID)
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func (p *pnode) consume(topic string) {
	owner := fmt.Sprintf("%s.%d", p.cfg.ID, p.cfg.Run)
	l := mq.ListenerFunc(func(_ context.Context, _ string, msg *mq.Message) error {
		// A handler that takes a while: two owners of one partition at
		// once would overlap.
		begin := time.Now().UnixNano()
		time.Sleep(time.Millisecond)
		p.println("recv %s %s %s %d %d %d %d", msg.ID, owner, topic, msg.PartitionIndex, msg.Offset, begin, time.Now().UnixNano())
		return nil
	})
	go func() { // the process's life: it ends by exit
		for {
			if _, err := p.m.NewConsumer(topic, "g", l); err == nil {
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
}

// oneLine is err's text on one line, "<nil>" for none.
func oneLine(err error) string { return strings.ReplaceAll(fmt.Sprint(err), "\n", " ") }

// drain drains node id (DrainNode) and waits until it holds nothing and
// no Raft3 group this node holds a replica of counts it among its voters.
func (p *pnode) drain(id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := p.m.DrainNode(ctx, id); err != nil {
		return err
	}
	for {
		if p.drained(id) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not drained: %w", id, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (p *pnode) drained(id string) bool {
	for _, nd := range p.m.ClusterStatus().Nodes {
		if nd.ID == id && len(nd.Holds) > 0 {
			return false
		}
	}
	for i := range pfParts {
		if _, voters := mq.Raft3Membership(p.m, pfR3, i); slices.Contains(voters, id) || voters != nil && len(voters) != 3 {
			return false
		}
	}
	return true
}

// remove removes node id (RemoveNode), trying again while it is still up.
func (p *pnode) remove(id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for {
		err := p.m.RemoveNode(ctx, id)
		if !errors.Is(err, mq.ErrNodeInUse) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// status says whether the cluster looks whole from here: nodes nodes, all
// up, a metadata leader, every DoubleWrite pair with both replicas in sync
// and no Raft3 replica lost.
func (p *pnode) status(nodes int) {
	cs := p.m.ClusterStatus()
	up := 0
	for _, n := range cs.Nodes {
		if n.Up {
			up++
		}
	}
	why := ""
	switch {
	case cs.Leader == "":
		why = "no metadata leader"
	case up != nodes || len(cs.Nodes) != nodes:
		why = fmt.Sprintf("%d of %d nodes up", up, len(cs.Nodes))
	}
	topics := p.m.Topics()
	for i := 0; why == "" && i < pfParts; i++ {
		if _, replicas, inSync, _ := mq.PairRecord(p.m, pfDW, i); topics[pfDW] > 0 && (len(replicas) != 2 || len(inSync) != 2) {
			why = fmt.Sprintf("%s/%d: in sync %v", pfDW, i, inSync)
		}
		// A rejoined replica is recorded so once it caught up as a
		// nonvoter, and made a voter after: another disk replaced before
		// that may leave the group without a quorum of intact voters.
		if lost, voters := mq.Raft3Membership(p.m, pfR3, i); len(lost) > 0 {
			why = fmt.Sprintf("%s/%d: lost %v", pfR3, i, lost)
		} else if voters != nil && len(voters) != 3 {
			why = fmt.Sprintf("%s/%d: voters %v", pfR3, i, voters)
		}
	}
	if why == "" {
		p.println("status ok")
		return
	}
	p.println("status wait %s", why)
}

func (p *pnode) dump(topic string, parts int) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := range parts {
		for off := int64(0); ; {
			msg, err := p.m.ReadMessage(ctx, topic, i, off)
			if errors.Is(err, mq.ErrNoMessage) {
				break
			}
			if err != nil {
				if ctx.Err() != nil {
					p.println("fail dump %s/%d at %d: %v", topic, i, off, err)
					return
				}
				time.Sleep(100 * time.Millisecond)
				continue
			}
			p.println("msg %s %d %d %s", topic, i, off, msg.ID)
			off++
		}
	}
	p.println("dumped %s", topic)
}
