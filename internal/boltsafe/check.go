package boltsafe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
)

// The bbolt file format, version 2, as bbolt v1.4 writes it, in the
// machine's byte order. Every page starts with a 16-byte header:
//
//	0   8  id        the page's own number
//	8   2  flags     0x01 branch, 0x02 leaf, 0x04 meta, 0x10 freelist
//	10  2  count     elements (freelist: ids; 0xffff: the count is the first id slot)
//	12  4  overflow  pages that follow this one and belong to it
//
// Pages 0 and 1 hold a meta after the header, the one with the higher txid
// that checks being current; a branch page holds count elements {pos u32,
// ksize u32, pgid u64}, a leaf page {flags u32, pos u32, ksize u32, vsize
// u32}, where pos counts from the element itself. A leaf element with flag
// 0x01 is a bucket: its value is {root pgid u64, sequence u64}, followed by
// an inline leaf page when root is 0.
const (
	pageHeaderSize = 16
	elementSize    = 16
	metaSize       = 64 // magic .. checksum
	bucketHeader   = 16

	branchFlag   = 0x01
	leafFlag     = 0x02
	freelistFlag = 0x10
	bucketLeaf   = 0x01

	boltMagic      = 0xED0CDAED
	boltVersion    = 2
	noFreelist     = ^uint64(0)
	minPageSize    = 512
	maxPageSize    = 1 << 24 // the largest page size bbolt looks for
	defaultPageMax = 4096    // the first read bbolt makes to find the page size
)

var order = binary.NativeEndian

// errDamage marks a finding of check: the file is not what bbolt wrote. Any
// other error of check is an I/O error.
var errDamage = errors.New("damaged")

func damagef(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errDamage}, args...)...)
}

// meta is a decoded meta page.
type meta struct {
	pageSize uint32
	root     uint64
	freelist uint64
	pgid     uint64 // high water mark: pages [0, pgid) are in use or free
	txid     uint64
}

// decodeMeta decodes the meta in b, of at least metaSize bytes, and reports
// whether its magic, version and checksum hold, as bbolt's Meta.Validate.
func decodeMeta(b []byte) (meta, bool) {
	if len(b) < metaSize || order.Uint32(b[0:]) != boltMagic || order.Uint32(b[4:]) != boltVersion {
		return meta{}, false
	}
	h := fnv.New64a()
	h.Write(b[:56])
	if h.Sum64() != order.Uint64(b[56:]) {
		return meta{}, false
	}
	return meta{
		pageSize: order.Uint32(b[8:]),
		root:     order.Uint64(b[16:]),
		freelist: order.Uint64(b[32:]),
		pgid:     order.Uint64(b[40:]),
		txid:     order.Uint64(b[48:]),
	}, true
}

// scope says how much of a file check reads.
type scope int

const (
	// scopeQuick reads the meta pages, the freelist, the root bucket's tree
	// and the top-level buckets' root pages.
	scopeQuick scope = iota
	// scopeFull reads every page in use.
	scopeFull
	// scopeWritable is scopeQuick, or scopeFull when the file stores no
	// freelist: a writable bbolt Open then walks every bucket itself.
	scopeWritable
)

// checker walks a bbolt file through ReadAt, never through a memory map, so
// damage can only make it return an error.
type checker struct {
	r        io.ReaderAt
	size     int64
	pageSize int64
	m        meta
	full     bool            // walk every bucket; otherwise stop below the top-level buckets' roots
	free     map[uint64]bool // pages on the freelist
	seen     map[uint64]bool // pages reached from the root, with their overflow
}

// check verifies the file r of size bytes as bbolt would open it: the meta
// page bbolt would pick, the freelist, and as much of the buckets' B+trees
// as s says. It returns an error wrapping errDamage for a file bbolt would
// misread or panic on, and I/O errors as they are.
func check(r io.ReaderAt, size int64, s scope) error {
	c := &checker{r: r, size: size, free: map[uint64]bool{}, seen: map[uint64]bool{0: true, 1: true}}
	if err := c.pickMeta(); err != nil {
		return err
	}
	c.full = s == scopeFull || s == scopeWritable && c.m.freelist == noFreelist
	full := c.full
	if err := c.readFreelist(); err != nil {
		return err
	}
	if err := c.tree(c.m.root, nil, nil, true); err != nil {
		return fmt.Errorf("root bucket: %w", err)
	}
	if full && c.m.freelist != noFreelist {
		for id := uint64(2); id < c.m.pgid; id++ {
			if !c.seen[id] && !c.free[id] {
				return damagef("page %d: neither reachable nor free", id)
			}
		}
	}
	return nil
}

// readAt reads len(b) bytes at off; a short file is damage.
func (c *checker) readAt(b []byte, off int64) error {
	n, err := c.r.ReadAt(b, off)
	if n == len(b) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		return damagef("file ends at %d, want %d bytes at %d", c.size, len(b), off)
	}
	return err
}

// pickMeta finds the page size and the current meta the way bbolt's Open
// and DB.meta do, then checks that meta against the file.
func (c *checker) pickMeta() error {
	ps, err := c.findPageSize()
	if err != nil {
		return err
	}
	c.pageSize = int64(ps)
	if c.size < 2*c.pageSize {
		return damagef("file size %d is less than two %d-byte pages", c.size, c.pageSize)
	}
	var metas [2]meta
	var ok [2]bool
	for i := range metas {
		b := make([]byte, metaSize)
		if err := c.readAt(b, int64(i)*c.pageSize+pageHeaderSize); err != nil {
			return err
		}
		metas[i], ok[i] = decodeMeta(b)
	}
	a, b := 0, 1
	if metas[1].txid > metas[0].txid {
		a, b = 1, 0
	}
	switch {
	case ok[a]:
		c.m = metas[a]
	case ok[b]:
		c.m = metas[b]
	default:
		return damagef("both meta pages are invalid")
	}
	m := c.m
	if int64(m.pageSize) != c.pageSize {
		return damagef("meta page size %d, file read with %d", m.pageSize, c.pageSize)
	}
	if m.pgid < 3 || m.pgid > uint64(c.size/c.pageSize) {
		return damagef("high water mark %d pages, file has %d", m.pgid, c.size/c.pageSize)
	}
	if m.root < 2 || m.root >= m.pgid {
		return damagef("root page %d outside [2, %d)", m.root, m.pgid)
	}
	if m.freelist != noFreelist && (m.freelist < 2 || m.freelist >= m.pgid) {
		return damagef("freelist page %d outside [2, %d)", m.freelist, m.pgid)
	}
	return nil
}

// findPageSize mirrors bbolt's getPageSize: the page size of meta 0 if it
// checks, else of the first meta 1 found at 1 KiB << i, else 4096 when
// either place could be read, as bbolt then uses the default page size.
func (c *checker) findPageSize() (int, error) {
	valid := func(m meta) bool {
		ps := m.pageSize
		return ps >= minPageSize && ps <= maxPageSize && ps&(ps-1) == 0
	}
	canRead := false
	b := make([]byte, defaultPageMax)
	if err := c.readAt(b, 0); err == nil {
		canRead = true
		if m, ok := decodeMeta(b[pageHeaderSize:]); ok {
			if !valid(m) {
				return 0, damagef("meta 0: page size %d", m.pageSize)
			}
			return int(m.pageSize), nil
		}
	} else if !errors.Is(err, errDamage) {
		return 0, err
	}
	for i := 0; i <= 14; i++ {
		pos := int64(1024) << i
		if pos >= c.size-1024 {
			break
		}
		n, err := c.r.ReadAt(b, pos)
		if err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		if n >= pageHeaderSize+metaSize && (n == len(b) || int64(n) == c.size-pos) {
			canRead = true
			if m, ok := decodeMeta(b[pageHeaderSize:n]); ok {
				if !valid(m) {
					return 0, damagef("meta 1: page size %d", m.pageSize)
				}
				return int(m.pageSize), nil
			}
		}
	}
	if canRead {
		return defaultPageMax, nil
	}
	return 0, damagef("no valid meta page")
}

// page reads page id with its overflow pages and checks its header: its own
// id, its span below the high water mark, and that nothing else claimed it.
func (c *checker) page(id uint64) ([]byte, error) {
	if id < 2 || id >= c.m.pgid {
		return nil, damagef("page %d outside [2, %d)", id, c.m.pgid)
	}
	var h [pageHeaderSize]byte
	if err := c.readAt(h[:], int64(id)*c.pageSize); err != nil {
		return nil, err
	}
	if got := order.Uint64(h[0:]); got != id {
		return nil, damagef("page %d: header says page %d", id, got)
	}
	overflow := uint64(order.Uint32(h[12:]))
	if overflow >= c.m.pgid-id {
		return nil, damagef("page %d: %d overflow pages pass the high water mark %d", id, overflow, c.m.pgid)
	}
	for i := id; i <= id+overflow; i++ {
		if c.seen[i] {
			return nil, damagef("page %d: reached twice", i)
		}
		if c.free[i] {
			return nil, damagef("page %d: reachable and free", i)
		}
		c.seen[i] = true
	}
	b := make([]byte, int64(overflow+1)*c.pageSize)
	if err := c.readAt(b, int64(id)*c.pageSize); err != nil {
		return nil, err
	}
	return b, nil
}

// readFreelist checks the freelist page and records the free page ids:
// each below the high water mark, in ascending order, none twice.
func (c *checker) readFreelist() error {
	if c.m.freelist == noFreelist {
		return nil
	}
	p, err := c.page(c.m.freelist)
	if err != nil {
		return fmt.Errorf("freelist: %w", err)
	}
	if flags := order.Uint16(p[8:]); flags != freelistFlag {
		return damagef("freelist page %d: flags %#x", c.m.freelist, flags)
	}
	start, n := uint64(0), uint64(order.Uint16(p[10:]))
	if n == 0xffff {
		if len(p) < pageHeaderSize+8 {
			return damagef("freelist page %d: no count", c.m.freelist)
		}
		start, n = 1, order.Uint64(p[pageHeaderSize:])
	}
	if n > uint64(len(p)-pageHeaderSize)/8-start {
		return damagef("freelist page %d: %d ids do not fit", c.m.freelist, n)
	}
	prev := uint64(1)
	for i := uint64(0); i < n; i++ {
		id := order.Uint64(p[pageHeaderSize+(start+i)*8:])
		if id <= prev || id >= c.m.pgid {
			return damagef("freelist page %d: id %d after %d (high water mark %d)", c.m.freelist, id, prev, c.m.pgid)
		}
		if c.seen[id] {
			return damagef("freelist page %d: lists itself (%d)", c.m.freelist, id)
		}
		c.free[id] = true
		prev = id
	}
	return nil
}

// tree checks the B+tree rooted at page id, whose keys lie in [lo, hi), a
// nil bound being none. top says this is the root bucket's tree, whose
// leaves may hold only buckets.
func (c *checker) tree(id uint64, lo, hi []byte, top bool) error {
	p, err := c.page(id)
	if err != nil {
		return err
	}
	return c.node(p, id, lo, hi, top)
}

// node checks one page p, a real page id or an inline bucket's page with
// id 0, and what hangs below it.
func (c *checker) node(p []byte, id uint64, lo, hi []byte, top bool) error {
	flags, count := order.Uint16(p[8:]), int(order.Uint16(p[10:]))
	if pageHeaderSize+count*elementSize > len(p) {
		return damagef("page %d: %d elements do not fit", id, count)
	}
	prev := lo
	for i := 0; i < count; i++ {
		e := p[pageHeaderSize+i*elementSize:]
		switch flags {
		case branchFlag:
			pos, ksize := uint64(order.Uint32(e[0:])), uint64(order.Uint32(e[4:]))
			key, err := slice(p, uint64(pageHeaderSize+i*elementSize), pos, ksize)
			if err != nil {
				return fmt.Errorf("page %d element %d: %w", id, i, err)
			}
			if err := inOrder(key, prev, hi, i == 0); err != nil {
				return fmt.Errorf("page %d element %d: %w", id, i, err)
			}
			prev = key
			next := hi
			if i+1 < count {
				ne := p[pageHeaderSize+(i+1)*elementSize:]
				if next, err = slice(p, uint64(pageHeaderSize+(i+1)*elementSize), uint64(order.Uint32(ne[0:])), uint64(order.Uint32(ne[4:]))); err != nil {
					return fmt.Errorf("page %d element %d: %w", id, i+1, err)
				}
			}
			if err := c.tree(order.Uint64(e[8:]), key, next, top); err != nil {
				return err
			}
		case leafFlag:
			eflags, pos := order.Uint32(e[0:]), uint64(order.Uint32(e[4:]))
			ksize, vsize := uint64(order.Uint32(e[8:])), uint64(order.Uint32(e[12:]))
			kv, err := slice(p, uint64(pageHeaderSize+i*elementSize), pos, ksize+vsize)
			if err != nil {
				return fmt.Errorf("page %d element %d: %w", id, i, err)
			}
			key, val := kv[:ksize], kv[ksize:]
			if err := inOrder(key, prev, hi, i == 0); err != nil {
				return fmt.Errorf("page %d element %d: %w", id, i, err)
			}
			prev = key
			switch {
			case eflags == bucketLeaf:
				if err := c.bucket(val, top); err != nil {
					return fmt.Errorf("bucket %q: %w", key, err)
				}
			case eflags != 0:
				return damagef("page %d element %d: flags %#x", id, i, eflags)
			case top:
				return damagef("page %d element %d: a value in the root bucket", id, i)
			}
		default:
			return damagef("page %d: flags %#x, want a branch or a leaf", id, flags)
		}
	}
	if flags == branchFlag && count == 0 {
		return damagef("page %d: empty branch", id)
	}
	return nil
}

// bucket checks a bucket's value: its header, then its inline page or its
// tree. Below the top level it walks only when the check is full.
func (c *checker) bucket(v []byte, top bool) error {
	if len(v) < bucketHeader {
		return damagef("value of %d bytes, want a %d-byte bucket header", len(v), bucketHeader)
	}
	root := order.Uint64(v)
	if root != 0 {
		if !c.full && !top {
			return nil
		}
		if !c.full {
			// Quick check: the root page alone.
			p, err := c.page(root)
			if err != nil {
				return err
			}
			if flags := order.Uint16(p[8:]); flags != branchFlag && flags != leafFlag {
				return damagef("page %d: flags %#x, want a branch or a leaf", root, flags)
			}
			if count := int(order.Uint16(p[10:])); pageHeaderSize+count*elementSize > len(p) {
				return damagef("page %d: %d elements do not fit", root, count)
			}
			return nil
		}
		return c.tree(root, nil, nil, false)
	}
	inline := v[bucketHeader:]
	if len(inline) < pageHeaderSize {
		return damagef("inline bucket of %d bytes", len(v))
	}
	if flags := order.Uint16(inline[8:]); flags != leafFlag {
		return damagef("inline bucket: flags %#x, want a leaf", flags)
	}
	if !c.full && !top {
		return nil
	}
	return c.node(inline, 0, nil, nil, false)
}

// slice returns the n bytes of p that start pos bytes after the element at
// offset elem, or damage when they leave p.
func slice(p []byte, elem, pos, n uint64) ([]byte, error) {
	start := elem + pos
	if pos > uint64(len(p)) || start > uint64(len(p)) || n > uint64(len(p))-start {
		return nil, damagef("%d bytes at %d pass the page end %d", n, start, len(p))
	}
	return p[start : start+n], nil
}

// inOrder checks a key against the one before it, or the lower bound for
// the first, and the upper bound, as bbolt's tx.Check does.
func inOrder(key, prev, hi []byte, first bool) error {
	switch {
	case len(key) == 0:
		return damagef("empty key")
	case prev != nil && first && bytes.Compare(prev, key) > 0:
		return damagef("key %x below its parent's %x", key, prev)
	case prev != nil && !first && bytes.Compare(prev, key) >= 0:
		return damagef("key %x not above the one before, %x", key, prev)
	case hi != nil && bytes.Compare(key, hi) >= 0:
		return damagef("key %x not below the next branch key %x", key, hi)
	}
	return nil
}
