package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"time"

	"github.com/zeze-go/mq/internal/boltsafe"
	"github.com/zeze-go/mq/internal/metastate"
)

// The state cache, <Dir>/state: the last State this node applied, saved
// after each change, at most every cacheEvery. A node restarting without
// a metadata quorum has no State until a leader sends it the log; it shows
// the cached one meanwhile (fsm.state), so the data paths it had come back
// with it: its own partitions, the remote ones it reached, its consumers'
// assignments. The cache holds only committed entries: the FSM applies no
// other. Layout: cacheMagic, the CRC-32C of the rest in 4 bytes big-endian,
// then an encoded snapshot (EncodeSnapshot).
const (
	cacheMagic = "zeze-mq state cache 1\n"
	cacheEvery = 100 * time.Millisecond
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func cachePath(dir string) string { return filepath.Join(dir, "state") }

// encodeCache returns the cache file of s.
func encodeCache(s *metastate.State) ([]byte, error) {
	snap, err := metastate.EncodeSnapshot(s)
	if err != nil {
		return nil, err
	}
	b := append([]byte(cacheMagic), 0, 0, 0, 0)
	binary.BigEndian.PutUint32(b[len(cacheMagic):], crc32.Checksum(snap, castagnoli))
	return append(b, snap...), nil
}

// decodeCache returns the State of a cache file, or ErrCorrupt.
func decodeCache(b []byte) (*metastate.State, error) {
	n := len(cacheMagic) + 4
	if len(b) < n || string(b[:len(cacheMagic)]) != cacheMagic {
		return nil, fmt.Errorf("%w: not a state cache", metastate.ErrCorrupt)
	}
	if crc32.Checksum(b[n:], castagnoli) != binary.BigEndian.Uint32(b[len(cacheMagic):]) {
		return nil, fmt.Errorf("%w: state cache checksum", metastate.ErrCorrupt)
	}
	return metastate.DecodeSnapshot(b[n:])
}

// loadCache returns the cached State of dir, or nil when there is none or
// it cannot be used, which is logged: the node then waits for a leader to
// send it the log.
func (m *Meta) loadCache(dir string) *metastate.State {
	b, err := os.ReadFile(cachePath(dir))
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			m.log.Warn("cannot read the metadata state cache; ignored", "err", err)
		}
		return nil
	}
	s, err := decodeCache(b)
	if err != nil {
		m.log.Warn("metadata state cache damaged; ignored", "path", cachePath(dir), "err", err)
		return nil
	}
	return s
}

// cacheLoop saves the applied State whenever it changed, until Close,
// which saves it a last time once raft stopped.
func (m *Meta) cacheLoop() {
	if c := m.fsm.cached.Load(); c != nil {
		m.cacheSaved = c.Index()
	}
	for {
		st := m.fsm.cur.Load()
		m.saveCache()
		select {
		case <-m.ctx.Done():
			return
		case <-st.Changed():
		}
		select { // changes coming in a burst are saved once
		case <-m.ctx.Done():
			return
		case <-time.After(cacheEvery):
		}
	}
}

// saveCache saves the applied State if it is newer than the cache. Only
// cacheLoop calls it, and Close once that ended.
func (m *Meta) saveCache() {
	st := m.fsm.cur.Load()
	if st.Index() <= m.cacheSaved {
		return
	}
	b, err := encodeCache(st)
	if err == nil {
		err = boltsafe.ReplaceFile(cachePath(m.dir), b)
	}
	if err != nil {
		m.log.Warn("cannot save the metadata state cache", "err", err)
		return
	}
	m.cacheSaved = st.Index()
}
