package mq_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zeze-go/mq"
)

const (
	walCrashDirEnv = "ZEZE_MQ_WAL_CRASH_DIR"
)

// TestMQ_CrashWALReplay kills a sending child whose partitions never
// materialize the write-ahead log, so that every acked message exists only
// there, and checks that reopening replays each acked message at its acked
// partition and offset, with the acked dedup answers: a resend of an acked ID
// is a duplicate at the first copy's offset, in the child and after replay.
func TestMQ_CrashWALReplay(t *testing.T) {
	if dir := os.Getenv(walCrashDirEnv); dir != "" {
		walCrashChild(dir)
	}
	if testing.Short() {
		t.Skip("spawns a child process")
	}
	dir := t.TempDir()
	for cycle := 1; cycle <= 3; cycle++ {
		acks := runWALCrashChild(t, dir, cycle)
		verifyWALCrash(t, dir, cycle, acks)
	}
}

type walAck struct {
	id        string
	part      int
	off       int64
	duplicate bool
}

func runWALCrashChild(t *testing.T, dir string, cycle int) []walAck {
	t.Helper()
	cmd, stdout, stderr := startChild(t, "TestMQ_CrashWALReplay", walCrashDirEnv+"="+dir, "ZEZE_MQ_WAL_CYCLE="+strconv.Itoa(cycle))
	lines := make(chan string, 1024)
	go func() {
		br := bufio.NewReader(stdout)
		for {
			l, err := br.ReadString('\n')
			if err != nil {
				close(lines)
				return
			}
			lines <- l
		}
	}()
	var acks []walAck
	deadline := time.After(30 * time.Second)
	for len(acks) < 2000 {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("cycle %d: child ended after %d acks; stderr:\n%s", cycle, len(acks), stderr.String())
			}
			var a walAck
			var dup int
			if _, err := fmt.Sscanf(l, "ack %s %d %d %d", &a.id, &a.part, &a.off, &dup); err != nil {
				t.Fatalf("cycle %d: bad line %q", cycle, l)
			}
			a.duplicate = dup == 1
			acks = append(acks, a)
		case <-deadline:
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("cycle %d: %d acks in 30s; stderr:\n%s", cycle, len(acks), stderr.String())
		}
	}
	cmd.Process.Kill()
	for l := range lines { // acks printed before the kill landed
		var a walAck
		var dup int
		if _, err := fmt.Sscanf(l, "ack %s %d %d %d", &a.id, &a.part, &a.off, &dup); err == nil {
			a.duplicate = dup == 1
			acks = append(acks, a)
		}
	}
	cmd.Wait()
	if strings.Contains(stderr.String(), "WARNING: DATA RACE") {
		t.Fatalf("cycle %d: data race in the child:\n%s", cycle, stderr.String())
	}
	return acks
}

// walCrashChild sends new messages with explicit IDs and, every third send,
// resends one of its acked IDs; it prints each ack.
func walCrashChild(dir string) {
	fail := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "wal crash child: "+format+"\n", args...)
		os.Exit(3)
	}
	// Partitions keep what they log out of their files: every ack the
	// child prints is then only in the write-ahead log.
	m, err := mq.Open(dir, mq.WithMaterializeAfter(time.Hour))
	if err != nil {
		fail("open: %v", err)
	}
	ctx := context.Background()
	if err := m.CreateMQ(ctx, crashTopic, crashParts, mq.Options{Type: mq.Single}); err != nil && !errors.Is(err, mq.ErrTopicExists) {
		fail("create: %v", err)
	}
	p, err := m.NewProducer(crashTopic)
	if err != nil {
		fail("producer: %v", err)
	}
	cycle := os.Getenv("ZEZE_MQ_WAL_CYCLE")
	var out sync.Mutex
	for g := 0; g < crashSenders; g++ {
		go func() {
			var sent []string
			for seq := 0; ; seq++ {
				id := fmt.Sprintf("c%s-g%d-%d", cycle, g, seq)
				if seq%3 == 2 {
					id = sent[seq%len(sent)]
				} else {
					sent = append(sent, id)
				}
				msg := &mq.Message{ID: id, Key: "k" + strconv.Itoa(g), Body: []byte(id)}
				res, err := p.SendMessage(ctx, msg)
				if err != nil {
					fail("send %s: %v", id, err)
				}
				dup := 0
				if res[0].Duplicate {
					dup = 1
				}
				out.Lock()
				fmt.Fprintf(os.Stdout, "ack %s %d %d %d\n", id, res[0].Partition, res[0].Offset, dup)
				out.Unlock()
			}
		}()
	}
	time.Sleep(2 * time.Minute)
	fail("not killed within 2 minutes")
}

func verifyWALCrash(t *testing.T, dir string, cycle int, acks []walAck) {
	t.Helper()
	ctx := context.Background()
	m, err := mq.Open(dir)
	if err != nil {
		t.Fatalf("cycle %d: reopen: %v", cycle, err)
	}
	defer m.Close()
	first := map[string]walAck{}
	dups := 0
	for _, a := range acks {
		if f, ok := first[a.id]; ok {
			if !a.duplicate || a.part != f.part || a.off != f.off {
				t.Fatalf("cycle %d: resend of %s acked %+v, first %+v", cycle, a.id, a, f)
			}
			dups++
			continue
		}
		if a.duplicate {
			t.Fatalf("cycle %d: first send of %s acked as a duplicate: %+v", cycle, a.id, a)
		}
		first[a.id] = a
	}
	if dups == 0 {
		t.Fatalf("cycle %d: no resend acked", cycle)
	}
	for id, a := range first {
		msg, err := m.ReadMessage(ctx, crashTopic, a.part, a.off)
		if err != nil {
			t.Fatalf("cycle %d: acked %+v: %v", cycle, a, err)
		}
		if msg.ID != id || string(msg.Body) != id {
			t.Fatalf("cycle %d: acked %+v, stored ID %s body %q", cycle, a, msg.ID, msg.Body)
		}
	}
	// The dedup index was replayed too: resending an acked ID stores nothing.
	p, err := m.NewProducer(crashTopic)
	if err != nil {
		t.Fatal(err)
	}
	for id, a := range first {
		g := strings.SplitN(id, "-", 3)[1][1:]
		res, err := p.SendMessage(ctx, &mq.Message{ID: id, Key: "k" + g, Body: []byte(id)})
		if err != nil {
			t.Fatal(err)
		}
		if !res[0].Duplicate || res[0].Partition != a.part || res[0].Offset != a.off {
			t.Fatalf("cycle %d: resend of %s after replay: %+v, acked %+v", cycle, id, res[0], a)
		}
	}
	t.Logf("cycle %d: %d acks (%d resends) replayed from the WAL", cycle, len(acks), dups)
}
