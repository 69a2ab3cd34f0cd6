// Package store keeps one partition of a topic in one bbolt file.
//
// Every mutation is a Command applied by the partition's single writer
// goroutine, which gathers all waiting commands into one bbolt transaction
// and one fsync (group commit) and acknowledges them in order afterwards.
// Readers use bbolt read transactions and see only committed, synced data.
//
// With a node-level write-ahead log (Options.WAL, wal.go, walpart.go) plain
// appends are acknowledged once one group fdatasync of the WAL covers them,
// whatever partition they belong to, and are materialized into the file
// later, in deep batches, by the same apply code; replay after a crash
// restores them at their acknowledged offsets.
//
// Buckets (see DESIGN.md section 4):
//
//	log     big-endian offset -> record
//	half    txid -> half messages of an undecided transaction
//	txs     txid -> decision (1 byte) + decided-at (8 bytes), kept DecideTTL
//	groups  group -> committed offset (8 bytes)
//	delay   deliverAt (8) + seq (8) -> record
//	dedup   message ID -> offset (8) + stored-at (8)
//	meta    format version, next offset, low watermark, applied index, ...
//
// A record is a CRC32C followed by a msgpack array (message.go).
package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// FormatVersion is the on-disk format of a partition file, stored in meta.
const FormatVersion = 1

// Errors returned by this package.
var (
	// ErrClosed is returned by every method after Close.
	ErrClosed = errors.New("store: closed")
	// ErrCorrupt is returned when a record fails its CRC or cannot be decoded.
	ErrCorrupt = errors.New("store: corrupt record")
	// ErrFormat is returned by Open for a file of an unknown format version.
	ErrFormat = errors.New("store: unsupported format version")
	// ErrDecided is returned by OpPrepare for a transaction already decided.
	ErrDecided = errors.New("store: transaction already decided")
	// ErrBadCommand is returned for a command with an unknown Op.
	ErrBadCommand = errors.New("store: bad command")
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

	metaVersion  = []byte("version")
	metaState    = []byte("state")
	noOffset     = ^uint64(0)
	maxBatchCmds = 4096
	maxYields    = 16
)

// Options tune a partition. The zero value is durable: every batch is fsynced
// before its commands are acknowledged.
type Options struct {
	// SyncInterval, when positive, acknowledges commands before fsync and
	// syncs the file every SyncInterval instead (RocketMQ's ASYNC_FLUSH). A
	// process crash loses nothing (the OS has the pages); a power loss may
	// lose the last interval and, as bbolt's NoSync warns, may damage the file.
	SyncInterval time.Duration
	// QueueDepth bounds the commands waiting for the writer; senders block
	// beyond it. Default 4096.
	QueueDepth int
	// WAL, when set, is the node's write-ahead log: plain appends are
	// acknowledged once logged there and materialized into the file later
	// (walpart.go). WALName names the partition in the log; it must be
	// unique among the partitions sharing the WAL. The partition numbers its
	// commands itself: a caller's Index is ignored. Not with SyncInterval.
	WAL     *WAL
	WALName string
}

// state is the partition's metadata, kept in memory and written to meta once
// per batch.
type state struct {
	Next       uint64 // offset of the next appended message
	Low        uint64 // offset of the first message still in the log
	Bytes      int64  // bytes of records in the log
	DedupLow   uint64 // log offsets below this have no dedup entry any more
	Applied    uint64 // highest replicated Index applied
	LastStored int64  // StoredAt of the newest record; StoredAt never decreases
	DelaySeq   uint64 // sequence of the newest delayed message
	Delayed    int64  // messages in the delay index
}

type request struct {
	cmd  *Command
	err  error
	done chan struct{}
}

var requestPool = sync.Pool{New: func() any { return &request{done: make(chan struct{}, 1)} }}

// Partition is one partition file. It is safe for concurrent use.
type Partition struct {
	db   *bolt.DB
	path string
	opts Options
	reqs chan *request
	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once

	closeMu sync.RWMutex // guards closing; held for reading while enqueuing
	closing bool

	mu      sync.Mutex    // guards st, changed, commits and commands
	st      state         // committed state; the writer owns a working copy
	changed chan struct{} // closed when the log or the delay index changes

	commits, commands uint64 // committed batches and the commands in them

	enc *encoder // writer's arena

	// With a WAL (walpart.go).
	wal    *WAL
	name   string
	walEnc *encoder // writer's WAL arena
	matEnc *encoder // materializer's arena
	hits   map[string]Ack
	// Owned by the writer: next Index, last Index logged, the view of the
	// log including what is logged but not materialized.
	nextIdx, submitted uint64
	vNext              uint64
	vLast, vBytes      int64
	av                 ackedView // guarded by mu

	mmu      sync.Mutex // guards the fields below
	mcond    *sync.Cond
	wake     chan struct{}
	mq       []matItem          // logged, waiting for the materializer
	overlay  map[string]ovEntry // IDs logged but not materialized
	txDone   map[string]uint64  // txids committed by logged, unmaterialized commands -> Index
	acked    uint64             // highest Index acknowledged from the WAL
	matIdx   uint64             // highest logged Index materialized
	mPending int                // logged commands not materialized
	mBytes   int
	kick     bool  // materialize now
	mStop    bool  // Close: materialize what is left and exit
	mDone    bool  // the materializer has exited
	mErr     error // sticky: a failed WAL write or materialization
}

// Open opens (creating if needed) the partition file at path and starts its
// writer goroutine (and, with SyncInterval, its syncer goroutine). Close stops
// them.
func Open(path string, opts Options) (*Partition, error) {
	if opts.QueueDepth <= 0 {
		opts.QueueDepth = 4096
	}
	if opts.SyncInterval < 0 {
		return nil, fmt.Errorf("store: negative SyncInterval %v", opts.SyncInterval)
	}
	if opts.WAL != nil && (opts.SyncInterval > 0 || opts.WALName == "" || len(opts.WALName) > 1024) {
		return nil, fmt.Errorf("store: a WAL needs a name of 1..1024 bytes and no SyncInterval")
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	db.NoSync = opts.SyncInterval > 0
	p := &Partition{
		db:      db,
		path:    path,
		opts:    opts,
		reqs:    make(chan *request, opts.QueueDepth),
		stop:    make(chan struct{}),
		changed: make(chan struct{}),
		enc:     newEncoder(),
	}
	if err := p.load(); err != nil {
		db.Close()
		return nil, err
	}
	if opts.WAL != nil {
		p.wal, p.name = opts.WAL, opts.WALName
		p.walEnc, p.matEnc = newEncoder(), newEncoder()
		p.hits = map[string]Ack{}
		p.overlay = map[string]ovEntry{}
		p.txDone = map[string]uint64{}
		p.mcond = sync.NewCond(&p.mmu)
		p.wake = make(chan struct{}, 1)
		if err := p.replay(); err != nil {
			db.Close()
			return nil, err
		}
		p.wg.Add(1)
		go p.materializer()
	}
	p.wg.Add(1)
	go p.run()
	if opts.SyncInterval > 0 {
		p.wg.Add(1)
		go p.syncEvery(opts.SyncInterval)
	}
	return p, nil
}

func (p *Partition) load() error {
	return p.db.Update(func(tx *bolt.Tx) error {
		for _, name := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		v := meta.Get(metaVersion)
		if v == nil {
			if err := meta.Put(metaVersion, u64(FormatVersion)); err != nil {
				return err
			}
		} else if len(v) != 8 || be.Uint64(v) != FormatVersion {
			return fmt.Errorf("%w: %x in %s", ErrFormat, v, p.path)
		}
		if s := meta.Get(metaState); s != nil {
			if err := decodeState(s, &p.st); err != nil {
				return fmt.Errorf("store: %s: %w", p.path, err)
			}
		}
		return nil
	})
}

// Path returns the file's path.
func (p *Partition) Path() string { return p.path }

// Close stops the writer after the commands already queued, waits for its
// goroutines and closes the file. It is idempotent.
func (p *Partition) Close() error {
	var err error
	p.once.Do(func() {
		p.closeMu.Lock() // waits for senders blocked on a full queue: the writer still drains it
		p.closing = true
		close(p.stop)
		p.closeMu.Unlock()
		p.wg.Wait()
		if err = p.closeErr(); err != nil {
			p.db.Close()
			return
		}
		if p.db.NoSync {
			err = p.db.Sync()
		}
		if cerr := p.db.Close(); err == nil {
			err = cerr
		}
	})
	return err
}

// Apply hands cmd to the writer and waits until it is committed (and synced,
// unless SyncInterval is set). It returns ctx's error if ctx ends first, in
// which case the command may still be applied. The caller must not touch cmd
// until Apply returns.
func (p *Partition) Apply(ctx context.Context, cmd *Command) error {
	if cmd.Now == 0 {
		cmd.Now = time.Now().UnixNano()
	}
	r := requestPool.Get().(*request)
	r.cmd, r.err = cmd, nil
	// Enqueue under closeMu so Close cannot stop the writer between our
	// check and our send: whatever is enqueued, the writer's final drain sees.
	p.closeMu.RLock()
	if p.closing {
		p.closeMu.RUnlock()
		requestPool.Put(r)
		return ErrClosed
	}
	select {
	case p.reqs <- r:
		p.closeMu.RUnlock()
	case <-ctx.Done():
		p.closeMu.RUnlock()
		requestPool.Put(r)
		return ctx.Err()
	}
	select {
	case <-r.done:
		err := r.err
		r.cmd = nil
		requestPool.Put(r)
		return err
	case <-ctx.Done():
		return ctx.Err() // r is abandoned to the writer and the GC
	}
}

func (p *Partition) run() {
	defer p.wg.Done()
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

// commit applies batch in one bbolt transaction and acknowledges every
// request. A command's own error (ErrDecided, ErrBadCommand) fails only that
// command; it is detected before the command writes anything. Any other
// error aborts the transaction and fails the whole batch.
func (p *Partition) commit(batch []*request) {
	err := p.update(p.enc, len(batch), func(w *writeTx) error {
		for _, r := range batch {
			if r.cmd.Index != 0 && r.cmd.Index <= w.st.Applied {
				r.err = nil
				continue
			}
			r.err = w.apply(r.cmd)
			if r.err != nil && !isCommandError(r.err) {
				return r.err
			}
			if r.cmd.Index > w.st.Applied {
				w.st.Applied = r.cmd.Index
			}
		}
		return nil
	})
	for _, r := range batch {
		if err != nil {
			r.err = err
		}
		r.done <- struct{}{}
	}
}

// update runs fn on a working copy of the state in one bbolt transaction
// (synced unless SyncInterval), saves the state in meta and, once committed,
// publishes it for n more commands, waking Changed if the log grew.
func (p *Partition) update(enc *encoder, n int, fn func(w *writeTx) error) error {
	p.mu.Lock()
	st := p.st
	p.mu.Unlock()
	enc.reset()
	defer enc.reset() // after the commit nothing refers to the arena: drop it if a burst grew it
	grew := false
	err := p.db.Update(func(tx *bolt.Tx) error {
		w := writeTx{tx: tx, st: &st, enc: enc}
		w.open()
		if err := fn(&w); err != nil {
			return err
		}
		grew = w.grew
		return w.meta.Put(metaState, encodeState(&st))
	})
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.st = st
	p.commits++
	p.commands += uint64(n)
	if grew {
		close(p.changed)
		p.changed = make(chan struct{})
	}
	p.mu.Unlock()
	return nil
}

func isCommandError(err error) bool {
	return errors.Is(err, ErrDecided) || errors.Is(err, ErrBadCommand)
}

func (p *Partition) syncEvery(d time.Duration) {
	defer p.wg.Done()
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			_ = p.db.Sync()
		case <-p.stop:
			return
		}
	}
}

// Stats is a snapshot of a partition's committed state.
type Stats struct {
	Low, Next  uint64 // the log holds offsets [Low, Next)
	Bytes      int64
	Delayed    int64
	LastStored int64
}

// Stats returns the committed state.
//
// With a WAL it is the acknowledged state: messages acknowledged but not yet
// materialized are counted, and a Read or Get of them waits for them.
func (p *Partition) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := Stats{Low: p.st.Low, Next: p.st.Next, Bytes: p.st.Bytes, Delayed: p.st.Delayed, LastStored: p.st.LastStored}
	if p.av.idx > p.st.Applied {
		s.Next, s.Bytes, s.LastStored = p.av.next, p.av.bytes, p.av.last
	}
	return s
}

// Changed returns a channel closed at the next commit that adds to the log
// or the delay index. Take it before reading Stats to avoid a lost wake-up.
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
