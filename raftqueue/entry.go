package raftqueue

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/zeze-go/mq/store"
)

// Entry layout, the Data of a raft LogCommand entry: 'Z' 'Q', the version,
// in version 2 the number of partitions of the group as a uvarint, then the
// number of commands as a uvarint, then each command: in version 2 the
// index of its partition in the group as a uvarint, then in both a uvarint
// length followed by store.AppendCommand's encoding. A group of one
// partition writes version 1. A replica configured with another number of
// partitions fails rather than apply less. The proposer packs the commands
// of many concurrent callers into one entry.
const (
	entryMagic0 = 'Z'
	entryMagic1 = 'Q'
	entryOne    = 1 // commands of partition 0 only
	entryMany   = 2 // each command names its partition
)

// entryHeader starts an entry of n commands for a group of nparts
// partitions in dst.
func entryHeader(dst []byte, version byte, nparts, n int) []byte {
	dst = append(dst, entryMagic0, entryMagic1, version)
	if version == entryMany {
		dst = binary.AppendUvarint(dst, uint64(nparts))
	}
	return binary.AppendUvarint(dst, uint64(n))
}

// appendEntryCommand appends c, of partition part, to an entry of version.
func appendEntryCommand(dst []byte, version byte, part int, c *store.Command) []byte {
	if version == entryMany {
		dst = binary.AppendUvarint(dst, uint64(part))
	}
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

// errPartitions is an entry of a group whose number of partitions is not
// this replica's: its configuration is wrong, and it must not apply a part
// of what the others apply.
var errPartitions = errors.New("raftqueue: the group's entries name another number of partitions than this replica's")

// errUndecodable answers a command of an entry that does not decode: the
// entry's other commands are applied.
var errUndecodable = fmt.Errorf("%w: %w: a command does not decode", store.ErrBadCommand, errEntry)

// decodeEntry decodes an entry's commands, appending them to cmds and
// their partitions to parts; a partition is below nparts. The commands'
// message bodies point into b. A command that does not decode is appended
// as nil, and errUndecodable answers it. A malformed entry is an error
// wrapping store.ErrBadCommand: every replica decodes the same bytes, so
// every replica answers it the same way; an entry of a group of another
// number of partitions is errPartitions.
func decodeEntry(b []byte, nparts int, cmds []*store.Command, parts []int) ([]*store.Command, []int, error) {
	if len(b) < 3 || b[0] != entryMagic0 || b[1] != entryMagic1 {
		return cmds, parts, fmt.Errorf("%w: %w: bad magic", store.ErrBadCommand, errEntry)
	}
	version := b[2]
	if version != entryOne && version != entryMany {
		return cmds, parts, fmt.Errorf("%w: %w: version %d, want %d or %d", store.ErrBadCommand, errEntry, version, entryOne, entryMany)
	}
	b = b[3:]
	if version == entryMany {
		np, k := binary.Uvarint(b)
		if k <= 0 {
			return cmds, parts, fmt.Errorf("%w: %w: partition count", store.ErrBadCommand, errEntry)
		}
		if np != uint64(nparts) {
			return cmds, parts, fmt.Errorf("%w: %d in the entry, %d here", errPartitions, np, nparts)
		}
		b = b[k:]
	}
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return cmds, parts, fmt.Errorf("%w: %w: command count", store.ErrBadCommand, errEntry)
	}
	b = b[k:]
	for range n {
		part := uint64(0)
		if version == entryMany {
			if part, k = binary.Uvarint(b); k <= 0 || part >= uint64(nparts) {
				return cmds, parts, fmt.Errorf("%w: %w: partition of a command (the group has %d)", store.ErrBadCommand, errEntry, nparts)
			}
			b = b[k:]
		}
		l, k := binary.Uvarint(b)
		if k <= 0 || l > uint64(len(b)-k) {
			return cmds, parts, fmt.Errorf("%w: %w: command length", store.ErrBadCommand, errEntry)
		}
		c, err := store.DecodeCommand(b[k : k+int(l) : k+int(l)])
		if err != nil {
			c = nil // the command's own error: the entry's others are not its
		}
		cmds, parts = append(cmds, c), append(parts, int(part))
		b = b[k+int(l):]
	}
	if len(b) != 0 {
		return cmds, parts, fmt.Errorf("%w: %w: %d bytes after the commands", store.ErrBadCommand, errEntry, len(b))
	}
	return cmds, parts, nil
}
