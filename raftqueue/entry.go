package raftqueue

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/zeze-go/mq/store"
)

// Entry layout (the Data of a raft LogCommand entry): 'Z' 'Q', entryVersion,
// then the number of commands (uvarint), then each command as a uvarint
// length followed by store.AppendCommand's encoding. The proposer packs the
// commands of many concurrent callers into one entry.
const (
	entryMagic0  = 'Z'
	entryMagic1  = 'Q'
	entryVersion = 1
)

// entryHeader starts an entry of n commands in dst.
func entryHeader(dst []byte, n int) []byte {
	dst = append(dst, entryMagic0, entryMagic1, entryVersion)
	return binary.AppendUvarint(dst, uint64(n))
}

// appendEntryCommand appends c, length-prefixed, to an entry.
func appendEntryCommand(dst []byte, c *store.Command) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, binary.MaxVarintLen64)...)
	body := len(dst)
	dst = store.AppendCommand(dst, c)
	var l [binary.MaxVarintLen64]byte
	n := binary.PutUvarint(l[:], uint64(len(dst)-body))
	copy(dst[start:], l[:n])
	return append(dst[:start+n], dst[body:]...)
}

var errEntry = errors.New("malformed entry")

// decodeEntry decodes an entry's commands, appending them to cmds. The
// commands' message bodies point into b. A malformed entry is an error
// wrapping store.ErrBadCommand: every replica decodes the same bytes, so
// every replica answers it the same way.
func decodeEntry(b []byte, cmds []*store.Command) ([]*store.Command, error) {
	if len(b) < 3 || b[0] != entryMagic0 || b[1] != entryMagic1 {
		return cmds, fmt.Errorf("%w: %w: bad magic", store.ErrBadCommand, errEntry)
	}
	if b[2] != entryVersion {
		return cmds, fmt.Errorf("%w: %w: version %d, want %d", store.ErrBadCommand, errEntry, b[2], entryVersion)
	}
	b = b[3:]
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return cmds, fmt.Errorf("%w: %w: command count", store.ErrBadCommand, errEntry)
	}
	b = b[k:]
	for range n {
		l, k := binary.Uvarint(b)
		if k <= 0 || l > uint64(len(b)-k) {
			return cmds, fmt.Errorf("%w: %w: command length", store.ErrBadCommand, errEntry)
		}
		c, err := store.DecodeCommand(b[k : k+int(l) : k+int(l)])
		if err != nil {
			return cmds, err
		}
		cmds = append(cmds, c)
		b = b[k+int(l):]
	}
	if len(b) != 0 {
		return cmds, fmt.Errorf("%w: %w: %d bytes after the commands", store.ErrBadCommand, errEntry, len(b))
	}
	return cmds, nil
}
