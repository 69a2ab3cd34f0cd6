package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// Formats of the values this package writes besides message.go's records.
// Each starts with a two-byte magic and a version byte; an unknown version
// is refused as ErrCorrupt. The file's own version, FormatVersion in meta
// "version", says which of these a file may hold.

// state is the partition's metadata: meta "state".
type state struct {
	Next       uint64 // offset of the next appended message
	Low        uint64 // offset of the first message still in the log
	Bytes      int64  // bytes of records in the log
	DedupLow   uint64 // log offsets below this have no dedup entry any more
	Applied    uint64 // index of the last batch or replicated entry applied
	LastStored int64  // StoredAt of the newest record; StoredAt never decreases
	DelaySeq   uint64 // sequence of the newest delayed message
	Delayed    int64  // messages in the delay index
	GroupGen   uint64 // the last group generation handed out by OpClaim or OpResetOffset
	Frozen     uint64 // OpFreeze's Offset while the partition is frozen, 0 otherwise
}

// State layout: 'Z' 'S', the version, then the fields of state in
// declaration order, each 8 bytes big-endian, then a crc32c of the bytes
// before it. Version 1 has the first eight fields, GroupGen reading as 0;
// version 2 the first nine, Frozen reading as 0; version 3 all ten. A
// state that is not frozen is written in version 2, which every release
// since format 2 reads: only a partition handed to another node
// (OpFreeze) holds a version 3 state.
const (
	stateVersion = 2
	stateFrozen  = 3
	stateLen     = 3 + 9*8 + 4
	stateLenV3   = 3 + 10*8 + 4
	stateLenV1   = 3 + 8*8 + 4
)

func appendState(dst []byte, s *state) []byte {
	start := len(dst)
	fields := [...]uint64{s.Next, s.Low, uint64(s.Bytes), s.DedupLow, s.Applied,
		uint64(s.LastStored), s.DelaySeq, uint64(s.Delayed), s.GroupGen, s.Frozen}
	n := len(fields)
	if s.Frozen == 0 {
		dst = append(dst, 'Z', 'S', stateVersion)
		n--
	} else {
		dst = append(dst, 'Z', 'S', stateFrozen)
	}
	for _, v := range fields[:n] {
		dst = binary.BigEndian.AppendUint64(dst, v)
	}
	return binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

// stateLenOf returns the length of a state of version v, 0 for an unknown
// version.
func stateLenOf(v byte) int {
	switch v {
	case 1:
		return stateLenV1
	case stateVersion:
		return stateLen
	case stateFrozen:
		return stateLenV3
	}
	return 0
}

// Position layout (meta "position", Replicated partitions only): 'Z' 'P',
// positionVersion, Index and Cmds (8 bytes BE each), then a crc32c of the
// bytes before it.
const (
	positionVersion = 1
	positionLen     = 3 + 2*8 + 4
)

func appendPosition(dst []byte, pos Position) []byte {
	start := len(dst)
	dst = append(dst, 'Z', 'P', positionVersion)
	dst = binary.BigEndian.AppendUint64(dst, pos.Index)
	dst = binary.BigEndian.AppendUint64(dst, pos.Cmds)
	return binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

func decodePosition(b []byte) (Position, error) {
	if len(b) != positionLen || b[0] != 'Z' || b[1] != 'P' || b[2] != positionVersion ||
		crc32.Checksum(b[:positionLen-4], castagnoli) != binary.BigEndian.Uint32(b[positionLen-4:]) {
		return Position{}, fmt.Errorf("%w: position of %d bytes failing its check", ErrCorrupt, len(b))
	}
	return Position{Index: binary.BigEndian.Uint64(b[3:]), Cmds: binary.BigEndian.Uint64(b[11:])}, nil
}

// Small values end with crc32c(key || value) since format 2: dedup's offset
// and stored-at, groups' group record, txs' decision and decided-at. bbolt
// checks no data page, and a flipped byte would read as a wrong offset.
// Format 1's values, without it, are read as they are.
const sealLen = 4

func appendSealed(dst []byte, key string, v []byte) []byte {
	crc := crc32.Update(crc32.Checksum(bytesOf(key), castagnoli), castagnoli, v)
	return binary.BigEndian.AppendUint32(append(dst, v...), crc)
}

// unseal returns the n-byte body of the small value val stored under key,
// nil for an absent one, or ErrCorrupt.
func unseal(key string, val []byte, n int) ([]byte, error) {
	switch {
	case val == nil:
		return nil, nil
	case len(val) == n:
		return val, nil // format 1
	case len(val) == n+sealLen:
		crc := crc32.Update(crc32.Checksum(bytesOf(key), castagnoli), castagnoli, val[:n])
		if crc == binary.BigEndian.Uint32(val[n:]) {
			return val[:n], nil
		}
	}
	return nil, fmt.Errorf("%w: value of %q: %d bytes failing their check", ErrCorrupt, key, len(val))
}

// GroupState is a consumer group's record in one partition.
type GroupState struct {
	Offset     uint64 // the committed offset
	Generation uint64 // the owner's: OpCommitOffset must carry it
	Updated    int64  // Now of the command that last changed the record; 0 before format 3
	// Reset reports that the generation was taken by OpResetOffset and no
	// claim came since: an owner whose commit was refused claims again and
	// goes on from Offset, while one refused after another claim has lost
	// the partition.
	Reset bool
	// Released reports that the owner let go with OpUnclaim: a claim needs
	// not wait for its lease.
	Released bool
	// Lease is the owner's lease in ns, from its claim's MaxAge: a later
	// claim respects the longer of it and its own, so owners with
	// different leases never overlap.
	// A reset of a leased record keeps the owner's lease and Updated: its
	// owner, told of the reset, claims again with the reset's generation,
	// and any other claim waits for the lease, as before the reset.
	Lease int64
}

// Leased reports that an owner holds g at now under the longer of its
// lease and lease: it claimed or committed within it and did not let go,
// and no reset took the group from it while it held no lease. A record of
// unknown age, from before format 3, holds no lease, nor one stamped more
// than the lease after now: the partition's clock stepped back, and a live
// owner's next renewal stamps it again. The lease relies on a clock that
// does not step forward.
func (g GroupState) Leased(now, lease int64) bool {
	lease = max(lease, g.Lease)
	return g.Held() && g.Updated > now-lease && g.Updated-lease <= now
}

// Held reports whether an owner holds the group, whatever the time: it
// claimed or committed and did not let go, and no reset took the group
// from it while it held no lease. Leased is Held within the lease.
func (g GroupState) Held() bool {
	return g.Generation != 0 && (!g.Reset || g.Lease > 0) && !g.Released && g.Updated != 0
}

// Group layout (format 3): 'Z' 'G', groupVersion, offset, generation,
// updated (8 bytes BE each), flags (1: Reset, 2: Released), lease (8 bytes
// BE), sealed. Version 2 had no lease, version 1 no flags byte. Formats 1
// and 2 stored the offset alone (8 bytes; sealed in format 2): generation
// 0, updated 0.
const (
	groupVersion  = 3
	groupBytes    = 3 + 3*8 + 1 + 8
	groupBytesV2  = 3 + 3*8 + 1
	groupBytesV1  = 3 + 3*8
	groupBytesV0  = 8
	groupReset    = 1 // flags bits
	groupReleased = 2
)

// appendGroup appends the sealed record g of group key.
func appendGroup(dst []byte, key string, g *GroupState) []byte {
	var b [groupBytes]byte
	b[0], b[1], b[2] = 'Z', 'G', groupVersion
	binary.BigEndian.PutUint64(b[3:], g.Offset)
	binary.BigEndian.PutUint64(b[11:], g.Generation)
	binary.BigEndian.PutUint64(b[19:], uint64(g.Updated))
	if g.Reset {
		b[27] |= groupReset
	}
	if g.Released {
		b[27] |= groupReleased
	}
	binary.BigEndian.PutUint64(b[28:], uint64(g.Lease))
	return appendSealed(dst, key, b[:])
}

// decodeGroup returns the record val of group key, ok false for an absent
// one, or ErrCorrupt.
func decodeGroup(key string, val []byte) (g GroupState, ok bool, err error) {
	n := groupBytesV0
	switch len(val) { // format 3 always seals
	case groupBytes + sealLen:
		n = groupBytes
	case groupBytesV2 + sealLen:
		n = groupBytesV2
	case groupBytesV1 + sealLen:
		n = groupBytesV1
	}
	b, err := unseal(key, val, n)
	if b == nil || err != nil {
		return g, false, err
	}
	if n == groupBytesV0 {
		return GroupState{Offset: binary.BigEndian.Uint64(b)}, true, nil
	}
	version := byte(groupVersion)
	switch n {
	case groupBytesV1:
		version = 1
	case groupBytesV2:
		version = 2
	}
	flagged := n != groupBytesV1
	if b[0] != 'Z' || b[1] != 'G' || b[2] != version || flagged && b[27]&^(groupReset|groupReleased) != 0 {
		return g, false, fmt.Errorf("%w: value of %q: group layout %x", ErrCorrupt, key, b[:3])
	}
	g = GroupState{Offset: binary.BigEndian.Uint64(b[3:]), Generation: binary.BigEndian.Uint64(b[11:]),
		Updated: int64(binary.BigEndian.Uint64(b[19:]))}
	g.Reset = flagged && b[27]&groupReset != 0
	g.Released = flagged && b[27]&groupReleased != 0
	if n == groupBytes {
		g.Lease = int64(binary.BigEndian.Uint64(b[28:]))
		if g.Lease < 0 {
			return GroupState{}, false, fmt.Errorf("%w: value of %q: lease %d", ErrCorrupt, key, g.Lease)
		}
	}
	return g, true, nil
}

func decodeState(b []byte, s *state) error {
	if len(b) > 0 && isLegacyMap(b[0]) {
		if err := decodeLegacyState(b, s); err != nil {
			return err
		}
		return checkState(s) // what format 1 held is rewritten in this one
	}
	if len(b) < 3 || b[0] != 'Z' || b[1] != 'S' {
		return fmt.Errorf("%w: partition state of %d bytes", ErrCorrupt, len(b))
	}
	n := stateLenOf(b[2])
	if n == 0 {
		return fmt.Errorf("%w: partition state version %d, want 1 to %d", ErrCorrupt, b[2], stateFrozen)
	}
	if len(b) != n || crc32.Checksum(b[:n-4], castagnoli) != binary.BigEndian.Uint32(b[n-4:]) {
		return fmt.Errorf("%w: partition state of %d bytes", ErrCorrupt, len(b))
	}
	u := func(i int) uint64 { return binary.BigEndian.Uint64(b[3+8*i:]) }
	*s = state{Next: u(0), Low: u(1), Bytes: int64(u(2)), DedupLow: u(3), Applied: u(4),
		LastStored: int64(u(5)), DelaySeq: u(6), Delayed: int64(u(7))}
	if n >= stateLen {
		s.GroupGen = u(8)
	}
	if n == stateLenV3 {
		if s.Frozen = u(9); s.Frozen == 0 {
			return fmt.Errorf("%w: partition state version %d frozen at 0", ErrCorrupt, stateFrozen)
		}
	}
	return checkState(s)
}

func checkState(s *state) error {
	if s.Low > s.Next || s.DedupLow > s.Next || s.Bytes < 0 || s.Delayed < 0 {
		return fmt.Errorf("%w: partition state %+v", ErrCorrupt, *s)
	}
	return nil
}

// isLegacyMap reports whether c starts a msgpack map: the form of format 1
// files, which stored state and half transactions as msgpack maps.
func isLegacyMap(c byte) bool { return c&0xf0 == 0x80 || c == 0xde || c == 0xdf }

// decodeLegacyState reads format 1's state: a msgpack map from the Go field
// names of state to integers. Those names were the format; a key that is
// not one of them is damage.
func decodeLegacyState(b []byte, s *state) error {
	*s = state{}
	fields := map[string]*uint64{"Next": &s.Next, "Low": &s.Low, "DedupLow": &s.DedupLow,
		"Applied": &s.Applied, "DelaySeq": &s.DelaySeq}
	signed := map[string]*int64{"Bytes": &s.Bytes, "LastStored": &s.LastStored, "Delayed": &s.Delayed}
	r := mpReader{b: b}
	for range r.mapLen() {
		k := r.str()
		v := r.int()
		if f, ok := fields[k]; ok {
			*f = uint64(v)
		} else if f, ok := signed[k]; ok {
			*f = v
		} else if r.err == nil {
			return fmt.Errorf("%w: format 1 partition state with field %q", ErrCorrupt, k)
		}
	}
	if r.err == nil && len(r.b) > 0 {
		r.fail("%d bytes after the state", len(r.b))
	}
	if r.err != nil {
		return fmt.Errorf("%w: format 1 partition state: %v", ErrCorrupt, r.err)
	}
	return nil
}

// halfTx is the value of the half bucket: the undecided messages of one
// transaction in this partition.
type halfTx struct {
	Producer  string
	FirstSeen int64
	LastCheck int64
	Checks    int
	Records   [][]byte // encoded records, CRC'd under the txid key
}

// Half layout: 'Z' 'H', version 1, first seen (8), last check (8), checks
// (uvarint), producer (uvarint length + bytes), record count (uvarint), then
// each record as uvarint length + bytes.
const halfVersion = 1

func appendHalf(dst []byte, h *halfTx) []byte {
	dst = append(dst, 'Z', 'H', halfVersion)
	dst = binary.BigEndian.AppendUint64(dst, uint64(h.FirstSeen))
	dst = binary.BigEndian.AppendUint64(dst, uint64(h.LastCheck))
	dst = binary.AppendUvarint(dst, uint64(h.Checks))
	dst = appendString(dst, h.Producer)
	dst = binary.AppendUvarint(dst, uint64(len(h.Records)))
	for _, r := range h.Records {
		dst = binary.AppendUvarint(dst, uint64(len(r)))
		dst = append(dst, r...)
	}
	return dst
}

// decodeHalf decodes a half transaction; its Records point into b.
func decodeHalf(b []byte) (*halfTx, error) {
	h, err := decodeHalfValue(b)
	if err != nil {
		return nil, fmt.Errorf("%w: half transaction: %v", ErrCorrupt, err)
	}
	return h, nil
}

func decodeHalfValue(b []byte) (*halfTx, error) {
	if len(b) > 0 && isLegacyMap(b[0]) {
		return decodeLegacyHalf(b)
	}
	if len(b) < 3+16 || b[0] != 'Z' || b[1] != 'H' {
		return nil, errors.New("bad magic")
	}
	if b[2] != halfVersion {
		return nil, fmt.Errorf("version %d, want %d", b[2], halfVersion)
	}
	h := &halfTx{FirstSeen: int64(binary.BigEndian.Uint64(b[3:])), LastCheck: int64(binary.BigEndian.Uint64(b[11:]))}
	r := reader{b: b[19:]}
	checks := r.uvarint()
	h.Producer = r.str()
	n := r.uvarint()
	if r.err == nil && (n > uint64(len(r.b)) || checks > 1<<31) {
		return nil, fmt.Errorf("%d records, %d checks in %d bytes", n, checks, len(r.b))
	}
	h.Checks = int(checks)
	if n > 0 {
		h.Records = make([][]byte, n)
	}
	for i := range h.Records {
		h.Records[i] = r.bytes()
	}
	if r.err != nil {
		return nil, r.err
	}
	if len(r.b) != 0 {
		return nil, fmt.Errorf("%d bytes after the records", len(r.b))
	}
	return h, nil
}

// decodeLegacyHalf reads format 1's half transaction: a msgpack map with
// keys p (producer), f (first seen), l (last check), c (checks) and r (the
// records, an array of binaries).
func decodeLegacyHalf(b []byte) (*halfTx, error) {
	h := &halfTx{}
	r := mpReader{b: b}
	for range r.mapLen() {
		switch k := r.str(); k {
		case "p":
			h.Producer = r.str()
		case "f":
			h.FirstSeen = r.int()
		case "l":
			h.LastCheck = r.int()
		case "c":
			// the bound decodeHalfValue enforces, as the half is rewritten
			if c := r.int(); c < 0 || c > 1<<31 {
				r.fail("%d checks", c)
			} else {
				h.Checks = int(c)
			}
		case "r":
			h.Records = nil
			if n := r.arrayLen(); n > 0 {
				h.Records = make([][]byte, n)
				for i := range h.Records {
					h.Records[i], _ = r.raw()
				}
			}
		default:
			if r.err == nil {
				return nil, fmt.Errorf("format 1 field %q", k)
			}
		}
	}
	if r.err == nil && len(r.b) > 0 {
		r.fail("%d bytes after the half transaction", len(r.b))
	}
	return h, r.err
}
