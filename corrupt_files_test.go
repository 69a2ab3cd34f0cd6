package mq_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zeze-go/mq"
	"github.com/zeze-go/mq/store"
)

// The corruption trials (anchor R8): a pristine node directory is copied,
// one file of it damaged (bit flips, or a truncation), and a child process
// opens the copy and reads back every acknowledged message. Every trial must
// end in a clean open with all acked data, or in an error wrapping
// ErrCorrupt that names the damaged file: never a panic, a hang, a wrong or
// missing message, or a forgotten topic.

const (
	trialListEnv   = "ZEZE_MQ_TRIAL_LIST"   // the child's file of trials to run
	trialWALDirEnv = "ZEZE_MQ_TRIAL_WALDIR" // the WAL pristine's producing child
	trialSeedEnv   = "ZEZE_MQ_TRIAL_SEED"   // replays a run
)

// trialTopics are the pristine node's topics and partition counts: several,
// so that a topic forgotten by a damaged meta.db shows.
var trialTopics = []struct {
	name  string
	parts int
}{{"alpha", 2}, {"beta", 1}, {"gamma", 3}}

// trialPerPartition is how many messages each partition gets.
const trialPerPartition = 24

// trialBody is the body of message i of topic/part; lengths vary so that
// records straddle pages and frames differently.
func trialBody(topic string, part, i int) string {
	return fmt.Sprintf("%s/%d/%03d-%s", topic, part, i, strings.Repeat("x", (i*37)%300))
}

// trialAck is an acknowledged message: where it was stored and its body.
type trialAck struct {
	Topic  string `json:"topic"`
	Part   int    `json:"part"`
	Offset int64  `json:"offset"`
	Body   string `json:"body"`
}

// trialSpec is one trial as the child receives it.
type trialSpec struct {
	N    int        `json:"n"`    // trial number within its kind
	Dir  string     `json:"dir"`  // the damaged copy
	File string     `json:"file"` // the damaged file
	Acks []trialAck `json:"acks"`
}

// Outcomes a child reports; the parent adds panic, hang and crash.
const (
	outClean    = "clean"    // opened, every acked message read back
	outCorrupt  = "corrupt"  // an error wrapping ErrCorrupt naming the file
	outMisnamed = "misnamed" // ErrCorrupt, but not naming the damaged file
	// outFormat is store.ErrFormat naming the file: a flip in the low bits
	// of a partition file's format version reads as a newer release's
	// format, which nothing can tell from damage. Not silent; counted.
	outFormat    = "format"
	outOther     = "other"     // any other error
	outWrong     = "wrong"     // a message other than the acked one
	outMissing   = "missing"   // an acked message gone without an error
	outForgotten = "forgotten" // a topic or partition gone without an error
	outPanic     = "panic"
	outHang      = "hang"
	outCrash     = "crash" // the child died otherwise
)

// TestMQ_DamagedFiles runs the trials for each kind of file: meta.db,
// a partition file, and a WAL segment holding acked records that are in no
// partition file. It prints a table per kind. Each kind has 20 trials by
// default and 100 with ZEZE_FULL=1.
func TestMQ_DamagedFiles(t *testing.T) {
	if list := os.Getenv(trialListEnv); list != "" {
		trialChild(list)
	}
	if dir := os.Getenv(trialWALDirEnv); dir != "" {
		trialWALChild(dir)
	}
	trials := sized(20, 100) // per kind of file
	if testing.Short() {
		trials = 15
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(trialSeedEnv); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("%s: %v", trialSeedEnv, err)
		}
	}
	t.Logf("seed %d (replay with %s=%d)", seed, trialSeedEnv, seed)

	root := t.TempDir()
	closed := filepath.Join(root, "closed")
	closedAcks := buildClosedPristine(t, closed)
	logged := filepath.Join(root, "logged")
	loggedAcks := buildWALPristine(t, logged)

	seg := trialSegment(t, logged)
	kinds := []struct {
		name string
		dir  string
		acks []trialAck
		pick func(rng *rand.Rand) string // the file to damage, relative
		bolt bool
	}{
		{"meta.db", closed, closedAcks, func(*rand.Rand) string { return "meta.db" }, true},
		{"partition", closed, closedAcks, func(rng *rand.Rand) string {
			tp := trialTopics[rng.IntN(len(trialTopics))]
			return filepath.Join("topics", tp.name, strconv.Itoa(rng.IntN(tp.parts))+".db")
		}, true},
		{"wal", logged, loggedAcks, func(*rand.Rand) string { return seg }, false},
	}
	var failures []string
	for ki, k := range kinds {
		rng := rand.New(rand.NewPCG(seed, uint64(ki)))
		work := filepath.Join(root, "trials-"+strconv.Itoa(ki))
		var specs []trialSpec
		damages := map[int]string{}
		for n := 0; n < trials; n++ {
			dir := filepath.Join(work, strconv.Itoa(n))
			copyTree(t, k.dir, dir)
			rel := k.pick(rng)
			path := filepath.Join(dir, rel)
			var d string
			if n == 0 {
				d = "none" // the control: the pristine copy must open clean
			} else {
				d = damageFile(t, rng, path, k.bolt)
			}
			damages[n] = d
			specs = append(specs, trialSpec{N: n, Dir: dir, File: path, Acks: k.acks})
		}
		outs := runTrials(t, specs)
		os.RemoveAll(work)

		// The table: outcome counts per damage type.
		type row struct{ trials, clean, corrupt, format, bad int }
		byType := map[string]*row{}
		var all row
		for n := 0; n < trials; n++ {
			o := outs[n]
			typ, _, _ := strings.Cut(damages[n], " ")
			r := byType[typ]
			if r == nil {
				r = &row{}
				byType[typ] = r
			}
			for _, r := range []*row{r, &all} {
				r.trials++
				switch o.class {
				case outClean:
					r.clean++
				case outCorrupt:
					r.corrupt++
				case outFormat:
					r.format++
				default:
					r.bad++
				}
			}
			if o.class != outClean && o.class != outCorrupt && o.class != outFormat || n == 0 && o.class != outClean {
				failures = append(failures, fmt.Sprintf("%s trial %d (%s): %s: %s", k.name, n, damages[n], o.class, o.detail))
			}
		}
		var b strings.Builder
		fmt.Fprintf(&b, "%s: %d trials, %d clean, %d corrupt, %d ErrFormat, %d wrong outcomes\n", k.name, all.trials, all.clean, all.corrupt, all.format, all.bad)
		fmt.Fprintf(&b, "  %-9s %6s %6s %7s %6s %5s\n", "damage", "trials", "clean", "corrupt", "format", "bad")
		types := make([]string, 0, len(byType))
		for typ := range byType {
			types = append(types, typ)
		}
		sort.Strings(types)
		for _, typ := range types {
			r := byType[typ]
			fmt.Fprintf(&b, "  %-9s %6d %6d %7d %6d %5d\n", typ, r.trials, r.clean, r.corrupt, r.format, r.bad)
		}
		t.Log(b.String())
	}
	for _, f := range failures {
		t.Error(f)
	}
}

// buildClosedPristine makes a node whose messages are all in its partition
// files: sent, then closed.
func buildClosedPristine(t *testing.T, dir string) []trialAck {
	t.Helper()
	m, err := mq.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	acks, err := fillTrialNode(context.Background(), m, nil)
	if cerr := m.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	return acks
}

// fillTrialNode creates the trial topics and sends their messages, calling
// ack with each acknowledgement.
func fillTrialNode(ctx context.Context, m *mq.MQ, ack func(trialAck)) ([]trialAck, error) {
	var acks []trialAck
	for _, tp := range trialTopics {
		if err := m.CreateMQ(ctx, tp.name, tp.parts, mq.Options{Type: mq.Single}); err != nil {
			return nil, err
		}
	}
	for _, tp := range trialTopics {
		p, err := m.NewProducer(tp.name)
		if err != nil {
			return nil, err
		}
		for i := 0; i < trialPerPartition; i++ {
			for part := 0; part < tp.parts; part++ {
				body := trialBody(tp.name, part, i)
				res, err := p.SendMessage(ctx, (&mq.Message{Key: "k", Body: []byte(body)}).ToPartition(part))
				if err != nil {
					return nil, err
				}
				a := trialAck{tp.name, res[0].Partition, res[0].Offset, body}
				if a.Part != part || a.Offset != int64(i) {
					return nil, fmt.Errorf("%s acked at %d/%d", body, a.Part, a.Offset)
				}
				acks = append(acks, a)
				if ack != nil {
					ack(a)
				}
			}
		}
		p.Close()
	}
	return acks, nil
}

// buildWALPristine makes a node whose acked messages are only in its WAL:
// a child sends them with materializing held back and is killed with
// SIGKILL after its last ack.
func buildWALPristine(t *testing.T, dir string) []trialAck {
	t.Helper()
	cmd, stdout, stderr := startChild(t, "TestMQ_DamagedFiles", trialWALDirEnv+"="+dir)
	defer cmd.Wait()
	defer cmd.Process.Kill()
	var acks []trialAck
	sc := bufio.NewScanner(stdout)
	sc.Buffer(nil, 1<<20)
	timer := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() })
	defer timer.Stop()
	for sc.Scan() {
		l := sc.Text()
		if l == "done" {
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			return acks
		}
		var a trialAck
		if js, ok := strings.CutPrefix(l, "ack "); ok && json.Unmarshal([]byte(js), &a) == nil {
			acks = append(acks, a)
		}
	}
	t.Fatalf("WAL pristine child ended after %d acks; stderr:\n%s", len(acks), stderr.String())
	return nil
}

// trialWALChild sends the trial messages with materializing held back,
// prints each ack and then done, and waits to be killed.
func trialWALChild(dir string) {
	m, err := mq.Open(dir, mq.WithMaterializeAfter(time.Hour))
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		os.Exit(3)
	}
	_, err = fillTrialNode(context.Background(), m, func(a trialAck) {
		js, _ := json.Marshal(a)
		fmt.Printf("ack %s\n", js)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "send:", err)
		os.Exit(3)
	}
	fmt.Println("done")
	time.Sleep(time.Minute)
	os.Exit(4)
}

// trialSegment returns the WAL segment of dir holding records: the newest
// one with anything but zeros after its header.
func trialSegment(t *testing.T, dir string) string {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(dir, "wal", "*.wal"))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(segs)
	for i := len(segs) - 1; i >= 0; i-- {
		b, err := os.ReadFile(segs[i])
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > 16 && bytes.ContainsFunc(b[16:], func(r rune) bool { return r != 0 }) {
			rel, _ := filepath.Rel(dir, segs[i])
			return rel
		}
	}
	t.Fatalf("no WAL segment with records in %s", dir)
	return ""
}

// damageFile flips bits in the file at path, or truncates it, and says
// what it did ("flip ..." or "truncate ..."). Offsets are biased to where
// damage matters: bbolt's meta pages and data pages; a WAL segment's header
// and frames rather than the zeros allocated after them.
func damageFile(t *testing.T, rng *rand.Rand, path string, isBolt bool) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	size := len(b)
	used := size // bytes worth damaging: a WAL segment's records
	var frames []int
	if !isBolt {
		used, frames = walFrames(b)
	}
	var d string
	if rng.IntN(2) == 0 {
		n := 1 + rng.IntN(8)
		var offs []string
		for range n {
			var off int
			switch r := rng.IntN(10); {
			case isBolt && r < 4:
				off = rng.IntN(min(8192, size)) // the meta pages
			case isBolt:
				off = rng.IntN(size)
			case r == 0:
				off = rng.IntN(16) // the segment header: magic, salt
			case r == 1 && len(frames) > 0:
				off = frames[rng.IntN(len(frames))] + rng.IntN(8) // a frame header
			case r == 2:
				off = used + rng.IntN(min(64<<10, size-used)) // the zeros after
			default:
				off = rng.IntN(used)
			}
			bit := rng.IntN(8)
			b[off] ^= 1 << bit
			offs = append(offs, fmt.Sprintf("%d.%d", off, bit))
		}
		d = "flip " + strings.Join(offs, ",")
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range offs {
			at, _ := strconv.Atoi(strings.Split(o, ".")[0])
			if _, err := f.WriteAt(b[at:at+1], int64(at)); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	} else {
		var l int
		switch r := rng.IntN(10); {
		case !isBolt && r < 3 && len(frames) > 0:
			l = frames[rng.IntN(len(frames))] // at a frame boundary
		case !isBolt && r < 9:
			l = rng.IntN(used + 1)
		case isBolt && r < 8:
			l = rng.IntN(size) // anywhere, at any length
		default:
			l = size - 1 - rng.IntN(min(size, 8192)) // near the end
		}
		if err := os.Truncate(path, int64(l)); err != nil {
			t.Fatal(err)
		}
		d = fmt.Sprintf("truncate %d/%d", l, size)
	}
	return d
}

// walFrames returns where a segment's frames end and where each starts.
func walFrames(b []byte) (end int, starts []int) {
	off := 16
	for off+8 <= len(b) {
		l := int(binary.BigEndian.Uint32(b[off:]))
		if l == 0 || off+8+l > len(b) {
			break
		}
		starts = append(starts, off)
		off += 8 + l
	}
	return off, starts
}

type trialOutcome struct{ class, detail string }

// trialChildren is how many children run trials side by side: opening a
// node waits for fsyncs more than it computes.
const trialChildren = 4

// runTrials runs specs in trialChildren sequences of child processes.
func runTrials(t *testing.T, specs []trialSpec) map[int]trialOutcome {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	outs := map[int]trialOutcome{}
	for i := range trialChildren {
		var part []trialSpec
		for j := i; j < len(specs); j += trialChildren {
			part = append(part, specs[j])
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := runTrialChildren(t, part)
			mu.Lock()
			defer mu.Unlock()
			maps.Copy(outs, o)
		}()
	}
	wg.Wait()
	return outs
}

// runTrialChildren runs specs in child processes, as many per child as run
// without a panic, crash or hang; one of those ends its child and is
// attributed to the trial the child last began, and the next child goes on
// after it. It may run in a goroutine of its own: it reports with t.Errorf.
func runTrialChildren(t *testing.T, specs []trialSpec) map[int]trialOutcome {
	outs := map[int]trialOutcome{}
	for len(specs) > 0 {
		list := filepath.Join(t.TempDir(), "trials.json")
		js, err := json.Marshal(specs)
		if err == nil {
			err = os.WriteFile(list, js, 0o600)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestMQ_DamagedFiles$", "-test.count=1")
		cmd.Env = append(os.Environ(), trialListEnv+"="+list)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		var stdout io.Reader
		if err == nil {
			stdout, err = cmd.StdoutPipe()
		}
		if err == nil {
			err = cmd.Start()
		}
		if err != nil {
			t.Errorf("trial child: %v", err)
			return outs
		}
		lines := make(chan string)
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(stdout)
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		begun := -1
		hung := false
		const perTrial = 30 * time.Second // a hang, not a slow open under -race
		timer := time.NewTimer(perTrial)
	read:
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					break read
				}
				f := strings.SplitN(l, " ", 4)
				switch {
				case len(f) >= 2 && f[0] == "begin":
					begun, _ = strconv.Atoi(f[1])
					timer.Reset(perTrial)
				case len(f) >= 3 && f[0] == "trial":
					n, _ := strconv.Atoi(f[1])
					o := trialOutcome{class: f[2]}
					if len(f) == 4 {
						o.detail = f[3]
					}
					outs[n] = o
				}
			case <-timer.C:
				hung = true
				cmd.Process.Kill()
				for range lines {
				}
				break read
			}
		}
		timer.Stop()
		werr := cmd.Wait()
		if strings.Contains(stderr.String(), "WARNING: DATA RACE") {
			t.Errorf("data race in a trial child:\n%s", stderr.String())
		}
		// The trials the child did not finish: the one it had begun
		// failed; the others run in the next child.
		var rest []trialSpec
		for _, s := range specs {
			if _, ok := outs[s.N]; ok {
				continue
			}
			if s.N != begun {
				rest = append(rest, s)
				continue
			}
			tail := stderr.String()
			if len(tail) > 2000 {
				tail = tail[:2000]
			}
			class := outCrash
			switch {
			case hung:
				class = outHang
			case strings.Contains(tail, "panic:"):
				class = outPanic
			case strings.Contains(tail, "fatal error:"):
				class = outPanic
			}
			outs[s.N] = trialOutcome{class, fmt.Sprintf("%v; stderr: %q", werr, tail)}
		}
		if len(rest) == len(specs) {
			t.Errorf("a trial child made no progress: %v; stderr:\n%s", werr, stderr.String())
			return outs
		}
		specs = rest
	}
	return outs
}

// trialChild runs the trials listed in the file list, printing "begin n"
// before trial n and "trial n outcome detail" after it.
func trialChild(list string) {
	js, err := os.ReadFile(list)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	var specs []trialSpec
	if err := json.Unmarshal(js, &specs); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	for _, s := range specs {
		fmt.Printf("begin %d\n", s.N)
		o := runTrial(s)
		fmt.Printf("trial %d %s %s\n", s.N, o.class, strings.ReplaceAll(o.detail, "\n", " "))
	}
	os.Exit(0)
}

// runTrial opens a damaged copy and reads every acked message.
func runTrial(s trialSpec) trialOutcome {
	classify := func(what string, err error) trialOutcome {
		switch {
		case errors.Is(err, mq.ErrCorrupt) && strings.Contains(err.Error(), s.File):
			return trialOutcome{outCorrupt, what + ": " + err.Error()}
		case errors.Is(err, mq.ErrCorrupt):
			return trialOutcome{outMisnamed, what + ": " + err.Error()}
		case errors.Is(err, store.ErrFormat) && strings.Contains(err.Error(), s.File):
			return trialOutcome{outFormat, what + ": " + err.Error()}
		}
		return trialOutcome{outOther, fmt.Sprintf("%s: %v", what, err)}
	}
	m, err := mq.Open(s.Dir)
	if err != nil {
		return classify("open", err)
	}
	o := verifyTrial(m, s, classify)
	if err := m.Close(); err != nil && o.class == outClean {
		return classify("close", err)
	}
	return o
}

func verifyTrial(m *mq.MQ, s trialSpec, classify func(string, error) trialOutcome) trialOutcome {
	ctx := context.Background()
	topics := m.Topics()
	next := map[string]int64{}
	for _, a := range s.Acks {
		if topics[a.Topic] <= a.Part {
			return trialOutcome{outForgotten, fmt.Sprintf("%s/%d acked; topics %v", a.Topic, a.Part, topics)}
		}
		msg, err := m.ReadMessage(ctx, a.Topic, a.Part, a.Offset)
		switch {
		case errors.Is(err, mq.ErrNoMessage):
			return trialOutcome{outMissing, fmt.Sprintf("%s/%d at %d: %v", a.Topic, a.Part, a.Offset, err)}
		case err != nil:
			return classify(fmt.Sprintf("read %s/%d at %d", a.Topic, a.Part, a.Offset), err)
		case msg.Offset != a.Offset || msg.PartitionIndex != a.Part || string(msg.Body) != a.Body:
			return trialOutcome{outWrong, fmt.Sprintf("%s/%d at %d: got %d/%d %.40q, acked %.40q",
				a.Topic, a.Part, a.Offset, msg.PartitionIndex, msg.Offset, msg.Body, a.Body)}
		}
		k := a.Topic + "/" + strconv.Itoa(a.Part)
		next[k] = max(next[k], a.Offset+1)
	}
	// Nothing appears after the last acked message of a partition.
	for k, off := range next {
		tp, ps, _ := strings.Cut(k, "/")
		p, _ := strconv.Atoi(ps)
		msg, err := m.ReadMessage(ctx, tp, p, off)
		switch {
		case err == nil:
			return trialOutcome{outWrong, fmt.Sprintf("%s at %d: unacked %.40q", k, off, msg.Body)}
		case !errors.Is(err, mq.ErrNoMessage):
			return classify(fmt.Sprintf("read %s at %d", k, off), err)
		}
	}
	return trialOutcome{outClean, ""}
}
