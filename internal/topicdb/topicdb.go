// Package topicdb keeps a node's topic table: which topics exist, with their
// partition count, replication type and creation time, in <dir>/meta.db,
// reconciled with the partition files under <dir>/topics. It also holds the
// naming rules of topics and groups and where a partition's file lives.
package topicdb

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"log/slog"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq/internal/boltsafe"
	"github.com/zeze-go/mq/internal/metastate"
	"github.com/zeze-go/mq/internal/wire"
)

// ErrCorrupt marks a damaged meta.db, a partition file it lists that is
// gone, a gap in a topic's partition files, or a file written by a newer
// version.
var ErrCorrupt = errors.New("meta: corrupt")

// MaxPartitions is the largest partition count of a topic.
const MaxPartitions = 1024

// The replication types a topic record may hold: the root's Type values.
const (
	typeSingle      = 1
	typeDoubleWrite = 2
	typeRaft3       = 4
)

// System topics: a group's retry and dead-letter topics are named by these
// prefixes followed by the group (metastate.SystemGroup reads them back).
const (
	RetryPrefix      = metastate.RetryPrefix
	DeadLetterPrefix = metastate.DeadLetterPrefix
)

// MaxGroupLen is the longest group name: the group's retry topic, named
// by the longer prefix and the group, must be a valid topic name too.
const MaxGroupLen = 255 - len(RetryPrefix)

// CheckGroup applies the rules of group names: those of topic names, and
// at most MaxGroupLen bytes.
func CheckGroup(name string) error {
	if len(name) > MaxGroupLen {
		return fmt.Errorf("%.20q…: length %d (1..%d: its retry topic's name is %d bytes longer)", name, len(name), MaxGroupLen, len(RetryPrefix))
	}
	return CheckName(name)
}

// CheckName applies the rules of topic and group names: 1 to 255 bytes of
// letters, digits, '.', '_' and '-', not "." or "..", not starting with '%',
// which is reserved for system topics.
func CheckName(name string) error {
	if name == "" || len(name) > 255 {
		return fmt.Errorf("%q: length %d (1..255)", name, len(name))
	}
	if name[0] == '%' {
		return fmt.Errorf("%q: names starting with %% are reserved", name)
	}
	if name == "." || name == ".." {
		return fmt.Errorf("%q", name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%q: character %q", name, c)
		}
	}
	return nil
}

// IsSystemTopic reports whether name is a retry or dead-letter topic name of
// a valid group (CheckGroup: at most 255 bytes with its prefix).
func IsSystemTopic(name string) bool {
	for _, p := range []string{RetryPrefix, DeadLetterPrefix} {
		if g, ok := strings.CutPrefix(name, p); ok {
			return CheckGroup(g) == nil
		}
	}
	return false
}

// validTopic reports whether a topic may have this name on disk.
func validTopic(name string) bool { return CheckName(name) == nil || IsSystemTopic(name) }

// PartitionPath is where partition i of topic lives under the node's dir.
func PartitionPath(dir, topic string, i int) string {
	return filepath.Join(dir, "topics", topic, strconv.Itoa(i)+".db")
}

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
// therefore rebuilds a missing or empty meta.db from the topic directories,
// every topic as Single, the only type of a standalone node; adopts a topic
// or partition whose files exist but which meta.db lacks, after a crash
// between creating the files and recording them; and refuses, with
// ErrCorrupt, a meta.db that is damaged, lists a partition whose file is
// gone, or that it cannot read. A damaged meta.db is never rebuilt over:
// remove it and Open rebuilds it.
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
// Records of the first layout, legacyTopic, are msgpack maps
// {"p": partitions, "t": type, "c": created}; Open reads them and rewrites
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

// Topic is the stored description of a topic.
type Topic struct {
	Partitions int
	Type       uint8     // the replication type: 1 Single, 2 DoubleWrite, 4 Raft3
	Created    time.Time // zero when unknown: the topic was rebuilt or adopted from its files
}

// legacyTopic is the topic record of meta.db files written before the
// explicit layout: a msgpack map keyed by these tags.
type legacyTopic struct {
	Partitions int       `msgpack:"p"`
	Type       uint8     `msgpack:"t"`
	Created    time.Time `msgpack:"c"`
}

// encodeTopic returns the record of topic name.
func encodeTopic(name string, tm Topic) []byte {
	b := make([]byte, topicRecordSize)
	copy(b, topicMagic)
	b[4] = topicFormat
	b[5] = tm.Type
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

// decodeTopic decodes the record of topic name, in either layout, and
// reports whether it was the legacy one. Its errors describe the damage;
// the caller wraps them in ErrCorrupt.
func decodeTopic(name string, b []byte) (tm Topic, legacy bool, err error) {
	switch {
	case len(b) >= 5 && string(b[:4]) == topicMagic:
		if b[4] > topicFormat {
			return Topic{}, false, fmt.Errorf("%w: record version %d, this node reads %d", errNewerFormat, b[4], topicFormat)
		}
		if b[4] != topicFormat {
			return Topic{}, false, fmt.Errorf("record version %d", b[4])
		}
		if len(b) != topicRecordSize {
			return Topic{}, false, fmt.Errorf("record of %d bytes, want %d", len(b), topicRecordSize)
		}
		if got, want := binary.BigEndian.Uint32(b[18:]), topicCRC(name, b[:18]); got != want {
			return Topic{}, false, fmt.Errorf("record checksum %08x, want %08x", got, want)
		}
		tm = Topic{Partitions: int(binary.BigEndian.Uint32(b[6:])), Type: b[5]}
		if ns := int64(binary.BigEndian.Uint64(b[10:])); ns != 0 {
			tm.Created = time.Unix(0, ns)
		}
	case len(b) > 0 && len(b) <= 64 && (b[0]&0xf0 == 0x80 || b[0] == 0xde || b[0] == 0xdf):
		// A msgpack map, fixmap, map16 or map32: the legacy record.
		var lm legacyTopic
		if err := wire.Unmarshal(b, &lm); err != nil {
			return Topic{}, true, fmt.Errorf("legacy record: %v", err)
		}
		tm, legacy = Topic(lm), true
		// Open rewrites it in the current layout: Created as UnixNano, 0
		// for unknown.
		if c := tm.Created; !c.IsZero() {
			if c.Before(time.Unix(0, math.MinInt64)) || c.After(time.Unix(0, math.MaxInt64)) {
				return Topic{}, true, fmt.Errorf("legacy record: created %v, out of range", c)
			}
			if c.UnixNano() == 0 {
				tm.Created = time.Time{}
			}
		}
	default:
		return Topic{}, false, fmt.Errorf("record of %d bytes is neither the topic layout nor the legacy one", len(b))
	}
	if tm.Partitions < 1 || tm.Partitions > MaxPartitions {
		return Topic{}, legacy, fmt.Errorf("%d partitions (1..%d)", tm.Partitions, MaxPartitions)
	}
	switch tm.Type {
	case typeSingle, typeDoubleWrite, typeRaft3:
	default:
		return Topic{}, legacy, fmt.Errorf("replication type %d", tm.Type)
	}
	return tm, legacy, nil
}

// Store is the open meta.db of one node. Its methods are not safe for
// concurrent use: the node serializes changes to its topic table.
type Store struct {
	dir  string
	path string
	db   *bolt.DB
	log  *slog.Logger
}

// Open opens dir/meta.db through boltsafe, so that a damaged file is
// ErrCorrupt naming it rather than a panic.
func Open(dir string, log *slog.Logger) (*Store, error) {
	path := filepath.Join(dir, "meta.db")
	db, err := boltsafe.Open(path, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dir, metaError(err))
	}
	return &Store{dir: dir, path: path, db: db, log: log}, nil
}

// Close closes meta.db.
func (s *Store) Close() error { return s.db.Close() }

// rebuildHint ends the errors of a damaged meta.db with the way out.
const rebuildHint = "; remove meta.db to have Open rebuild it from the topic directories"

// metaError adds the way out to the damage boltsafe found.
func metaError(err error) error {
	if errors.Is(err, boltsafe.ErrCorrupt) {
		return fmt.Errorf("%w: %w%s", ErrCorrupt, err, rebuildHint)
	}
	return err
}

// Load reads meta.db, reconciles it with the partition files found under
// topics/, as the format's comment says, writes meta.db only if that changed
// anything, logs what it rebuilt or adopted, and returns the topic table.
func (s *Store) Load() (map[string]Topic, error) {
	onDisk, err := s.scanTopics()
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", s.dir, err)
	}
	var (
		metas   map[string]Topic
		legacy  []string // records to rewrite in the current layout
		rebuilt bool     // meta.db had no buckets: it is new
	)
	err = boltsafe.View(s.db, func(tx *bolt.Tx) error {
		var err error
		metas, legacy, rebuilt, err = s.read(tx)
		return err
	})
	var adopted []string
	if err == nil {
		adopted, err = s.reconcile(metas, onDisk)
	}
	if err == nil && (rebuilt || len(legacy) > 0 || len(adopted) > 0) {
		err = boltsafe.Update(s.db, func(tx *bolt.Tx) error {
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
				if err := putTx(tx, name, metas[name]); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", s.dir, metaError(err))
	}
	switch {
	case rebuilt:
		if len(metas) > 0 {
			s.log.Warn("meta.db was missing or empty: topic table rebuilt from the topic directories, every topic Single",
				"file", s.path, "topics", len(metas))
		}
	case len(adopted) > 0:
		s.log.Warn("topics or partitions found on disk but not in meta.db (a crash while creating them): adopted",
			"file", s.path, "topics", adopted)
	}
	if len(legacy) > 0 {
		s.log.Info("topic records rewritten in the current layout", "file", s.path, "topics", len(legacy))
	}
	return metas, nil
}

// reconcile adds to metas the topics and partitions that have files but no
// record, each topic as Single, and returns their names; a recorded
// partition without its file is ErrCorrupt.
func (s *Store) reconcile(metas map[string]Topic, onDisk map[string]int) ([]string, error) {
	var changed []string
	for _, name := range slices.Sorted(maps.Keys(onDisk)) {
		n := onDisk[name]
		tm, ok := metas[name]
		switch {
		case !ok:
			tm = Topic{Partitions: n, Type: typeSingle}
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
				ErrCorrupt, s.path, tm.Partitions, name, PartitionPath(s.dir, name, n))
		}
	}
	return changed, nil
}

// read checks meta.db's layout and reads its topic records, listing those in
// the legacy layout. A file without any bucket is new, as bbolt has just
// created it or it was empty: read reports it as rebuilt, for the caller
// to give it its buckets. Anything else that is not the layout is
// ErrCorrupt.
func (s *Store) read(tx *bolt.Tx) (metas map[string]Topic, legacy []string, rebuilt bool, err error) {
	corrupt := func(format string, args ...any) error {
		err := fmt.Errorf(format, args...)
		if errors.Is(err, errNewerFormat) {
			return fmt.Errorf("%w: %s: %v", ErrCorrupt, s.path, err)
		}
		return fmt.Errorf("%w: %s: %v%s", ErrCorrupt, s.path, err, rebuildHint)
	}
	metas = map[string]Topic{}
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
		if v == nil || !validTopic(name) {
			return corrupt("bad topic entry %q", k)
		}
		tm, old, err := decodeTopic(name, v)
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
func (s *Store) scanTopics() (map[string]int, error) {
	root := filepath.Join(s.dir, "topics")
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
		if !validTopic(name) {
			s.log.Warn("not a topic directory, ignored", "dir", filepath.Join(root, name))
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
					ErrCorrupt, name, n-1, PartitionPath(s.dir, name, i))
			}
		}
		if n > 0 {
			out[name] = n
		}
	}
	return out, nil
}

// Put records topic name.
func (s *Store) Put(name string, tm Topic) error {
	err := boltsafe.Update(s.db, func(tx *bolt.Tx) error { return putTx(tx, name, tm) })
	if err != nil {
		return fmt.Errorf("record topic %s: %w", name, metaError(err))
	}
	return nil
}

func putTx(tx *bolt.Tx, name string, tm Topic) error {
	return tx.Bucket(bucketTopics).Put([]byte(name), encodeTopic(name, tm))
}

// isNewer reports whether v is a decimal version above have.
func isNewer(v []byte, have int) bool {
	n, err := strconv.Atoi(string(v))
	return err == nil && n > have && strconv.Itoa(n) == string(v)
}

// isKind reports whether the entry e at path is a directory, for kind
// fs.ModeDir, or a regular file, for kind 0, following a symbolic link.
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
