// Package store keeps one partition of a topic in one bbolt file, as a
// deterministic state machine: every mutation is a Command, and Apply returns
// the Result that the one implementation of the command produced.
//
// # Paths
//
// A partition's single writer goroutine gathers the commands waiting for it
// and applies them, in order, against a view: the file, with the effects of
// earlier batches that are not in it yet laid over it. A batch's effects
// are a gen (gen.go): the bbolt writes it produced and the state after
// them. Gens are logged to the node's write-ahead log (wal.go), which puts
// the gens of every partition in one write and one fdatasync; only then are
// the batch's commands acknowledged, and only then do readers see its
// effects. The partition's materializer writes durable gens into the file
// in deep batches, with bbolt's normal fsync, and releases the log behind
// them. Replay after a crash writes the logged gens again: what is in the
// file is what was acknowledged, byte for byte. With a nil Options.WAL each
// gen is written into the file, and synced, before its commands are
// acknowledged.
//
// Commands that read a bucket in key order, OpTrim and OpRelease, run when
// the file holds everything: the writer waits for the materializer first.
//
// # Files
//
// Buckets, described in docs/DESIGN.md section 4:
//
//	log     big-endian offset -> record
//	half    txid -> half messages of an undecided transaction (state.go)
//	txs     txid -> decision (1 byte) + decided-at (8 bytes), kept DecideTTL
//	groups  group -> offset, generation, updated (state.go; before format 3:
//	        the committed offset alone, 8 bytes)
//	delay   deliverAt (8) + seq (8) -> record
//	dedup   message ID -> offset (8) + stored-at (8)
//	meta    "version" -> FormatVersion (8 bytes); "state" -> state (state.go,
//	        with the groups' generation counter);
//	        "id" -> 8 random bytes naming this file in the WAL's records;
//	        "position" -> a Replicated partition's Position (state.go)
//
// A record is a CRC32C followed by a msgpack array (message.go).
package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

// FormatVersion is the on-disk format of a partition file, stored in meta.
// Format 1 stored state and half transactions as msgpack maps; Open reads
// them and upgrades the file to format 2, which stores both in the layouts
// of state.go. Format 3 adds group generations: state version 2 and group
// records of layout 'Z' 'G'. Open reads older files as they are and marks
// them 3: a group value of 8 bytes, and one of seal of 4, is generation 0.
const FormatVersion = 3

// maxFormatVersion bounds the format versions a release may write: a
// stored version of 0 or above it is a damaged value, ErrCorrupt and
// ErrFormat; one between FormatVersion and it is a newer release's file,
// ErrFormat only.
const maxFormatVersion = 1 << 16

// Errors returned by this package.
var (
	// ErrClosed is returned by every method after Close.
	ErrClosed = errors.New("store: closed")
	// ErrCorrupt is returned when stored data fails its check: a record's
	// CRC, a file's layout, a WAL frame. The error names the file.
	ErrCorrupt = errors.New("store: corrupt data")
	// ErrFormat is returned by Open for a file of an unknown format version.
	ErrFormat = errors.New("store: unsupported format version")
	// ErrDecided is returned by OpPrepare for a transaction already decided.
	ErrDecided = errors.New("store: transaction already decided")
	// ErrOtherProducer is returned by OpPrepare for a transaction whose
	// half messages another producer prepared: transaction ids are the
	// application's, and messages joining another node's half would be
	// decided by that node's check-back. The command changed nothing.
	ErrOtherProducer = errors.New("store: transaction prepared by another producer")
	// ErrStaleGeneration is returned by OpCommitOffset when its Generation
	// is not the group's: a claim or a reset fenced the committer. The
	// command changed nothing.
	ErrStaleGeneration = errors.New("store: stale generation")
	// ErrClaimed is returned by OpClaim with a MaxAge lease while the
	// group's owner holds it. The command changed nothing.
	ErrClaimed = errors.New("store: group held by its owner's lease")
	// ErrPastEnd is returned by Fetch from an offset past the partition's
	// end, and by OpCommitOffset and OpUnclaim storing one: no consumer
	// reads past the end of an intact log, so its position was taken
	// from a tail the partition no longer holds (a DoubleWrite pair whose
	// lost copy an operator gave up, AcceptDataLoss). The consumer claims
	// again, from the offset the partition holds. Nothing changed.
	ErrPastEnd = errors.New("store: offset past the end of the partition")
	// ErrFrozen is returned for a command other than OpFreeze and OpThaw
	// to a frozen partition (OpFreeze): nothing ran, and the partition's
	// next owner runs it once it took over.
	ErrFrozen = errors.New("store: partition frozen: moving to another node")
	// ErrBadCommand is returned for a command that is not valid: an unknown
	// Op, a zero Now, a missing group or txid, a key over MaxKeyBytes, a
	// Start or Generation on an op that takes none, a claim or reset once
	// every generation was handed out.
	ErrBadCommand = errors.New("store: bad command")
	// ErrTooLarge is returned, before anything is written, for a command
	// whose effects would exceed MaxCommandBytes.
	ErrTooLarge = errors.New("store: command too large")
	// ErrFailed is returned for every command after a write or sync of the
	// partition's log or file failed, until the partition is reopened: the
	// outcome of what was being written is unknown, and nothing is retried
	// and acknowledged. The first error it wraps says what failed.
	ErrFailed = errors.New("store: partition failed")
)

var (
	bucketLog    = []byte("log")
	bucketHalf   = []byte("half")
	bucketTxs    = []byte("txs")
	bucketGroups = []byte("groups")
	bucketDelay  = []byte("delay")
	bucketDedup  = []byte("dedup")
	bucketMeta   = []byte("meta")

	allBuckets = [][]byte{bucketLog, bucketHalf, bucketTxs, bucketGroups, bucketDelay, bucketDedup, bucketMeta}

	metaVersion = []byte("version")
	metaState   = []byte("state")
	metaID      = []byte("id")
	// metaPosition holds a Replicated partition's Position, in state.go's
	// layout; other files lack it.
	metaPosition = []byte("position")

	metaKeys = [][]byte{metaVersion, metaState, metaID, metaPosition}
)

// checkLayout returns an error wrapping ErrCorrupt unless tx is a new file,
// with no bucket yet, or holds a partition: only the partition's buckets,
// its meta bucket with its version and state, and only the meta keys this
// code knows. A damaged bucket or key name must not pass for a missing one:
// load would make it anew, and an existing file would open empty, its meta
// gone, or without its dedup index or its groups.
func checkLayout(tx *bolt.Tx, path string) error {
	existing := false
	err := tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
		existing = true
		if !slices.ContainsFunc(allBuckets, func(b []byte) bool { return bytes.Equal(b, name) }) {
			return fmt.Errorf("%w: %s: unknown bucket %q", ErrCorrupt, path, name)
		}
		return nil
	})
	if err != nil || !existing {
		return err
	}
	meta := tx.Bucket(bucketMeta)
	if meta == nil || meta.Get(metaVersion) == nil || meta.Get(metaState) == nil {
		return fmt.Errorf("%w: %s: no meta bucket, version or state beside the other buckets", ErrCorrupt, path)
	}
	return meta.ForEach(func(k, _ []byte) error {
		if !slices.ContainsFunc(metaKeys, func(m []byte) bool { return bytes.Equal(m, k) }) {
			return fmt.Errorf("%w: %s: unknown meta key %q", ErrCorrupt, path, k)
		}
		return nil
	})
}

const (
	maxBatchCmds = 4096
	maxYields    = 16
	// maxGenBytes bounds one gen, the payload of one WAL record.
	maxGenBytes = MaxCommandBytes + 1<<20
	// bulkMsgs: a command with more messages makes its gen bulk.
	bulkMsgs = 16
)

// Options tune a partition. The zero value is durable: every batch is synced
// before its commands are acknowledged.
type Options struct {
	// WAL is the node's write-ahead log; Stream names the partition in it,
	// 1..1024 bytes, unique among the partitions sharing the WAL. Without a
	// WAL every batch is written into the file, and synced, before its
	// commands are acknowledged.
	WAL    *WAL
	Stream string
	// QueueDepth bounds the commands waiting for the writer; senders block
	// beyond it. Default 4096.
	QueueDepth int
	// MaterializeAfter is how long a logged batch may wait before the
	// materializer writes it into the file; a longer wait gathers deeper
	// batches, so fewer bbolt commits, and keeps more in memory. Default 50ms.
	// The materializer also starts early once MaxPendingBytes/4 are waiting.
	MaterializeAfter time.Duration
	// MaxPendingBytes bounds the logged batches not yet in the file; the
	// writer waits for the materializer beyond it. Default 16 MiB.
	MaxPendingBytes int
	// Replicated says that a replicated log, such as a raft group's, holds
	// the commands durably before they reach the partition, so the
	// partition keeps no log of its own: a batch is acknowledged once
	// applied, and the materializer writes batches into the file with
	// bbolt's fsync, as it does behind a WAL. The log's owner applies with
	// ApplyLogged, which records in the file the Position in its log that the
	// file holds, and replays its log from there after a restart. WAL must
	// be nil.
	Replicated bool
}

// Partition is one partition file. It is safe for concurrent use.
//
// Lock order: closeMu and mu are taken alone; neither is held while
// calling the WAL, whose done callbacks take mu.
type Partition struct {
	db   *bolt.DB
	path string
	opts Options
	wal  *WAL
	reqs chan *request
	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once

	closeMu sync.RWMutex // guards closing; held for reading while enqueuing
	closing bool

	id [8]byte // the file's id (meta "id"), random, set when the file is made

	// Owned by the writer goroutine.
	work    state  // the state after the last gen built
	nextIdx uint64 // index of the next gen with effects

	mu               sync.Mutex // guards the fields below; cond waits on it
	cond             *sync.Cond
	gens             []*gen        // gens with effects not yet in the file, oldest first; replaced, never modified in place
	waiting          []*gen        // gens whose commands wait for their durability, in order
	fileSt           state         // the state in the file
	filePos          Position      // Replicated: the position the file holds
	ackedSt          state         // the state after the last durable gen
	changed          chan struct{} // closed when a durable gen adds to the log or the delay index
	pending          int           // bytes of gens not yet in the file
	failed           error         // sticky: wraps ErrFailed or ErrCorrupt
	down             chan struct{} // closed when failed is set
	kick             bool          // materialize now
	matStop          bool          // Close: materialize what is durable and exit
	matDone          bool
	wake             chan struct{} // wakes the materializer
	commits, batches uint64        // bbolt commits and gens, for tests
}

// Open opens the partition file at path, creating it if needed, replays its
// stream of opts.WAL onto it, and starts its writer goroutine and, with a
// WAL or Replicated, its materializer goroutine. Close stops them. A
// damaged file is an error wrapping ErrCorrupt that names it.
func Open(path string, opts Options) (*Partition, error) {
	if opts.QueueDepth <= 0 {
		opts.QueueDepth = 4096
	}
	if opts.MaterializeAfter <= 0 {
		opts.MaterializeAfter = 50 * time.Millisecond
	}
	if opts.MaxPendingBytes <= 0 {
		opts.MaxPendingBytes = 16 << 20
	}
	if opts.WAL != nil && opts.Replicated {
		return nil, errors.New("store: a replicated partition has no WAL")
	}
	if opts.WAL != nil && (opts.Stream == "" || len(opts.Stream) > MaxKeyBytes) {
		return nil, fmt.Errorf("store: a WAL stream needs a name of 1..%d bytes", MaxKeyBytes)
	}
	db, err := openBolt(path)
	if err != nil {
		return nil, err
	}
	p := &Partition{
		db:      db,
		path:    path,
		opts:    opts,
		wal:     opts.WAL,
		reqs:    make(chan *request, opts.QueueDepth),
		stop:    make(chan struct{}),
		changed: make(chan struct{}),
		down:    make(chan struct{}),
		wake:    make(chan struct{}, 1),
	}
	p.cond = sync.NewCond(&p.mu)
	if err := p.load(); err != nil {
		db.Close()
		return nil, err
	}
	if p.wal != nil {
		if err := p.replay(); err != nil {
			db.Close()
			return nil, err
		}
		p.wg.Go(p.materializer)
	}
	if opts.Replicated {
		p.wg.Go(p.materializer)
	}
	p.work, p.ackedSt = p.fileSt, p.fileSt
	p.nextIdx = p.fileSt.Applied + 1
	p.wg.Go(p.run)
	return p, nil
}

// load creates the buckets, checks the format and reads the state,
// upgrading a format 1 file.
func (p *Partition) load() error {
	return p.update(func(tx *bolt.Tx) error {
		if err := checkLayout(tx, p.path); err != nil {
			return err
		}
		for _, name := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		v := meta.Get(metaVersion)
		switch {
		case v == nil:
		case len(v) == 8 && be.Uint64(v) >= 1 && be.Uint64(v) <= FormatVersion:
		case len(v) != 8 || be.Uint64(v) == 0 || be.Uint64(v) > maxFormatVersion:
			// No release writes that: a damaged value, not a newer
			// format, though an unsupported version too.
			return fmt.Errorf("%w: %w: %x in %s", ErrCorrupt, ErrFormat, v, p.path)
		default:
			return fmt.Errorf("%w: %x in %s", ErrFormat, v, p.path)
		}
		if s := meta.Get(metaState); s != nil {
			if err := decodeState(s, &p.fileSt); err != nil {
				return fmt.Errorf("%s: %w", p.path, err)
			}
		}
		if v := meta.Get(metaPosition); v != nil {
			pos, err := decodePosition(v)
			if err != nil {
				return fmt.Errorf("%s: %w", p.path, err)
			}
			p.filePos = pos
		}
		switch id := meta.Get(metaID); {
		case id == nil:
			_, _ = rand.Read(p.id[:]) // crypto/rand never fails
			if err := meta.Put(metaID, p.id[:]); err != nil {
				return err
			}
		case len(id) == len(p.id):
			copy(p.id[:], id)
		default:
			return fmt.Errorf("%w: %s: file id of %d bytes", ErrCorrupt, p.path, len(id))
		}
		if err := meta.Put(metaState, appendState(nil, &p.fileSt)); err != nil {
			return err
		}
		return meta.Put(metaVersion, u64(FormatVersion))
	})
}

// Path returns the file's path.
func (p *Partition) Path() string { return p.path }

// Close stops the writer after the commands already queued, waits until
// they are durable and in the file, waits for its goroutines and closes the
// file. It returns the error that failed the partition, if any. It is
// idempotent. With a WAL, close partitions before their WAL.
func (p *Partition) Close() error {
	var err error
	p.once.Do(func() {
		p.closeMu.Lock() // waits for senders blocked on a full queue: the writer still drains it
		p.closing = true
		close(p.stop)
		p.closeMu.Unlock()
		p.wg.Wait()
		p.mu.Lock()
		err = p.failed
		p.mu.Unlock()
		if cerr := p.db.Close(); err == nil {
			err = cerr
		}
	})
	return err
}

// request carries one or more commands to the writer. Its state decides who
// owns it when the caller's ctx ends: a request the writer has not taken is
// dropped unread; one it has taken is read until applied, and the caller
// waits for that before it returns, so a caller may reuse its commands as
// soon as Apply returns. The applied signal never waits for a disk.
type request struct {
	cmds []*Command
	at   []Position // ApplyLogged: each command's position in the replicated log
	res  []Result
	errs []error

	one    [1]*Command // cmds, res and errs of a single command
	oneRes [1]Result
	oneErr [1]error

	state   atomic.Int32
	applied chan struct{} // cap 1: the writer no longer reads cmds
	done    chan struct{} // cap 1: res and errs are final
}

const (
	reqQueued int32 = iota
	reqTaken
	reqGone // the caller stopped waiting: the writer owns the request
	reqDone
)

var requestPool = sync.Pool{New: func() any {
	return &request{applied: make(chan struct{}, 1), done: make(chan struct{}, 1)}
}}

// Apply hands cmd to the writer and waits until its effects are durable,
// logged or, without a WAL, in the file; then it returns the command's
// result.
// It returns ctx's error if ctx ends first; the command may still be applied
// and made durable, exactly once. Either way the store no longer reads cmd
// when Apply returns.
func (p *Partition) Apply(ctx context.Context, cmd *Command) (Result, error) {
	r := requestPool.Get().(*request)
	r.one[0] = cmd
	r.cmds, r.res, r.errs = r.one[:], r.oneRes[:], r.oneErr[:]
	if err := p.send(ctx, r); err != nil {
		return Result{}, err
	}
	res, err := r.res[0], r.errs[0]
	p.recycle(r)
	return res, err
}

// ApplyBatch applies cmds in order, in one batch, and returns each one's
// result and error, or nil slices with the error when none could be
// applied. A command's own error, such as ErrBadCommand, ErrDecided,
// ErrStaleGeneration, ErrClaimed or ErrTooLarge, fails only that command.
// It waits as Apply does.
func (p *Partition) ApplyBatch(ctx context.Context, cmds []*Command) ([]Result, []error, error) {
	r := requestPool.Get().(*request)
	r.cmds, r.res, r.errs = cmds, make([]Result, len(cmds)), make([]error, len(cmds))
	if err := p.send(ctx, r); err != nil {
		return nil, nil, err
	}
	res, errs := r.res, r.errs
	p.recycle(r)
	return res, errs, nil
}

// Position is a place in a replicated log: the commands of the entries
// before Index, and the first Cmds commands of the entry at Index. A
// command's own position counts it: Cmds is 1 for an entry's first.
type Position struct {
	Index uint64
	Cmds  uint64
}

// Less reports whether p comes before q.
func (p Position) Less(q Position) bool {
	return p.Index < q.Index || p.Index == q.Index && p.Cmds < q.Cmds
}

// ApplyLogged applies cmds as ApplyBatch does, in a partition opened
// Replicated: at[i] is the position of cmds[i] in the replicated log, in
// increasing order, and every bbolt transaction that writes a command's
// effects into the file records the position of the last command whose
// effects it holds. A command that changed nothing may be applied again
// after a restart, and changes nothing again: apply is deterministic.
func (p *Partition) ApplyLogged(ctx context.Context, cmds []*Command, at []Position) ([]Result, []error, error) {
	if !p.opts.Replicated || len(at) != len(cmds) {
		return nil, nil, fmt.Errorf("%w: ApplyLogged needs a replicated partition and a position per command", ErrBadCommand)
	}
	r := requestPool.Get().(*request)
	r.cmds, r.at, r.res, r.errs = cmds, at, make([]Result, len(cmds)), make([]error, len(cmds))
	if err := p.send(ctx, r); err != nil {
		return nil, nil, err
	}
	res, errs := r.res, r.errs
	p.recycle(r)
	return res, errs, nil
}

// Position returns the position in the replicated log that the file holds,
// zero for a partition that is not Replicated or never applied a logged
// command. Commands after it are not in the file.
func (p *Partition) Position() Position {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.filePos
}

// Sync waits until every command applied so far is in the file, which is
// synced then, and returns the position the file holds. A replicated log
// may drop its entries up to that position afterwards.
func (p *Partition) Sync() (Position, error) {
	if err := p.barrier(); err != nil {
		return Position{}, err
	}
	return p.Position(), nil
}

// send queues r and waits for it. On a nil return r is done and the caller
// owns it; otherwise r belongs to the writer or the pool.
func (p *Partition) send(ctx context.Context, r *request) error {
	r.state.Store(reqQueued)
	if err := ctx.Err(); err != nil {
		p.recycle(r)
		return err
	}
	// Enqueue under closeMu so Close cannot stop the writer between our
	// check and our send: whatever is enqueued, the writer's final drain sees.
	p.closeMu.RLock()
	if p.closing {
		p.closeMu.RUnlock()
		p.recycle(r)
		return ErrClosed
	}
	select {
	case p.reqs <- r:
		p.closeMu.RUnlock()
	case <-ctx.Done():
		p.closeMu.RUnlock()
		p.recycle(r)
		return ctx.Err()
	}
	select {
	case <-r.done:
		<-r.applied
		return nil
	case <-ctx.Done():
	}
	if r.state.CompareAndSwap(reqQueued, reqGone) {
		return ctx.Err() // the writer drops it unread
	}
	<-r.applied // the writer is applying it: never long
	if r.state.CompareAndSwap(reqTaken, reqGone) {
		return ctx.Err() // the writer recycles it when it is durable
	}
	<-r.done // it was done meanwhile
	return nil
}

func (p *Partition) recycle(r *request) {
	clear(r.one[:])
	clear(r.oneRes[:])
	clear(r.oneErr[:])
	r.cmds, r.at, r.res, r.errs = nil, nil, nil, nil
	requestPool.Put(r)
}

// finish hands r back to its caller, or recycles it if the caller is gone.
func (p *Partition) finish(r *request) {
	if r.state.CompareAndSwap(reqTaken, reqDone) {
		r.done <- struct{}{}
		return
	}
	p.recycle(r)
}

func (p *Partition) run() {
	debug.SetPanicOnFault(true) // a damaged page read through bbolt's mmap panics, which contain recovers, instead of crashing
	batch := make([]*request, 0, 256)
	for {
		select {
		case r := <-p.reqs:
			batch = append(batch, r)
		case <-p.stop:
			// Apply what was queued before Close, then refuse the rest.
			for {
				select {
				case r := <-p.reqs:
					batch = append(batch, r)
					if len(batch) == maxBatchCmds {
						p.process(batch)
						clear(batch)
						batch = batch[:0]
					}
					continue
				default:
				}
				break
			}
			if len(batch) > 0 {
				p.process(batch)
			}
			p.stopMaterializer()
			return
		}
		batch = p.gather(batch)
		p.process(batch)
		clear(batch)
		batch = batch[:0]
	}
}

// gather adds the waiting requests to batch, yielding the processor between
// drains for as long as a yield brings more. The senders a commit has just
// acknowledged are runnable but have not yet sent again; without the yield
// the writer would commit the first of them alone while the others queue
// behind that commit, and batches would alternate between tiny and large.
// Yielding lets them reach the queue first, so the batch is as deep as the
// load: an idle writer pays one Gosched, never a timed wait.
func (p *Partition) gather(batch []*request) []*request {
	for i := range maxYields {
		n := len(batch)
	drain:
		for len(batch) < maxBatchCmds {
			select {
			case r := <-p.reqs:
				batch = append(batch, r)
			default:
				break drain
			}
		}
		if len(batch) == maxBatchCmds || (i > 0 && len(batch) == n) {
			break
		}
		runtime.Gosched()
	}
	return batch
}

// process applies batch's commands into gens and submits them.
//
// A caller whose ctx ends waits only until the writer stops reading its
// commands, the applied signal, never for a disk: the writer waits for room
// before it takes any request, and before it waits for the materializer for
// a command that scans the file, it copies the commands it has taken and
// not yet applied, and signals them applied.
func (p *Partition) process(batch []*request) {
	p.room()
	taken := batch[:0]
	for _, r := range batch {
		if r.state.CompareAndSwap(reqQueued, reqTaken) {
			taken = append(taken, r)
		} else {
			p.recycle(r) // its caller is gone and it was never read
		}
	}
	b := builder{p: p}
	defer b.close()
	for _, r := range taken {
		for _, c := range r.cmds {
			b.hint += bound(c)
		}
	}
	released := 0 // taken[:released] were signalled applied
	for k, r := range taken {
		if released <= k && b.mustDrain(r) {
			for _, q := range taken[k:] {
				q.cmds = cloneCommands(q.cmds)
				q.at = slices.Clone(q.at)
				q.applied <- struct{}{}
			}
			released = len(taken)
		}
		for i, c := range r.cmds {
			r.res[i], r.errs[i] = b.apply(c)
			b.hint -= bound(c)
			if r.at != nil && b.g != nil {
				b.g.pos = r.at[i] // the gen now holds c's effects, if any
			}
		}
		if released <= k {
			r.applied <- struct{}{}
		}
		b.add(r)
	}
}

// mustDrain reports whether applying r waits for the materializer.
func (b *builder) mustDrain(r *request) bool {
	for _, c := range r.cmds {
		if scans(c) {
			return b.g != nil && !b.g.empty() || b.p.hasGens()
		}
	}
	return false
}

// cloneCommands deep-copies cmds, for a writer about to wait while their
// caller may stop waiting and reuse them.
func cloneCommands(cmds []*Command) []*Command {
	out := make([]*Command, len(cmds))
	for i, c := range cmds {
		cc := *c
		cc.Msgs = make([]Message, len(c.Msgs))
		for j, m := range c.Msgs {
			m.Tags = slices.Clone(m.Tags)
			m.Properties = maps.Clone(m.Properties)
			m.Body = bytes.Clone(m.Body)
			cc.Msgs[j] = m
		}
		out[i] = &cc
	}
	return out
}

// builder builds the gens of one batch on the writer goroutine.
type builder struct {
	p    *Partition
	g    *gen
	v    view
	hint int // bytes the rest of the batch may add: the next gen's first size
}

// apply applies c to the current gen, starting or cutting gens as needed.
func (b *builder) apply(c *Command) (res Result, err error) {
	defer func() {
		if r := recover(); r != nil {
			// A library panicked reading the file, as bbolt does on a
			// damaged page, here or while sizing the command: the gen is
			// unusable, the partition fails.
			err = b.p.fail(fmt.Errorf("%w: %s: %v", ErrCorrupt, b.p.path, r))
			b.discard(err)
		}
	}()
	if err := b.ready(c); err != nil {
		return res, err
	}
	if len(c.Msgs) > bulkMsgs {
		b.g.bulk = true
	}
	return b.v.apply(c)
}

// ready makes b.g a gen c can be applied to.
func (b *builder) ready(c *Command) error {
	for {
		if err := b.p.failure(); err != nil {
			return err
		}
		if b.g == nil {
			if err := b.start(); err != nil {
				return err
			}
		}
		switch {
		case scans(c) && (!b.g.empty() || b.p.hasGens()):
			b.submit()
			if err := b.p.drain(); err != nil {
				return err
			}
		case !b.g.empty() && b.g.size()+b.v.cost(c) > maxGenBytes:
			b.submit()
		default:
			return nil
		}
	}
}

// start begins a gen, once the pending bytes leave room, with a view over
// the gens not yet in the file and a read transaction begun after them.
func (b *builder) start() error {
	gens, err := b.p.overlay()
	if err != nil {
		return err
	}
	b.g = newGen(b.p.id, b.p.work, min(b.hint, maxGenBytes))
	b.v = view{db: b.p.db, g: b.g, gens: gens}
	return nil
}

// add makes r's answer wait for the current gen.
func (b *builder) add(r *request) {
	if b.g == nil {
		b.p.complete(&gen{reqs: []*request{r}}) // failed before any gen
		return
	}
	b.g.reqs = append(b.g.reqs, r)
}

// submit ends the read transaction and hands the current gen to the log.
func (b *builder) submit() {
	g := b.g
	b.end()
	b.p.submit(g)
}

func (b *builder) end() {
	b.v.end()
	b.g = nil
}

// discard drops the current gen after a panic; its requests fail with err.
func (b *builder) discard(err error) {
	g := b.g
	func() {
		defer func() { _ = recover() }()
		b.end()
	}()
	if g != nil {
		g.failedWith(err)
		b.p.complete(g)
	}
}

func (b *builder) close() {
	if b.g != nil {
		b.submit()
	}
}

// cost bounds the bytes applying c adds to a gen.
func (v *view) cost(c *Command) int {
	n := bound(c)
	if c.Op == OpCommitTx || c.Op == OpPrepare || c.Op == OpTxChecked {
		n += 2 * len(v.get(bHalf, c.TxID))
	}
	return n
}

// bound is c's cost without the half messages it may read.
func bound(c *Command) int {
	n := 64 + len(c.Group) + len(c.TxID) + len(c.Producer)
	for i := range c.Msgs {
		n += c.Msgs[i].recordBound() + effectOverhead + len(c.Msgs[i].ID)
	}
	return n
}

// failedWith marks g as failed: its commands answer err.
func (g *gen) failedWith(err error) {
	for _, r := range g.reqs {
		for i := range r.errs {
			r.errs[i] = err
		}
	}
}

// room waits until the gens not yet in the file leave room for a batch.
func (p *Partition) room() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.pending >= p.opts.MaxPendingBytes && p.failed == nil {
		p.kickLocked()
		p.cond.Wait()
	}
}

// overlay returns the gens not yet in the file, or the partition's failure.
func (p *Partition) overlay() ([]*gen, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.gens, p.failed
}

func (p *Partition) hasGens() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.gens) > 0
}

func (p *Partition) failure() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed
}

// fail makes err the partition's sticky failure, unless it failed already,
// and returns the failure.
func (p *Partition) fail(err error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failed == nil {
		p.failLocked(err)
		p.cond.Broadcast()
		p.wakeLocked()
	}
	return p.failed
}

// failLocked sets the partition's failure, the first one, and wakes the
// Fetch calls waiting for an append. p.mu is held.
func (p *Partition) failLocked(err error) {
	p.failed = err
	close(p.down)
}

// submit hands g to the write-ahead log, or writes it into the file without
// one, and queues its commands' answers behind it.
func (p *Partition) submit(g *gen) {
	if g.empty() && len(g.reqs) == 0 {
		return
	}
	if g.empty() {
		p.complete(g) // nothing to write: it answers once the gens before it are durable
		return
	}
	g.finish(p.nextIdx)
	p.nextIdx++
	p.work = g.st
	p.mu.Lock()
	// A gen holding a bulk append already amortizes a bbolt commit and its
	// fsyncs over many messages: logging it first would write it twice. It
	// goes straight into the file when nothing logged is waiting to go
	// there before it.
	direct := !p.opts.Replicated && (p.wal == nil || g.bulk && len(p.gens) == 0)
	p.gens = append(p.gens, g)
	p.waiting = append(p.waiting, g)
	p.pending += len(g.buf)
	p.batches++
	p.mu.Unlock()
	switch {
	case p.opts.Replicated:
		p.logged(g, 0, nil) // the replicated log holds its commands
		return
	case direct:
		err := p.materialize([]*gen{g})
		p.logged(g, 0, err)
		return
	}
	p.wal.Append(p.opts.Stream, g.buf, func(seg uint64, err error) { p.logged(g, seg, err) })
}

// complete queues g, a gen with nothing to write, behind the gens waiting.
func (p *Partition) complete(g *gen) {
	p.mu.Lock()
	g.done = true
	p.waiting = append(p.waiting, g)
	reqs := p.popWaiting()
	p.mu.Unlock()
	p.answer(reqs)
}

// logged runs once g's write-ahead log record is synced or failed, in log
// order; without a WAL, once g is in the file.
func (p *Partition) logged(g *gen, seg uint64, err error) {
	p.mu.Lock()
	g.done = true
	if err != nil {
		if p.failed == nil {
			p.failLocked(fmt.Errorf("%w: %s: %w", ErrFailed, p.path, err))
		}
		p.cond.Broadcast()
	} else {
		g.acked, g.seg, g.at = true, seg, time.Now()
		p.ackedSt = g.st
		if g.grew {
			close(p.changed)
			p.changed = make(chan struct{})
		}
		// Wake the materializer when enough is waiting, or when g is the
		// oldest gen not in the file: its clock starts.
		if p.pending >= p.opts.MaxPendingBytes/4 || len(p.gens) > 0 && p.gens[0] == g {
			p.wakeLocked()
		}
	}
	reqs := p.popWaiting()
	p.mu.Unlock()
	p.answer(reqs)
}

// popWaiting removes the gens at the front of waiting that are done, and
// those with nothing to write behind them, and returns their requests with
// their final errors. p.mu is held.
func (p *Partition) popWaiting() []*request {
	var out []*request
	for len(p.waiting) > 0 && p.waiting[0].done {
		g := p.waiting[0]
		p.waiting[0] = nil
		p.waiting = p.waiting[1:]
		if !g.acked && !g.empty() || g.empty() && p.failed != nil {
			g.failedWith(p.failed)
		}
		out = append(out, g.reqs...)
		g.reqs = nil
	}
	if len(p.waiting) == 0 {
		p.cond.Broadcast()
	}
	return out
}

func (p *Partition) answer(reqs []*request) {
	for _, r := range reqs {
		p.finish(r)
	}
}

// stopMaterializer, called by the writer as it exits, waits until every
// submitted gen is durable, then lets the materializer write them into the
// file and waits for it. The WAL must still be open.
func (p *Partition) stopMaterializer() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.waiting) > 0 {
		p.cond.Wait()
	}
	if p.wal == nil && !p.opts.Replicated {
		return
	}
	p.matStop = true
	p.wakeLocked()
	for !p.matDone {
		p.cond.Wait()
	}
}

func (p *Partition) kickLocked() {
	p.kick = true
	p.wakeLocked()
}

func (p *Partition) wakeLocked() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Stats is a snapshot of a partition's acknowledged state.
type Stats struct {
	Low, Next  uint64 // the log holds offsets [Low, Next)
	Bytes      int64
	Delayed    int64
	LastStored int64
}

// Stats returns the acknowledged state: what every durable command made of
// the partition, whether it is in the file yet or not.
func (p *Partition) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := &p.ackedSt
	return Stats{Low: s.Low, Next: s.Next, Bytes: s.Bytes, Delayed: s.Delayed, LastStored: s.LastStored}
}

// Frozen returns the token of the freeze the acknowledged state holds
// (OpFreeze's Offset), 0 when the partition is not frozen.
func (p *Partition) Frozen() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ackedSt.Frozen
}

// Changed returns a channel closed when the next durable command adds to
// the log or the delay index. Take it before reading Stats to avoid a lost
// wake-up.
func (p *Partition) Changed() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.changed
}

// RemoveFile deletes a closed partition's file.
func RemoveFile(path string) error {
	err := os.Remove(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}
