package store

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/zeze-go/mq/internal/boltsafe"
)

// Snapshot format: the partition's live state, key by key, so that its size
// is what the state holds; a trimmed head and the free pages of a file that
// once held more are not in it:
//
//	magic   "ZQS\x02"
//	position uvarint index, uvarint cmds: the position the state holds
//	frames  'B' uvarint length + name: the root bucket the next keys go to
//	        'K' uvarint length + key, uvarint length + value
//	end     'E' then the CRC-32C (Castagnoli) of every byte after the magic
//	        up to and including 'E', 4 bytes BE
//
// The copy is a bbolt read transaction's, so it is consistent and holds its
// own position, meta position, which may be past the one asked for.
const (
	snapMagic     = "ZQS\x02"
	snapBucket    = 'B'
	snapKey       = 'K'
	snapEnd       = 'E'
	snapFillRatio = 0.95 // keys arrive in order: fill the pages
)

// snapTxBytes: a restore commits every so many bytes, to bound its memory.
var snapTxBytes = 32 << 20

// snapTxCommitted, which only tests set, is called with the path after each
// of a restore's transactions but the last.
var snapTxCommitted func(path string)

// WriteSnapshot waits, as Sync does, until the file holds every command
// applied so far, then writes the partition's state to w in the format
// above and returns the position it holds: it may hold commands applied
// meanwhile. RestoreSnapshot makes a partition file of it.
func (p *Partition) WriteSnapshot(w io.Writer) (Position, error) {
	if err := p.barrier(); err != nil {
		return Position{}, err
	}
	var pos Position
	err := p.view(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketMeta).Get(metaPosition); v != nil {
			var err error
			if pos, err = decodePosition(v); err != nil {
				return err
			}
		}
		sw := snapWriter{w: bufio.NewWriterSize(w, 1<<16), crc: crc32.New(castagnoli)}
		if _, err := sw.w.WriteString(snapMagic); err != nil {
			return err
		}
		sw.write(binary.AppendUvarint(binary.AppendUvarint(nil, pos.Index), pos.Cmds))
		err := tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			sw.frame(snapBucket, name, nil)
			return b.ForEach(func(k, v []byte) error {
				if v == nil {
					return fmt.Errorf("%w: nested bucket %q in %q", ErrCorrupt, k, name)
				}
				sw.frame(snapKey, k, v)
				return sw.err
			})
		})
		if err != nil {
			return err
		}
		sw.end()
		if sw.err != nil {
			return sw.err
		}
		return sw.w.Flush()
	})
	return pos, err
}

type snapWriter struct {
	w   *bufio.Writer
	crc hash.Hash32
	buf []byte
	err error
}

// frame writes a frame of kind with a, and with b for a key.
func (s *snapWriter) frame(kind byte, a, b []byte) {
	s.buf = append(s.buf[:0], kind)
	s.buf = binary.AppendUvarint(s.buf, uint64(len(a)))
	if kind == snapKey {
		s.write(s.buf)
		s.write(a)
		s.buf = binary.AppendUvarint(s.buf[:0], uint64(len(b)))
		s.write(s.buf)
		s.write(b)
		return
	}
	s.write(s.buf)
	s.write(a)
}

func (s *snapWriter) write(b []byte) {
	if s.err != nil {
		return
	}
	s.crc.Write(b)
	_, s.err = s.w.Write(b)
}

func (s *snapWriter) end() {
	s.write([]byte{snapEnd})
	if s.err == nil {
		_, s.err = s.w.Write(binary.BigEndian.AppendUint32(nil, s.crc.Sum32()))
	}
}

// RestoreSnapshot makes the partition file path, which must not exist, from
// a snapshot written by WriteSnapshot: NewSnapshotReader, then RestoreTo.
func RestoreSnapshot(path string, r io.Reader) error {
	s, err := NewSnapshotReader(r)
	if err != nil {
		return err
	}
	return s.RestoreTo(path)
}

// SnapshotReader reads one snapshot written by WriteSnapshot: its position
// first, then RestoreTo or Skip reads the rest and checks its checksum. It
// reads ahead of the snapshot's end unless r is a *bufio.Reader of at least
// 64 KiB: snapshots that follow one another in a stream need one.
type SnapshotReader struct {
	sr  snapReader
	pos Position
}

// NewSnapshotReader reads a snapshot's magic and position. A damaged or cut
// snapshot is an error wrapping ErrCorrupt; the reader's own failures come
// back as they are.
func NewSnapshotReader(r io.Reader) (*SnapshotReader, error) {
	s := &SnapshotReader{sr: snapReader{r: bufio.NewReaderSize(r, 1<<16), crc: crc32.New(castagnoli)}}
	var magic [len(snapMagic)]byte
	if _, err := io.ReadFull(s.sr.r, magic[:]); err != nil {
		return nil, snapShort(err)
	}
	if string(magic[:]) != snapMagic {
		return nil, fmt.Errorf("%w: snapshot magic %q", ErrCorrupt, magic[:])
	}
	var err error
	if s.pos.Index, err = s.sr.uvarint(); err != nil {
		return nil, err
	}
	if s.pos.Cmds, err = s.sr.uvarint(); err != nil {
		return nil, err
	}
	return s, nil
}

// Position returns the position the snapshot's state holds. The checksum
// that vouches for it is checked at the end, by RestoreTo or Skip.
func (s *SnapshotReader) Position() Position { return s.pos }

// Skip reads the rest of the snapshot and checks it.
func (s *SnapshotReader) Skip() error {
	return s.read(func([]byte) error { return nil }, func(k, v []byte) error { return nil })
}

// RestoreTo makes the partition file path, which must not exist, from the
// rest of the snapshot, and syncs it. A snapshot that is damaged or cut
// short is an error wrapping ErrCorrupt, and removes what it wrote; so does
// any other failure. Memory stays bounded whatever the snapshot's size: it
// is written in transactions of about snapTxBytes.
func (s *SnapshotReader) RestoreTo(path string) (err error) {
	if _, err := os.Lstat(path); err == nil {
		return fmt.Errorf("store: restore: %s exists", path)
	}
	db, err := openBolt(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := db.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			_ = os.Remove(path)
		}
	}()
	tx, err := db.Begin(true)
	if err != nil {
		return err
	}
	defer func() {
		if tx != nil {
			_ = tx.Rollback()
		}
	}()
	var (
		name    []byte // the current bucket's
		b       *bolt.Bucket
		pending int
	)
	bucket := func(n []byte) (err error) {
		name = n
		if b, err = tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("%w: snapshot bucket %q: %v", ErrCorrupt, name, err)
		}
		b.FillPercent = snapFillRatio
		return nil
	}
	put := func(k, v []byte) error {
		if b == nil {
			return fmt.Errorf("%w: snapshot key before any bucket", ErrCorrupt)
		}
		if err := b.Put(k, v); err != nil {
			return fmt.Errorf("%w: snapshot key %q of %q: %v", ErrCorrupt, k, name, err)
		}
		if pending += len(k) + len(v); pending < snapTxBytes {
			return nil
		}
		err := tx.Commit()
		tx = nil
		if err != nil {
			return err
		}
		if snapTxCommitted != nil {
			snapTxCommitted(path)
		}
		if tx, err = db.Begin(true); err != nil {
			tx = nil
			return err
		}
		b = tx.Bucket(name)
		b.FillPercent = snapFillRatio
		pending = 0
		return nil
	}
	if err := s.read(bucket, put); err != nil {
		return err
	}
	err = tx.Commit() // bbolt syncs the file
	tx = nil
	return err
}

// read reads the frames up to the end and checks the checksum, calling
// bucket and key with each; their slices are theirs to keep.
func (s *SnapshotReader) read(bucket func(name []byte) error, key func(k, v []byte) error) error {
	sr := &s.sr
	for {
		kind, err := sr.byte()
		if err != nil {
			return err
		}
		switch kind {
		case snapBucket:
			name, err := sr.bytes(bolt.MaxKeySize)
			if err != nil {
				return err
			}
			if err := bucket(name); err != nil {
				return err
			}
		case snapKey:
			k, err := sr.bytes(bolt.MaxKeySize)
			if err != nil {
				return err
			}
			v, err := sr.bytes(MaxCommandBytes)
			if err != nil {
				return err
			}
			if err := key(k, v); err != nil {
				return err
			}
		case snapEnd:
			want := sr.crc.Sum32()
			var sum [4]byte
			if _, err := io.ReadFull(sr.r, sum[:]); err != nil {
				return snapShort(err)
			}
			if got := binary.BigEndian.Uint32(sum[:]); got != want {
				return fmt.Errorf("%w: snapshot checksum %08x, computed %08x", ErrCorrupt, got, want)
			}
			return nil
		default:
			return fmt.Errorf("%w: snapshot frame %q", ErrCorrupt, kind)
		}
	}
}

type snapReader struct {
	r       *bufio.Reader
	crc     hash.Hash32
	buf     bytes.Buffer
	readErr error // the reader's, as byte returned it
}

func (s *snapReader) byte() (byte, error) {
	c, err := s.r.ReadByte()
	if err != nil {
		s.readErr = snapShort(err)
		return 0, s.readErr
	}
	s.crc.Write([]byte{c})
	return c, nil
}

// uvarint reads a uvarint.
func (s *snapReader) uvarint() (uint64, error) {
	n, err := binary.ReadUvarint(byteCounter{s})
	if err != nil {
		if s.readErr != nil {
			return 0, s.readErr
		}
		return 0, fmt.Errorf("%w: snapshot: %v", ErrCorrupt, err)
	}
	return n, nil
}

// bytes reads a uvarint length of at most limit and that many bytes, into a
// new slice, since bbolt keeps what Put is given until the transaction
// ends. The buffer grows as the bytes arrive, so a damaged length allocates
// no more than the snapshot holds.
func (s *snapReader) bytes(limit int) ([]byte, error) {
	n, err := s.uvarint()
	if err != nil {
		return nil, err
	}
	if n > uint64(limit) {
		return nil, fmt.Errorf("%w: snapshot length %d over %d", ErrCorrupt, n, limit)
	}
	s.buf.Reset()
	if _, err := io.CopyN(&s.buf, s.r, int64(n)); err != nil {
		return nil, snapShort(err)
	}
	s.crc.Write(s.buf.Bytes())
	return bytes.Clone(s.buf.Bytes()), nil
}

// byteCounter feeds a length's bytes to the checksum as they are read.
type byteCounter struct{ s *snapReader }

func (c byteCounter) ReadByte() (byte, error) { return c.s.byte() }

func snapShort(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: snapshot cut short", ErrCorrupt)
	}
	return err
}

// FrozenAt returns the freeze token (OpFreeze) of the closed partition
// file at path, 0 when it is not frozen, reading the file only: what a WAL
// holds for it is not in it until the partition is opened. A damaged file
// is ErrCorrupt (boltsafe contains bbolt's panics).
func FrozenAt(path string) (uint64, error) {
	db, err := boltsafe.Open(path, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		if errors.Is(err, boltsafe.ErrCorrupt) {
			return 0, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
		}
		return 0, err
	}
	defer db.Close()
	var st state
	err = boltsafe.View(db, func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			return fmt.Errorf("%w: %s has no meta bucket", ErrCorrupt, path)
		}
		v := meta.Get(metaState)
		if v == nil {
			return nil
		}
		return decodeState(v, &st)
	})
	return st.Frozen, err
}
