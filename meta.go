package mq

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq/internal/boltsafe"
)

// The node's metadata file, <dir>/meta.db, is a bbolt file with two
// buckets:
//
//	meta    "version" → the node format, nodeFormat in decimal ASCII ("1")
//	topics  topic name → topic record (below)
//
// The node format versions the file's layout: its buckets and keys. Each
// topic record carries its own magic and version, so a record layout can
// change without a new node format; a file is opened only if its node
// format is nodeFormat and every record's version is one this code reads.
//
// The partition files, <dir>/topics/<topic>/<i>.db, are the ground truth of
// which topics exist: meta.db adds their type and creation time. Open
// therefore rebuilds a missing or empty meta.db from the topic directories
// (every topic Single, the only type of a standalone node), adopts a topic
// or partition whose files exist but which meta.db lacks (a crash between
// creating the files and recording them), and refuses, with ErrCorrupt, a
// meta.db that is damaged, lists a partition whose file is gone, or that it
// cannot read. A damaged meta.db is never rebuilt over: remove it and Open
// rebuilds it.
var (
	bucketTopics   = []byte("topics")
	bucketNodeMeta = []byte("meta")
	keyVersion     = []byte("version")
)

// nodeFormat is the version of meta.db's layout.
const nodeFormat = 1

// Topic record, the value under a topic's name in bucket topics:
//
//	0   4  magic "MQTP"
//	4   1  version, topicFormat
//	5   1  replication type (Type: 1 Single, 2 DoubleWrite, 4 Raft3)
//	6   4  partitions, uint32 big-endian
//	10  8  creation time, Unix nanoseconds, int64 big-endian; 0 if unknown
//	18  4  CRC-32C of the topic's name followed by bytes 0..17
//
// The CRC covers the name because bbolt checks nothing in its pages: a
// flipped byte in a key would otherwise rename a topic.
//
// Records written before this layout are msgpack maps {"p": partitions,
// "t": type, "c": created} (legacyTopicMeta); Open reads them and rewrites
// them in this layout.
const (
	topicMagic      = "MQTP"
	topicFormat     = 1
	topicRecordSize = 22
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errNewerFormat marks a layout version this code does not read: a newer
// node wrote the file, so removing it is not the way out.
var errNewerFormat = errors.New("written by a newer version")

// topicMeta is the stored description of a topic.
type topicMeta struct {
	Partitions int
	Type       Type
	Created    time.Time // zero when unknown: the topic was rebuilt or adopted from its files
}

// legacyTopicMeta is the topic record of meta.db files written before the
// explicit layout: a msgpack map keyed by these tags.
type legacyTopicMeta struct {
	Partitions int       `msgpack:"p"`
	Type       Type      `msgpack:"t"`
	Created    time.Time `msgpack:"c"`
}

// encodeTopicMeta returns the record of topic name.
func encodeTopicMeta(name string, tm topicMeta) []byte {
	b := make([]byte, topicRecordSize)
	copy(b, topicMagic)
	b[4] = topicFormat
	b[5] = byte(tm.Type)
	binary.BigEndian.PutUint32(b[6:], uint32(tm.Partitions))
	var created int64
	if !tm.Created.IsZero() {
		created = tm.Created.UnixNano()
	}
	binary.BigEndian.PutUint64(b[10:], uint64(created))
	binary.BigEndian.PutUint32(b[18:], topicCRC(name, b[:18]))
	return b
}

func topicCRC(name string, body []byte) uint32 {
	return crc32.Update(crc32.Checksum([]byte(name), castagnoli), castagnoli, body)
}

// decodeTopicMeta decodes the record of topic name, in either layout, and
// reports whether it was the legacy one. Its errors describe the damage;
// the caller wraps them in ErrCorrupt.
func decodeTopicMeta(name string, b []byte) (tm topicMeta, legacy bool, err error) {
	switch {
	case len(b) >= 5 && string(b[:4]) == topicMagic:
		if b[4] > topicFormat {
			return topicMeta{}, false, fmt.Errorf("%w: record version %d, this node reads %d", errNewerFormat, b[4], topicFormat)
		}
		if b[4] != topicFormat {
			return topicMeta{}, false, fmt.Errorf("record version %d", b[4])
		}
		if len(b) != topicRecordSize {
			return topicMeta{}, false, fmt.Errorf("record of %d bytes, want %d", len(b), topicRecordSize)
		}
		if got, want := binary.BigEndian.Uint32(b[18:]), topicCRC(name, b[:18]); got != want {
			return topicMeta{}, false, fmt.Errorf("record checksum %08x, want %08x", got, want)
		}
		tm = topicMeta{Partitions: int(binary.BigEndian.Uint32(b[6:])), Type: Type(b[5])}
		if ns := int64(binary.BigEndian.Uint64(b[10:])); ns != 0 {
			tm.Created = time.Unix(0, ns)
		}
	case len(b) > 0 && len(b) <= 64 && (b[0]&0xf0 == 0x80 || b[0] == 0xde || b[0] == 0xdf):
		// A msgpack map (fixmap, map16, map32): the legacy record.
		var lm legacyTopicMeta
		if err := unmarshalLegacy(b, &lm); err != nil {
			return topicMeta{}, true, fmt.Errorf("legacy record: %v", err)
		}
		tm, legacy = topicMeta(lm), true
		// Open rewrites it in the current layout: Created as UnixNano, 0
		// for unknown.
		if c := tm.Created; !c.IsZero() {
			if c.Before(time.Unix(0, math.MinInt64)) || c.After(time.Unix(0, math.MaxInt64)) {
				return topicMeta{}, true, fmt.Errorf("legacy record: created %v, out of range", c)
			}
			if c.UnixNano() == 0 {
				tm.Created = time.Time{}
			}
		}
	default:
		return topicMeta{}, false, fmt.Errorf("record of %d bytes is neither the topic layout nor the legacy one", len(b))
	}
	if tm.Partitions < 1 || tm.Partitions > MaxPartitions {
		return topicMeta{}, legacy, fmt.Errorf("%d partitions (1..%d)", tm.Partitions, MaxPartitions)
	}
	switch tm.Type {
	case Single, DoubleWrite, Raft3:
	default:
		return topicMeta{}, legacy, fmt.Errorf("replication type %d", tm.Type)
	}
	return tm, legacy, nil
}

func (m *MQ) metaPath() string { return filepath.Join(m.dir, "meta.db") }

// openMeta opens meta.db through boltsafe, so that a damaged file is
// ErrCorrupt naming it rather than a panic.
func openMeta(dir string) (*bolt.DB, error) {
	db, err := boltsafe.Open(filepath.Join(dir, "meta.db"), &bolt.Options{Timeout: time.Second})
	if err != nil {
		return nil, fmt.Errorf("mq: open %s: %w", dir, metaError(err))
	}
	return db, nil
}

// rebuildHint ends the errors of a damaged meta.db with the way out.
const rebuildHint = "; remove meta.db to have Open rebuild it from the topic directories"

// metaError translates an error of meta.db, adding the way out to the
// damage boltsafe found.
func metaError(err error) error {
	if errors.Is(err, boltsafe.ErrCorrupt) {
		return fmt.Errorf("%w: %v%s", ErrCorrupt, err, rebuildHint)
	}
	return translate(err)
}

// load reads meta.db, reconciles it with the partition files found under
// topics/ (see the format's comment), writes meta.db only if that changed
// anything, logs what it rebuilt or adopted, and opens every partition.
func (m *MQ) load() error {
	onDisk, err := m.scanTopics()
	if err != nil {
		return fmt.Errorf("mq: load %s: %w", m.dir, err)
	}
	var (
		metas   map[string]topicMeta
		legacy  []string // records to rewrite in the current layout
		rebuilt bool     // meta.db had no buckets: it is new
	)
	err = boltsafe.View(m.meta, func(tx *bolt.Tx) error {
		var err error
		metas, legacy, rebuilt, err = m.readMeta(tx)
		return err
	})
	var adopted []string
	if err == nil {
		adopted, err = m.reconcile(metas, onDisk)
	}
	if err == nil && (rebuilt || len(legacy) > 0 || len(adopted) > 0) {
		err = boltsafe.Update(m.meta, func(tx *bolt.Tx) error {
			if rebuilt {
				nm, err := tx.CreateBucket(bucketNodeMeta)
				if err != nil {
					return err
				}
				if err := nm.Put(keyVersion, []byte(strconv.Itoa(nodeFormat))); err != nil {
					return err
				}
				if _, err := tx.CreateBucket(bucketTopics); err != nil {
					return err
				}
			}
			for _, name := range slices.Concat(legacy, adopted) {
				if err := putTopicMetaTx(tx, name, metas[name]); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err != nil {
		return fmt.Errorf("mq: load %s: %w", m.dir, metaError(err))
	}
	switch {
	case rebuilt:
		if len(metas) > 0 {
			m.cfg.logger.Warn("meta.db was missing or empty: topic table rebuilt from the topic directories, every topic Single",
				"file", m.metaPath(), "topics", len(metas))
		}
	case len(adopted) > 0:
		m.cfg.logger.Warn("topics or partitions found on disk but not in meta.db (a crash while creating them): adopted",
			"file", m.metaPath(), "topics", adopted)
	}
	if len(legacy) > 0 {
		m.cfg.logger.Info("topic records rewritten in the current layout", "file", m.metaPath(), "topics", len(legacy))
	}
	for _, name := range slices.Sorted(maps.Keys(metas)) {
		tm := metas[name]
		t := &topic{name: name, opts: Options{Type: tm.Type}, created: tm.Created}
		m.topics[name] = t
		for i := 0; i < tm.Partitions; i++ {
			p, err := m.openPartition(name, i)
			if err != nil {
				return err
			}
			t.parts = append(t.parts, p)
		}
	}
	return nil
}

// reconcile adds to metas the topics and partitions that have files but no
// record (every topic Single) and returns their names; a recorded
// partition without its file is ErrCorrupt.
func (m *MQ) reconcile(metas map[string]topicMeta, onDisk map[string]int) ([]string, error) {
	var changed []string
	for _, name := range slices.Sorted(maps.Keys(onDisk)) {
		n := onDisk[name]
		tm, ok := metas[name]
		switch {
		case !ok:
			tm = topicMeta{Partitions: n, Type: Single}
		case n > tm.Partitions:
			tm.Partitions = n
		default:
			continue
		}
		metas[name] = tm
		changed = append(changed, name)
	}
	for _, name := range slices.Sorted(maps.Keys(metas)) {
		if n, tm := onDisk[name], metas[name]; n < tm.Partitions {
			return nil, fmt.Errorf("%w: %s lists %d partitions of %q, but %s is missing",
				ErrCorrupt, m.metaPath(), tm.Partitions, name, m.partitionPath(name, n))
		}
	}
	return changed, nil
}

// readMeta checks meta.db's layout and reads its topic records, listing
// those in the legacy layout. A file without any bucket is new (bbolt has
// just created it, or it was empty): readMeta reports it as rebuilt, for
// the caller to give it its buckets. Anything else that is not the layout
// is ErrCorrupt.
func (m *MQ) readMeta(tx *bolt.Tx) (metas map[string]topicMeta, legacy []string, rebuilt bool, err error) {
	path := m.metaPath()
	corrupt := func(format string, args ...any) error {
		err := fmt.Errorf(format, args...)
		if errors.Is(err, errNewerFormat) {
			return fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
		}
		return fmt.Errorf("%w: %s: %v%s", ErrCorrupt, path, err, rebuildHint)
	}
	metas = map[string]topicMeta{}
	empty := true
	err = tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
		empty = false
		if string(name) != string(bucketNodeMeta) && string(name) != string(bucketTopics) {
			return corrupt("unknown bucket %q", name)
		}
		return nil
	})
	if err != nil {
		return nil, nil, false, err
	}
	if empty {
		return metas, nil, true, nil
	}
	nm, tb := tx.Bucket(bucketNodeMeta), tx.Bucket(bucketTopics)
	if nm == nil || tb == nil {
		return nil, nil, false, corrupt("bucket %q or %q missing", bucketNodeMeta, bucketTopics)
	}
	err = nm.ForEach(func(k, v []byte) error {
		switch {
		case string(k) != string(keyVersion):
			return corrupt("unknown key %q in bucket %q", k, bucketNodeMeta)
		case string(v) == strconv.Itoa(nodeFormat):
		case isNewer(v, nodeFormat):
			return corrupt("%w: node format %q, this node reads %d", errNewerFormat, v, nodeFormat)
		default:
			return corrupt("node format %q", v)
		}
		return nil
	})
	if err != nil {
		return nil, nil, false, err
	}
	if nm.Get(keyVersion) == nil {
		return nil, nil, false, corrupt("no node format")
	}
	err = tb.ForEach(func(k, v []byte) error {
		name := string(k)
		if v == nil || checkName(name, ErrInvalidTopic) != nil && !isSystemTopic(name) {
			return corrupt("bad topic entry %q", k)
		}
		tm, old, err := decodeTopicMeta(name, v)
		if err != nil {
			return corrupt("topic %q: %w", k, err)
		}
		metas[name] = tm
		if old {
			legacy = append(legacy, name)
		}
		return nil
	})
	return metas, legacy, false, err
}

// scanTopics lists the topics under topics/ that have partition files, with
// their partition counts, following symbolic links. A directory whose name
// no topic can have is skipped and logged, one without partition files
// skipped; a gap in the partition files is ErrCorrupt naming the missing
// one.
func (m *MQ) scanTopics() (map[string]int, error) {
	root := filepath.Join(m.dir, "topics")
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, e := range entries {
		name := e.Name()
		if !isKind(filepath.Join(root, name), e, fs.ModeDir) {
			continue
		}
		if checkName(name, ErrInvalidTopic) != nil && !isSystemTopic(name) {
			m.cfg.logger.Warn("not a topic directory, ignored", "dir", filepath.Join(root, name))
			continue
		}
		files, err := os.ReadDir(filepath.Join(root, name))
		if err != nil {
			return nil, err
		}
		have := map[int]bool{}
		n := 0
		for _, f := range files {
			if i, ok := partitionIndex(f.Name()); ok && isKind(filepath.Join(root, name, f.Name()), f, 0) {
				have[i] = true
				n = max(n, i+1)
			}
		}
		for i := 0; i < n; i++ {
			if !have[i] {
				return nil, fmt.Errorf("%w: topic %q has partition files up to %d, but %s is missing",
					ErrCorrupt, name, n-1, m.partitionPath(name, i))
			}
		}
		if n > 0 {
			out[name] = n
		}
	}
	return out, nil
}

// isNewer reports whether v is a decimal version above have.
func isNewer(v []byte, have int) bool {
	n, err := strconv.Atoi(string(v))
	return err == nil && n > have && strconv.Itoa(n) == string(v)
}

// isKind reports whether the entry e at path is a directory (kind
// fs.ModeDir) or a regular file (kind 0), following a symbolic link.
func isKind(path string, e fs.DirEntry, kind fs.FileMode) bool {
	t := e.Type()
	if t&fs.ModeSymlink != 0 {
		info, err := os.Stat(path)
		if err != nil {
			return false
		}
		t = info.Mode().Type()
	}
	return t == kind
}

// partitionIndex parses a partition file name, "<i>.db" with i in
// [0, MaxPartitions) written as partitionPath writes it.
func partitionIndex(file string) (int, bool) {
	s, ok := strings.CutSuffix(file, ".db")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(s)
	if err != nil || i < 0 || i >= MaxPartitions || strconv.Itoa(i) != s {
		return 0, false
	}
	return i, true
}

// putTopicMeta records topic name.
func (m *MQ) putTopicMeta(name string, tm topicMeta) error {
	err := boltsafe.Update(m.meta, func(tx *bolt.Tx) error { return putTopicMetaTx(tx, name, tm) })
	if err != nil {
		return fmt.Errorf("mq: record topic %s: %w", name, metaError(err))
	}
	return nil
}

func putTopicMetaTx(tx *bolt.Tx, name string, tm topicMeta) error {
	return tx.Bucket(bucketTopics).Put([]byte(name), encodeTopicMeta(name, tm))
}

// unmarshalLegacy decodes a msgpack record of the legacy format. The msgpack
// library panics on some malformed input (a nil where a time is expected):
// that is damage too.
func unmarshalLegacy(b []byte, v any) (err error) {
	// The library also trusts lengths: an array header claiming 2^32
	// elements makes it allocate them. Walk the bytes first.
	if rest, err := skipMsgpack(b, 0); err != nil {
		return err
	} else if len(rest) != 0 {
		return fmt.Errorf("%d bytes after the value", len(rest))
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("malformed msgpack: %v", r)
		}
	}()
	return msgpack.Unmarshal(b, v)
}

// skipMsgpack returns b after the msgpack value at its start, or an error if
// the value is cut short, nests deeper than 32, or claims more elements or
// bytes than b holds.
func skipMsgpack(b []byte, depth int) ([]byte, error) {
	errShort := errors.New("short msgpack value")
	if depth > 32 {
		return nil, errors.New("msgpack nested too deep")
	}
	if len(b) == 0 {
		return nil, errShort
	}
	c, b := b[0], b[1:]
	size := func(n int) (uint64, []byte, error) {
		if len(b) < n {
			return 0, nil, errShort
		}
		var v uint64
		for _, x := range b[:n] {
			v = v<<8 | uint64(x)
		}
		return v, b[n:], nil
	}
	var n uint64     // bytes to skip
	var elems uint64 // values to skip (arrays: n, maps: 2n)
	var err error
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		return b, nil
	case c&0xe0 == 0xa0:
		n = uint64(c & 0x1f)
	case c&0xf0 == 0x90:
		elems = uint64(c & 0x0f)
	case c&0xf0 == 0x80:
		elems = 2 * uint64(c&0x0f)
	case c == 0xcc || c == 0xd0:
		n = 1
	case c == 0xcd || c == 0xd1:
		n = 2
	case c == 0xca || c == 0xce || c == 0xd2:
		n = 4
	case c == 0xcb || c == 0xcf || c == 0xd3:
		n = 8
	case c == 0xd4 || c == 0xd5 || c == 0xd6 || c == 0xd7 || c == 0xd8: // fixext: type, then 1..16 bytes
		n = 1 + 1<<(c-0xd4)
	case c == 0xc4 || c == 0xd9:
		n, b, err = size(1)
	case c == 0xc5 || c == 0xda:
		n, b, err = size(2)
	case c == 0xc6 || c == 0xdb:
		n, b, err = size(4)
	case c == 0xc7 || c == 0xc8 || c == 0xc9: // ext 8/16/32: length, type, data
		n, b, err = size(1 << (c - 0xc7))
		n++
	case c == 0xdc:
		elems, b, err = size(2)
	case c == 0xdd:
		elems, b, err = size(4)
	case c == 0xde:
		elems, b, err = size(2)
		elems *= 2
	case c == 0xdf:
		elems, b, err = size(4)
		elems *= 2
	default:
		return nil, fmt.Errorf("msgpack code %#x", c)
	}
	if err != nil {
		return nil, err
	}
	if n > uint64(len(b)) || elems > uint64(len(b)) {
		return nil, errShort
	}
	b = b[n:]
	for range elems {
		if b, err = skipMsgpack(b, depth+1); err != nil {
			return nil, err
		}
	}
	return b, nil
}
