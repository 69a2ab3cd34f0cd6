package mq_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq"
)

// boltPage is the page size of the meta.db files the tests make (bbolt's
// default on this OS).
const boltPage = 4096

// closedNode makes a node directory holding topics (name → partitions),
// with one message, metaBody, in each partition, and closes it.
func closedNode(t testing.TB, topics map[string]int) string {
	t.Helper()
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "fixture")
	m, err := mq.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range slices.Sorted(maps.Keys(topics)) {
		mustCreate(t, m, name, topics[name])
		p, err := m.NewProducer(name)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < topics[name]; i++ {
			if _, err := p.SendMessage(ctx, (&mq.Message{Body: []byte(metaBody(name, i))}).ToPartition(i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// metaFixture builds a closed node directory whose meta.db spans several
// pages: two short topics (one grown by AlterMQ) holding a message in each
// partition, a system topic, and enough long-named topics to need a branch
// page. It returns the directory and the topics with their partition
// counts.
func metaFixture(t testing.TB) (string, map[string]int) {
	t.Helper()
	ctx := context.Background()
	dir := closedNode(t, map[string]int{"orders": 2, "audit": 1})
	m, err := mq.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"orders": 3, "audit": 1, mq.DeadLetterTopic("ops"): 1}
	if err := m.AlterMQ(ctx, "orders", 3); err != nil {
		t.Fatal(err)
	}
	p, err := m.NewProducer("orders")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.SendMessage(ctx, (&mq.Message{Body: []byte(metaBody("orders", 2))}).ToPartition(2)); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 24; i++ {
		name := fmt.Sprintf("long-%02d-%s", i, strings.Repeat("x", 200))
		mustCreate(t, m, name, 1)
		want[name] = 1
	}
	c, err := m.NewConsumer(mq.DeadLetterTopic("ops"), "ops", mq.ListenerFunc(func(context.Context, string, *mq.Message) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	return dir, want
}

func metaBody(topic string, i int) string { return fmt.Sprintf("%s-%d", topic, i) }

// copyNode copies the node directory src to a new temporary directory.
func copyNode(t testing.TB, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "node")
	copyTree(t, src, dst)
	return dst
}

// openContained opens dir and turns a panic inside Open into an error the
// test can report, so one damaged file does not stop the other cases.
func openContained(dir string, opts ...mq.Option) (m *mq.MQ, err error, panicked error) {
	defer func() {
		if r := recover(); r != nil {
			panicked = fmt.Errorf("Open panicked: %v", r)
		}
	}()
	m, err = mq.Open(dir, opts...)
	return m, err, nil
}

// openRefused opens dir, which must fail without a panic, and returns the
// error.
func openRefused(t testing.TB, dir string) error {
	t.Helper()
	m, err, panicked := openContained(dir)
	if panicked != nil {
		t.Fatal(panicked)
	}
	if err == nil {
		m.Close()
		t.Fatal("Open succeeded")
	}
	return err
}

// checkMetaOutcome opens dir, whose meta.db was damaged (or removed), and
// checks that Open either refused it with ErrCorrupt naming meta.db or
// opened every topic with its partitions and messages. It returns Open's
// error.
func checkMetaOutcome(t testing.TB, dir string, want map[string]int, opts ...mq.Option) error {
	t.Helper()
	m, err, panicked := openContained(dir, opts...)
	if panicked != nil {
		t.Fatal(panicked)
	}
	if err != nil {
		if !errors.Is(err, mq.ErrCorrupt) || !strings.Contains(err.Error(), "meta.db") {
			t.Fatalf("Open = %v, want an error wrapping ErrCorrupt that names meta.db", err)
		}
		return err
	}
	defer func() {
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	if got := m.Topics(); !maps.Equal(got, want) {
		t.Fatalf("Open forgot or changed topics: %s", topicsDiff(got, want))
	}
	for _, topic := range []string{"orders", "audit"} {
		for i := 0; i < want[topic]; i++ {
			msg, err := m.ReadMessage(context.Background(), topic, i, 0)
			if err != nil {
				t.Fatalf("ReadMessage(%s/%d): %v", topic, i, err)
			}
			if string(msg.Body) != metaBody(topic, i) {
				t.Fatalf("ReadMessage(%s/%d) = %q, want %q", topic, i, msg.Body, metaBody(topic, i))
			}
		}
	}
	return nil
}

// topicsDiff describes how got differs from want, with long names cut.
func topicsDiff(got, want map[string]int) string {
	short := func(s string) string {
		if len(s) > 12 {
			return s[:12] + "…"
		}
		return s
	}
	var out []string
	for _, n := range slices.Sorted(maps.Keys(want)) {
		if g, ok := got[n]; !ok {
			out = append(out, "missing "+short(n))
		} else if g != want[n] {
			out = append(out, fmt.Sprintf("%s has %d partitions, want %d", short(n), g, want[n]))
		}
	}
	for _, n := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[n]; !ok {
			out = append(out, "unexpected "+short(n))
		}
	}
	if len(out) > 4 {
		out = append(out[:4], fmt.Sprintf("and %d more", len(out)-4))
	}
	return fmt.Sprintf("%d topics, want %d: %s", len(got), len(want), strings.Join(out, ", "))
}

// pageType names the type of a bbolt page from its header flags.
func pageType(page []byte) string {
	switch binary.LittleEndian.Uint16(page[8:]) {
	case 0x01:
		return "Branch"
	case 0x02:
		return "Leaf"
	case 0x04:
		return "Meta"
	case 0x10:
		return "Freelist"
	}
	return "Unknown"
}

// flip XORs data[from:to] with 0xff.
func flip(data []byte, from, to int) {
	for i := from; i < to && i < len(data); i++ {
		data[i] ^= 0xff
	}
}

// TestOpen_DamagedMeta damages the node's meta.db in the ways a disk or an
// operator might: Open never panics, and either refuses with ErrCorrupt
// naming meta.db or opens every topic.
func TestOpen_DamagedMeta(t *testing.T) {
	fixture, want := metaFixture(t)
	orig, err := os.ReadFile(filepath.Join(fixture, "meta.db"))
	if err != nil {
		t.Fatal(err)
	}
	if len(orig) < 6*boltPage {
		t.Fatalf("meta.db has %d bytes; the fixture wants a branch page and several leaves", len(orig))
	}

	const (
		corrupt = "ErrCorrupt"
		opened  = "Opened"
		either  = "Either"
	)
	type damage struct {
		name   string
		damage func(data []byte) []byte // nil result: remove the file
		want   string
	}
	tests := []damage{
		{"Missing", func([]byte) []byte { return nil }, opened},
		{"TruncateTo0", func([]byte) []byte { return []byte{} }, opened},
		{"TruncateTo1Page", func(d []byte) []byte { return d[:boltPage] }, corrupt},
		{"TruncateToHalf", func(d []byte) []byte { return d[:len(d)/2] }, corrupt},
		{"Garbage", func(d []byte) []byte {
			g := make([]byte, len(d))
			for i := range g {
				g[i] = byte(i*7 + i>>8)
			}
			return g
		}, corrupt},
		{"BothMetaPages", func(d []byte) []byte { flip(d, 16, 80); flip(d, boltPage+16, boltPage+80); return d }, corrupt},
		{"MetaPage0", func(d []byte) []byte { flip(d, 16, 80); return d }, either},
		{"MetaPage1", func(d []byte) []byte { flip(d, boltPage+16, boltPage+80); return d }, either},
	}
	// Every page in turn: its header, its first elements, and all of it
	// (with ZEZE_FULL=1; by default one of the three per page, in turn, so
	// that every page and every kind of damage is still tried).
	seen := map[string]bool{}
	for p := 2; p < len(orig)/boltPage; p++ {
		typ := pageType(orig[p*boltPage:])
		seen[typ] = true
		base := p * boltPage
		page := []damage{
			{fmt.Sprintf("Page%d%sHeader", p, typ), func(d []byte) []byte { flip(d, base+8, base+16); return d }, either},
			{fmt.Sprintf("Page%d%sElements", p, typ), func(d []byte) []byte { flip(d, base+16, base+48); return d }, either},
			{fmt.Sprintf("Page%d%sAll", p, typ), func(d []byte) []byte { flip(d, base, base+boltPage); return d }, either},
		}
		if !fullRun() {
			page = page[p%3 : p%3+1]
		}
		tests = append(tests, page...)
	}
	for _, typ := range []string{"Branch", "Leaf", "Freelist"} {
		if !seen[typ] {
			t.Fatalf("meta.db has no %s page; pages seen: %v", typ, seen)
		}
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := copyNode(t, fixture)
			path := filepath.Join(dir, "meta.db")
			if data := tt.damage(append([]byte(nil), orig...)); data == nil {
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
			} else if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			got := opened
			if err := checkMetaOutcome(t, dir, want); err != nil {
				got = corrupt
				t.Log(err)
			}
			if tt.want != either && got != tt.want {
				t.Fatalf("outcome %s, want %s", got, tt.want)
			}
		})
	}
}

// warnLog keeps the messages of the node's warning and error records.
type warnLog struct {
	mu   sync.Mutex
	msgs []string
}

func (l *warnLog) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelWarn }
func (l *warnLog) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, r.Message)
	return nil
}
func (l *warnLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *warnLog) WithGroup(string) slog.Handler      { return l }

func (l *warnLog) has(sub string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.msgs {
		if strings.Contains(m, sub) {
			return true
		}
	}
	return false
}

// editMeta changes the closed meta.db of dir through bbolt.
func editMeta(t testing.TB, dir string, fn func(tx *bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, "meta.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
}

// topicRecord returns the stored record of topic in the closed meta.db of
// dir.
func topicRecord(t testing.TB, dir, topic string) []byte {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, "meta.db"), 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var v []byte
	db.View(func(tx *bolt.Tx) error {
		v = bytes.Clone(tx.Bucket([]byte("topics")).Get([]byte(topic)))
		return nil
	})
	return v
}

// TestOpen_MetaRebuild: without meta.db, or with an empty one, Open rebuilds
// the topic table from the topic directories, says so in the log, and
// keeps every message; the rebuilt file then opens as any other.
func TestOpen_MetaRebuild(t *testing.T) {
	want := map[string]int{"orders": 3, "audit": 1}
	fixture := closedNode(t, want)
	for _, tt := range []struct {
		name   string
		damage func(path string) error
	}{
		{"Missing", os.Remove},
		{"Empty", func(path string) error { return os.Truncate(path, 0) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := copyNode(t, fixture)
			if err := tt.damage(filepath.Join(dir, "meta.db")); err != nil {
				t.Fatal(err)
			}
			// A stray file and a directory no topic can have are ignored.
			if err := os.WriteFile(filepath.Join(dir, "topics", "README"), []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(filepath.Join(dir, "topics", "not a topic"), 0o755); err != nil {
				t.Fatal(err)
			}
			logs := &warnLog{}
			m, err := mq.Open(dir, mq.WithLogger(slog.New(logs)))
			if err != nil {
				t.Fatal(err)
			}
			if got := m.Topics(); !maps.Equal(got, want) {
				t.Fatalf("rebuilt topics: %s", topicsDiff(got, want))
			}
			if !logs.has("rebuilt") {
				t.Errorf("no warning about the rebuild; logged %q", logs.msgs)
			}
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
			if checkMetaOutcome(t, dir, want) != nil {
				t.Fatal("the rebuilt meta.db does not open")
			}
		})
	}
}

// TestOpen_MetaAdopt: partition files that a valid meta.db does not list (a
// crash between CreateMQ or AlterMQ creating them and recording them) are
// adopted, with a warning; a listed partition whose file is gone, or a gap
// in the partition files, is ErrCorrupt naming the file.
func TestOpen_MetaAdopt(t *testing.T) {
	want := map[string]int{"orders": 3, "audit": 1}
	fixture := closedNode(t, want)
	t.Run("Topic", func(t *testing.T) {
		dir := copyNode(t, fixture)
		editMeta(t, dir, func(tx *bolt.Tx) error { return tx.Bucket([]byte("topics")).Delete([]byte("audit")) })
		logs := &warnLog{}
		m, err := mq.Open(dir, mq.WithLogger(slog.New(logs)))
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if got := m.Topics(); !maps.Equal(got, want) {
			t.Fatalf("topics: %s", topicsDiff(got, want))
		}
		if !logs.has("adopted") {
			t.Errorf("no warning about the adopted topic; logged %q", logs.msgs)
		}
	})
	t.Run("Partitions", func(t *testing.T) {
		// Record "orders" with one partition of its three: the record of
		// a 1-partition "orders" of another node.
		dir := copyNode(t, fixture)
		rec := topicRecord(t, closedNode(t, map[string]int{"orders": 1}), "orders")
		editMeta(t, dir, func(tx *bolt.Tx) error { return tx.Bucket([]byte("topics")).Put([]byte("orders"), rec) })
		if checkMetaOutcome(t, dir, want) != nil {
			t.Fatal("Open refused partition files it should adopt")
		}
	})
	t.Run("Symlinks", func(t *testing.T) {
		// Partition files and topic directories may live elsewhere.
		dir := copyNode(t, fixture)
		elsewhere := t.TempDir()
		for _, p := range []string{filepath.Join("orders", "1.db"), "audit"} {
			if err := os.Rename(filepath.Join(dir, "topics", p), filepath.Join(elsewhere, filepath.Base(p))); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join(elsewhere, filepath.Base(p)), filepath.Join(dir, "topics", p)); err != nil {
				t.Skip("no symbolic links here:", err)
			}
		}
		if err := os.Remove(filepath.Join(dir, "meta.db")); err != nil {
			t.Fatal(err)
		}
		if checkMetaOutcome(t, dir, want) != nil {
			t.Fatal("Open refused symbolic links")
		}
	})
	for _, tt := range []struct {
		name, file string
	}{
		{"MissingLast", "2.db"},
		{"MissingMiddle", "1.db"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := copyNode(t, fixture)
			path := filepath.Join(dir, "topics", "orders", tt.file)
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			err := openRefused(t, dir)
			if !errors.Is(err, mq.ErrCorrupt) || !strings.Contains(err.Error(), path) {
				t.Fatalf("Open = %v, want ErrCorrupt naming %s", err, path)
			}
		})
	}
}

// TestOpen_MetaLayout: a meta.db that bbolt reads but whose content is not
// the node's layout is refused with ErrCorrupt naming the file (and the
// topic, for a topic record); a version from a newer node is refused
// without advice to remove the file.
func TestOpen_MetaLayout(t *testing.T) {
	fixture := closedNode(t, map[string]int{"orders": 2})
	topics := func(tx *bolt.Tx) *bolt.Bucket { return tx.Bucket([]byte("topics")) }
	setRecord := func(edit func(rec []byte) []byte) func(*bolt.Tx) error {
		return func(tx *bolt.Tx) error {
			return topics(tx).Put([]byte("orders"), edit(bytes.Clone(topics(tx).Get([]byte("orders")))))
		}
	}
	tests := []struct {
		name  string
		edit  func(tx *bolt.Tx) error
		names string // also in the error
		newer bool
	}{
		{"UnknownBucket", func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("extra")); return err }, "extra", false},
		{"NoTopicsBucket", func(tx *bolt.Tx) error { return tx.DeleteBucket([]byte("topics")) }, "topics", false},
		{"NoVersion", func(tx *bolt.Tx) error { return tx.Bucket([]byte("meta")).Delete([]byte("version")) }, "node format", false},
		{"UnknownMetaKey", func(tx *bolt.Tx) error { return tx.Bucket([]byte("meta")).Put([]byte("vers1on"), []byte("1")) }, "vers1on", false},
		{"DamagedNodeFormat", func(tx *bolt.Tx) error { return tx.Bucket([]byte("meta")).Put([]byte("version"), []byte("q")) }, "node format", false},
		{"NewerNodeFormat", func(tx *bolt.Tx) error { return tx.Bucket([]byte("meta")).Put([]byte("version"), []byte("2")) }, "node format", true},
		{"NewerRecord", setRecord(func(r []byte) []byte { r[4] = 2; return r }), `"orders"`, true},
		{"RecordVersion0", setRecord(func(r []byte) []byte { r[4] = 0; return r }), `"orders"`, false},
		{"RecordChecksum", setRecord(func(r []byte) []byte { r[9] ^= 1; return r }), `"orders"`, false},
		{"ShortRecord", setRecord(func(r []byte) []byte { return r[:10] }), `"orders"`, false},
		{"GarbageRecord", setRecord(func([]byte) []byte { return []byte("hello") }), `"orders"`, false},
		{"LegacyGarbage", setRecord(func([]byte) []byte { return []byte{0x81, 0xa1, 'p', 0xc1} }), `"orders"`, false},
		{"RenamedTopic", func(tx *bolt.Tx) error {
			return topics(tx).Put([]byte("ordets"), topics(tx).Get([]byte("orders")))
		}, `"ordets"`, false},
		{"BadTopicName", func(tx *bolt.Tx) error {
			return topics(tx).Put([]byte("no/such"), topics(tx).Get([]byte("orders")))
		}, `"no/such"`, false},
		{"NestedBucket", func(tx *bolt.Tx) error { _, err := topics(tx).CreateBucket([]byte("sub")); return err }, `"sub"`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := copyNode(t, fixture)
			editMeta(t, dir, tt.edit)
			err := openRefused(t, dir)
			msg := err.Error()
			if !errors.Is(err, mq.ErrCorrupt) || !strings.Contains(msg, "meta.db") || !strings.Contains(msg, tt.names) {
				t.Fatalf("Open = %v, want ErrCorrupt naming meta.db and %s", err, tt.names)
			}
			if hint := strings.Contains(msg, "remove meta.db"); hint == tt.newer {
				t.Fatalf("Open = %v: advice to remove the file %v, want %v", err, hint, !tt.newer)
			}
		})
	}
}

// TestOpen_MetaLegacy: topic records of the earlier layout (msgpack maps)
// are read, keep their creation time, and are rewritten in the current
// layout.
func TestOpen_MetaLegacy(t *testing.T) {
	want := map[string]int{"orders": 3, "audit": 1}
	dir := closedNode(t, want)
	created := time.Date(2024, 5, 6, 7, 8, 9, 10, time.UTC)
	editMeta(t, dir, func(tx *bolt.Tx) error {
		for name, n := range want {
			// As the first versions of mq.go wrote them.
			v, err := msgpack.Marshal(struct {
				Partitions int       `msgpack:"p"`
				Type       mq.Type   `msgpack:"t"`
				Created    time.Time `msgpack:"c"`
			}{n, mq.Single, created})
			if err != nil {
				return err
			}
			if err := tx.Bucket([]byte("topics")).Put([]byte(name), v); err != nil {
				return err
			}
		}
		return nil
	})
	if checkMetaOutcome(t, dir, want) != nil {
		t.Fatal("Open refused legacy records")
	}
	for name, n := range want {
		rec := topicRecord(t, dir, name)
		if len(rec) != 22 || string(rec[:5]) != "MQTP\x01" || rec[5] != byte(mq.Single) || binary.BigEndian.Uint32(rec[6:]) != uint32(n) {
			t.Fatalf("record of %s after Open: %x, want the current layout", name, rec)
		}
		if got := int64(binary.BigEndian.Uint64(rec[10:])); got != created.UnixNano() {
			t.Fatalf("record of %s: created %v, want %v", name, time.Unix(0, got).UTC(), created)
		}
	}
}

// TestMQ_AlterMQKeepsCreated: CreateMQ records the creation time in the
// current layout and AlterMQ keeps it.
func TestMQ_AlterMQKeepsCreated(t *testing.T) {
	dir := t.TempDir()
	before := time.Now()
	m, err := mq.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, m, "orders", 1)
	after := time.Now()
	time.Sleep(10 * time.Millisecond)
	if err := m.AlterMQ(context.Background(), "orders", 4); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	rec := topicRecord(t, dir, "orders")
	if len(rec) != 22 || string(rec[:5]) != "MQTP\x01" || binary.BigEndian.Uint32(rec[6:]) != 4 {
		t.Fatalf("record %x, want the current layout with 4 partitions", rec)
	}
	got := time.Unix(0, int64(binary.BigEndian.Uint64(rec[10:])))
	if got.Before(before) || got.After(after) {
		t.Fatalf("created %v, want the CreateMQ call's time, in [%v, %v]", got, before, after)
	}
}

// TestOpen_MetaEveryByte damages a small node's meta.db: each byte that
// bbolt may read (each page up to its last non-zero byte; bbolt zeroes the
// rest) is inverted in turn, and one in 64 of the others. Open never
// panics, and either refuses with ErrCorrupt naming meta.db or opens every
// topic with its partitions and messages. The node runs without its
// write-ahead log, whose set-up would be most of the time, and which has
// nothing to do with meta.db. By default one byte in five of those is
// inverted (every one with ZEZE_FULL=1).
func TestOpen_MetaEveryByte(t *testing.T) {
	want := map[string]int{"orders": 2, "audit": 1}
	dir := closedNode(t, want)
	path := filepath.Join(dir, "meta.db")
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var opened, refused int
	stride := sized(5, 1)
	for i := range orig {
		if i%stride != 0 {
			continue
		}
		if i%64 != 0 && bytes.IndexFunc(orig[i:(i/boltPage+1)*boltPage], func(r rune) bool { return r != 0 }) < 0 {
			continue
		}
		d := bytes.Clone(orig)
		d[i] ^= 0xff
		if err := os.WriteFile(path, d, 0o600); err != nil {
			t.Fatal(err)
		}
		ok := t.Run(fmt.Sprintf("Byte%d", i), func(t *testing.T) {
			if checkMetaOutcome(t, dir, want, mq.WithSyncInterval(time.Hour)) == nil {
				opened++
			} else {
				refused++
			}
		})
		if !ok {
			t.Fatalf("byte %d (page %d, offset %d) ^ 0xff: see above", i, i/boltPage, i%boltPage)
		}
	}
	t.Logf("%d-byte meta.db, %d flips in %v: %d opened, %d refused", len(orig), opened+refused, time.Since(start), opened, refused)
}
