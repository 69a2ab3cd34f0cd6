package main

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/zeze-go/mq"
)

const (
	topic      = "orders"
	group      = "billing"
	partitions = 4
)

// launcher runs the node processes and keeps what they report.
type launcher struct {
	outMu  sync.Mutex // guards out: the readers write on it too
	out    io.Writer
	start  time.Time
	exe    string // this binary, run again as each node
	root   string // the nodes' data directories
	secret string // hex

	wg sync.WaitGroup // one reader per process

	mu         sync.Mutex    // guards the fields below and every proc's
	changed    chan struct{} // closed and replaced on every change
	procs      []*proc       // in start order
	failure    error         // the first process that exited unasked or failed a command
	acked      map[string]bool
	consumed   map[string]int // message id → deliveries
	sendErrors int
	stopped    int // the producer's count when it stopped; -1 before
}

// proc is one run of a node process.
type proc struct {
	id, label string // label tells a restarted node from its first run
	cmd       *exec.Cmd
	stdin     io.WriteCloser
	done      chan struct{} // closed once it exited and its output is read

	// Guarded by launcher.mu.
	addr       string
	created    bool
	consuming  bool
	assigned   []int
	consumed   int // deliveries
	leading    []string
	askedLead  bool // a "leading" answer came since the last ask
	expectExit bool
	exitErr    error
}

// run is the example: it starts the nodes, kills and restarts n3 while
// messages flow, checks that every acknowledged message was consumed and
// writes what happened to out. Every process it started has exited when it
// returns.
func run(ctx context.Context, out io.Writer, raft3 bool) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	root, err := os.MkdirTemp("", "mq-cluster-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	secret := make([]byte, 32)
	rand.Read(secret)
	if err := makeCerts(filepath.Join(root, "certs"), "n1", "n2", "n3"); err != nil {
		return err
	}
	l := &launcher{
		out: out, start: time.Now(), exe: exe, root: root, secret: hex.EncodeToString(secret),
		changed: make(chan struct{}), acked: map[string]bool{}, consumed: map[string]int{}, stopped: -1,
	}
	defer l.killAll()
	if raft3 {
		return l.scenarioRaft3(ctx)
	}
	return l.scenario(ctx)
}

func (l *launcher) scenario(ctx context.Context) error {
	n1, err := l.startNode(ctx, "n1", "n1")
	if err != nil {
		return err
	}
	l.logf("n1 up at %s: it bootstraps the cluster", l.addr(n1))
	n2, err := l.startNode(ctx, "n2", "n2", l.addr(n1))
	if err != nil {
		return err
	}
	l.logf("n2 up at %s, joined through n1", l.addr(n2))
	if err := l.command(n1, fmt.Sprintf("create %s %d 2", topic, partitions)); err != nil {
		return err
	}
	if err := l.wait(ctx, "the topic created", 20*time.Second, func() bool { return n1.created }); err != nil {
		return err
	}
	l.logf("topic %q created: %d partitions, placed on the two nodes up, n1 and n2", topic, partitions)
	n3, err := l.startNode(ctx, "n3", "n3", l.addr(n1), l.addr(n2))
	if err != nil {
		return err
	}
	l.logf("n3 up at %s: it holds no partition, as it joined after the topic was placed", l.addr(n3))

	for _, p := range []*proc{n2, n3} {
		if err := l.command(p, fmt.Sprintf("consume %s %s", topic, group)); err != nil {
			return err
		}
	}
	if err := l.wait(ctx, "the partitions divided over n2 and n3", 20*time.Second, func() bool {
		return len(n2.assigned) > 0 && len(n3.assigned) > 0 && len(n2.assigned)+len(n3.assigned) == partitions
	}); err != nil {
		return err
	}
	l.logf("group %q consumes: n2 partitions %s, n3 partitions %s", group, l.assigned(n2), l.assigned(n3))

	if err := l.command(n1, "produce "+topic); err != nil {
		return err
	}
	l.logf("n1 produces, one message every %v", sendInterval)
	flowing := time.Now()
	if err := l.wait(ctx, "n3 consuming", 20*time.Second, func() bool {
		return n3.consumed >= 50 && time.Since(flowing) > 1500*time.Millisecond
	}); err != nil {
		return err
	}

	if err := l.kill(n3); err != nil {
		return err
	}
	killedAt := time.Since(l.start)
	l.mu.Lock()
	ackedAtKill := len(l.acked)
	l.logf("n3 killed (SIGKILL) after consuming %d messages; %d acknowledged so far", n3.consumed, ackedAtKill)
	l.mu.Unlock()
	if err := l.wait(ctx, "n2 taking over n3's partitions", 20*time.Second, func() bool {
		return len(n2.assigned) == partitions
	}); err != nil {
		return err
	}
	l.mu.Lock()
	n2AtTakeover := n2.consumed
	l.logf("n3's session expired: n2 consumes every partition, %s", fmtParts(n2.assigned))
	l.mu.Unlock()
	if err := l.wait(ctx, "n2 consuming alone", 20*time.Second, func() bool {
		return n2.consumed >= n2AtTakeover+100
	}); err != nil {
		return err
	}

	n3b, err := l.startNode(ctx, "n3", "n3 (restarted)", l.addr(n1), l.addr(n2))
	if err != nil {
		return err
	}
	restartedAt := time.Since(l.start)
	l.mu.Lock()
	sentWhileDown := len(l.acked) - ackedAtKill
	l.mu.Unlock()
	l.logf("n3 restarted on its data directory at %s (same node id, new port); %d acknowledged while it was down",
		l.addr(n3b), sentWhileDown)
	if err := l.command(n3b, fmt.Sprintf("consume %s %s", topic, group)); err != nil {
		return err
	}
	if err := l.wait(ctx, "the restarted n3 consuming", 20*time.Second, func() bool {
		return len(n3b.assigned) > 0 && len(n2.assigned)+len(n3b.assigned) == partitions && n3b.consumed >= 50
	}); err != nil {
		return err
	}
	l.logf("n3 consumes again: n2 partitions %s, n3 partitions %s", l.assigned(n2), l.assigned(n3b))

	return l.finish(ctx, n1, fmt.Sprintf("n3:         killed at %.1fs, restarted at %.1fs (%d messages acknowledged meanwhile)\n",
		killedAt.Seconds(), restartedAt.Seconds(), sentWhileDown))
}

// finish stops the producer on prod, waits until every acknowledged message
// was consumed, closes the nodes and prints the summary, with note, the
// kill's line, before the count of lost messages.
func (l *launcher) finish(ctx context.Context, prod *proc, note string) error {
	if err := l.command(prod, "stop"); err != nil {
		return err
	}
	if err := l.wait(ctx, "the producer stopping", 20*time.Second, func() bool { return l.stopped >= 0 }); err != nil {
		return err
	}
	l.mu.Lock()
	l.logf("producer stopped: %d messages acknowledged (%d send errors)", l.stopped, l.sendErrors)
	l.mu.Unlock()
	drained := l.wait(ctx, "every acknowledged message consumed", 20*time.Second, func() bool {
		for id := range l.acked {
			if l.consumed[id] == 0 {
				return false
			}
		}
		return true
	})
	if drained == nil {
		l.logf("every acknowledged message consumed")
	}
	closeErr := l.closeAll(ctx, prod)

	l.mu.Lock()
	defer l.mu.Unlock()
	var lost []string
	deliveries, unacked := 0, 0
	for id := range l.acked {
		if l.consumed[id] == 0 {
			lost = append(lost, id)
		}
	}
	for id, n := range l.consumed {
		deliveries += n
		if !l.acked[id] {
			unacked++
		}
	}
	slices.Sort(lost)
	l.printf("\nsent:       %d acknowledged, %d send errors\n", len(l.acked), l.sendErrors)
	dups := ""
	if deliveries > len(l.consumed) {
		dups = " (delivery is at least once: consumed before the kill, not yet committed, delivered again)"
	}
	l.printf("consumed:   %d distinct messages in %d deliveries, %d duplicates%s\n",
		len(l.consumed), deliveries, deliveries-len(l.consumed), dups)
	if unacked > 0 {
		l.printf("            %d of them consumed but never acknowledged to the producer\n", unacked)
	}
	var per []string
	for _, p := range l.procs {
		if p.consuming {
			per = append(per, fmt.Sprintf("%s %d", p.label, p.consumed))
		}
	}
	l.printf("per node:   %s\n", strings.Join(per, ", "))
	l.printf("%s", note)
	l.printf("lost:       %d\n", len(lost))
	switch {
	case len(lost) > 0:
		if len(lost) > 10 {
			lost = append(lost[:10], "...")
		}
		return fmt.Errorf("%d acknowledged messages never consumed: %s", len(lost), strings.Join(lost, " "))
	case drained != nil:
		return drained
	}
	return closeErr
}

// scenarioRaft3 is the example with a Raft3 topic whose four partitions
// share one raft group, with a replica on each of the three nodes. The node
// leading fewest partitions produces and consumes; the busiest leader of the
// other two is killed with SIGKILL: the two left elect new leaders and go
// on, nothing acknowledged is lost, and the killed node, restarted on its
// data, rejoins its groups.
func (l *launcher) scenarioRaft3(ctx context.Context) error {
	n1, err := l.startNode(ctx, "n1", "n1")
	if err != nil {
		return err
	}
	l.logf("n1 up at %s: it bootstraps the cluster", l.addr(n1))
	n2, err := l.startNode(ctx, "n2", "n2", l.addr(n1))
	if err != nil {
		return err
	}
	n3, err := l.startNode(ctx, "n3", "n3", l.addr(n1), l.addr(n2))
	if err != nil {
		return err
	}
	l.logf("n2 and n3 up at %s and %s", l.addr(n2), l.addr(n3))
	if err := l.command(n1, fmt.Sprintf("create %s %d 3 raft3", topic, partitions)); err != nil {
		return err
	}
	if err := l.wait(ctx, "the topic created", 20*time.Second, func() bool { return n1.created }); err != nil {
		return err
	}
	l.logf("Raft3 topic %q created: %d partitions in one raft group with a replica on every node", topic, partitions)
	// The node leading fewest partitions produces and consumes; the busiest
	// leader of the other two is the one killed.
	nodes := []*proc{n1, n2, n3}
	var counts []int
	for deadline := time.Now().Add(20 * time.Second); ; {
		if counts, err = l.leaderships(ctx, nodes...); err != nil {
			return err
		}
		if counts[0]+counts[1]+counts[2] == partitions {
			break // a leader in every group
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no leader in every group within 20s: %v", counts)
		}
		time.Sleep(50 * time.Millisecond)
	}
	worker := n1
	var others []*proc
	for i, p := range nodes {
		if counts[i] < counts[slices.Index(nodes, worker)] {
			worker = p
		}
	}
	for _, p := range nodes {
		if p != worker {
			others = append(others, p)
		}
	}
	if err := l.command(worker, fmt.Sprintf("consume %s %s", topic, group)); err != nil {
		return err
	}
	if err := l.command(worker, "produce "+topic); err != nil {
		return err
	}
	l.logf("%s produces, one message every %v, and consumes as group %q", worker.label, sendInterval, group)
	flowing := time.Now()
	if err := l.wait(ctx, worker.label+" consuming", 20*time.Second, func() bool {
		return worker.consumed >= 100 && time.Since(flowing) > 1500*time.Millisecond
	}); err != nil {
		return err
	}
	if counts, err = l.leaderships(ctx, others...); err != nil {
		return err
	}
	victim := others[0]
	if counts[1] > counts[0] {
		victim = others[1]
	}
	l.mu.Lock()
	led := strings.Join(victim.leading, " ")
	l.mu.Unlock()
	if err := l.kill(victim); err != nil {
		return err
	}
	killedAt := time.Since(l.start)
	l.mu.Lock()
	ackedAtKill, consumedAtKill := len(l.acked), worker.consumed
	l.logf("%s killed (SIGKILL); it led %s; %d acknowledged so far", victim.label, cmp.Or(led, "no partition"), ackedAtKill)
	l.mu.Unlock()
	if err := l.wait(ctx, "messages flowing through the new leaders", 20*time.Second, func() bool {
		return worker.consumed >= consumedAtKill+200
	}); err != nil {
		return err
	}
	l.mu.Lock()
	l.logf("the two nodes left elected new leaders: %d more consumed", worker.consumed-consumedAtKill)
	l.mu.Unlock()
	back, err := l.startNode(ctx, victim.id, victim.id+" (restarted)", l.addr(worker))
	if err != nil {
		return err
	}
	restartedAt := time.Since(l.start)
	l.mu.Lock()
	sentWhileDown := len(l.acked) - ackedAtKill
	l.mu.Unlock()
	l.logf("%s restarted on its data directory at %s; %d acknowledged while it was down", victim.id, l.addr(back), sentWhileDown)
	l.mu.Lock()
	consumedAtRestart := worker.consumed
	l.mu.Unlock()
	if err := l.wait(ctx, "messages flowing with all three", 20*time.Second, func() bool {
		return worker.consumed >= consumedAtRestart+200
	}); err != nil {
		return err
	}
	return l.finish(ctx, worker, fmt.Sprintf("%s:         killed at %.1fs while leading %s, restarted at %.1fs (%d messages acknowledged meanwhile)\n",
		victim.id, killedAt.Seconds(), cmp.Or(led, "no partition"), restartedAt.Seconds(), sentWhileDown))
}

// leaderships asks each of procs which Raft3 partitions it leads, and
// returns how many each leads, in procs' order.
func (l *launcher) leaderships(ctx context.Context, procs ...*proc) ([]int, error) {
	counts := make([]int, len(procs))
	for i, p := range procs {
		l.mu.Lock()
		p.askedLead = false
		l.mu.Unlock()
		if err := l.command(p, "leading"); err != nil {
			return nil, err
		}
		if err := l.wait(ctx, p.label+"'s leaderships", 10*time.Second, func() bool { return p.askedLead }); err != nil {
			return nil, err
		}
		l.mu.Lock()
		counts[i] = len(p.leading)
		l.mu.Unlock()
	}
	return counts, nil
}

// startNode starts a node process with data directory root/id, joining
// through seeds, or bootstrapping a cluster without any, and waits for its
// address.
func (l *launcher) startNode(ctx context.Context, id, label string, seeds ...string) (*proc, error) {
	cmd := exec.CommandContext(ctx, l.exe)
	cmd.Env = append(os.Environ(),
		roleEnv+"=node",
		nodeIDEnv+"="+id,
		nodeDirEnv+"="+filepath.Join(l.root, id),
		nodeSeedsEnv+"="+strings.Join(seeds, ","),
		nodeSecretEnv+"="+l.secret,
		nodeCertsEnv+"="+filepath.Join(l.root, "certs"),
	)
	cmd.Stderr = os.Stderr
	cmd.WaitDelay = 5 * time.Second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", label, err)
	}
	p := &proc{id: id, label: label, cmd: cmd, stdin: stdin, done: make(chan struct{})}
	l.mu.Lock()
	l.procs = append(l.procs, p)
	l.mu.Unlock()
	l.wg.Go(func() {
		l.read(p, stdout)
	})
	if err := l.wait(ctx, label+" listening", 20*time.Second, func() bool { return p.addr != "" }); err != nil {
		return nil, err
	}
	return p, nil
}

// read takes p's events until its stdout ends, then waits for it to exit.
func (l *launcher) read(p *proc, stdout io.Reader) {
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		l.event(p, strings.Fields(sc.Text()), sc.Text())
	}
	err := p.cmd.Wait()
	l.mu.Lock()
	p.exitErr = err
	if !p.expectExit && l.failure == nil {
		l.failure = fmt.Errorf("%s exited unexpectedly (%v)", p.label, err)
	}
	l.notify()
	l.mu.Unlock()
	close(p.done)
}

// event records one line of p's output.
func (l *launcher) event(p *proc, f []string, line string) {
	if len(f) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	defer l.notify()
	switch kind := f[0]; {
	case kind == "addr" && len(f) == 2:
		p.addr = f[1]
	case kind == "created":
		p.created = true
	case kind == "consuming":
		p.consuming = true
	case kind == "assigned" && len(f) == 2:
		p.assigned = nil
		for _, s := range strings.Split(f[1], ",") {
			if i, err := strconv.Atoi(s); err == nil {
				p.assigned = append(p.assigned, i)
			}
		}
	case kind == "sent" && len(f) == 2:
		l.acked[f[1]] = true
	case kind == "send-error":
		l.sendErrors++
		l.logf("%s: %s", p.label, line)
	case kind == "consumed" && len(f) >= 2:
		l.consumed[f[1]]++
		p.consumed++
	case kind == "leading" && len(f) == 2:
		p.leading, p.askedLead = nil, true
		if f[1] != "-" {
			p.leading = strings.Split(f[1], ",")
		}
	case kind == "stopped" && len(f) == 2:
		l.stopped, _ = strconv.Atoi(f[1])
	case kind == "error":
		if l.failure == nil {
			l.failure = fmt.Errorf("%s: %s", p.label, line)
		}
	default:
		l.logf("%s: unexpected output %q", p.label, line)
	}
}

// notify wakes the waiters; l.mu is held.
func (l *launcher) notify() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// wait returns once cond, called with l.mu held, is true; or an error
// after timeout, when ctx ends or when a process failed.
func (l *launcher) wait(ctx context.Context, what string, timeout time.Duration, cond func() bool) error {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		l.mu.Lock()
		ok, failure, changed := cond(), l.failure, l.changed
		l.mu.Unlock()
		switch {
		case ok:
			return nil
		case failure != nil:
			return fmt.Errorf("waiting for %s: %w", what, failure)
		}
		select {
		case <-changed:
		case <-timer.C:
			return fmt.Errorf("%s: not within %v", what, timeout)
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		}
	}
}

// command sends one command line to p.
func (l *launcher) command(p *proc, cmd string) error {
	if _, err := io.WriteString(p.stdin, cmd+"\n"); err != nil {
		return fmt.Errorf("%s: %q: %w", p.label, cmd, err)
	}
	return nil
}

// kill sends p SIGKILL and waits until it is gone.
func (l *launcher) kill(p *proc) error {
	l.mu.Lock()
	p.expectExit = true
	l.mu.Unlock()
	if err := p.cmd.Process.Kill(); err != nil {
		return fmt.Errorf("kill %s: %w", p.label, err)
	}
	<-p.done
	return nil
}

// closeAll closes every running process's stdin, which closes its node,
// first's first and the others once it exited, since its consumer's last
// offset commit needs a quorum of a Raft3 group's nodes, and waits for them
// to exit; it returns an error if one did not exit cleanly.
func (l *launcher) closeAll(ctx context.Context, first *proc) error {
	l.mu.Lock()
	var running []*proc
	for _, p := range l.procs {
		if !p.expectExit {
			p.expectExit = true
			running = append(running, p)
		}
	}
	l.mu.Unlock()
	if i := slices.Index(running, first); i > 0 {
		running[0], running[i] = running[i], running[0]
	}
	timeout := time.After(15 * time.Second)
	var errs []error
	for i, p := range running {
		switch i {
		case 0: // first, alone
			p.stdin.Close()
		case 1: // then the others
			for _, q := range running[1:] {
				q.stdin.Close()
			}
		}
		select {
		case <-p.done:
		case <-timeout:
			return fmt.Errorf("%s did not exit within 15s of its stdin closing", p.label)
		case <-ctx.Done():
			return ctx.Err()
		}
		l.mu.Lock()
		if p.exitErr != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p.label, p.exitErr))
		}
		l.mu.Unlock()
	}
	return errors.Join(errs...)
}

// killAll kills every process still running and waits for the readers; it
// is run on every return from run.
func (l *launcher) killAll() {
	l.mu.Lock()
	procs := slices.Clone(l.procs)
	for _, p := range procs {
		p.expectExit = true
	}
	l.mu.Unlock()
	for _, p := range procs {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
		}
	}
	l.wg.Wait()
}

// logf writes a line of the timeline, with the time since the start.
func (l *launcher) logf(format string, args ...any) {
	l.printf("%5.1fs  %s\n", time.Since(l.start).Seconds(), fmt.Sprintf(format, args...))
}

// printf writes to the launcher's output.
func (l *launcher) printf(format string, args ...any) {
	l.outMu.Lock()
	defer l.outMu.Unlock()
	fmt.Fprintf(l.out, format, args...)
}

func (l *launcher) addr(p *proc) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return p.addr
}

func (l *launcher) assigned(p *proc) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmtParts(p.assigned)
}

func fmtParts(ps []int) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = strconv.Itoa(p)
	}
	return "[" + strings.Join(s, " ") + "]"
}

// makeCerts makes the cluster's CA in dir and a certificate for each node
// id, as cmd/mqcert would: ca.pem, and <id>.pem with <id>-key.pem. The
// CA's key is not kept: no more nodes are added.
func makeCerts(dir string, ids ...string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ca, err := mq.NewClusterCA("example cluster CA", time.Hour)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), ca.CertPEM(), 0o644); err != nil {
		return err
	}
	for _, id := range ids {
		cert, key, err := ca.IssueNode(id, time.Hour)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, id+".pem"), cert, 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, id+"-key.pem"), key, 0o600); err != nil {
			return err
		}
	}
	return nil
}
