package wire

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// A frame on a node-to-node connection, after the transport's handshake,
// whose version also versions this layout:
//
//	length  uint32 big endian: the bytes after it (FrameHeaderSize + payload)
//	reqID   uint64 big endian: pairs a response with its request
//	op      uint16 big endian: what the payload is
//	payload length-FrameHeaderSize bytes
//
// The length is checked against the reader's limit before anything is
// allocated for it.
const (
	// FrameHeaderSize is the size of reqID and op, the part of a frame's
	// length that is not payload.
	FrameHeaderSize = 8 + 2
	// DefaultMaxFrameBytes is the default limit on a frame's length.
	DefaultMaxFrameBytes = 4 << 20
	// growStep bounds what one read adds to a reader's buffer, so a peer
	// that claims a large frame and sends little makes the reader allocate
	// about what it sent, not what it claimed.
	growStep = 64 << 10
)

var (
	// ErrFrameTooLarge is returned when a frame's length exceeds the limit,
	// by a reader before it allocates and by a writer before it writes.
	ErrFrameTooLarge = errors.New("wire: frame too large")
	// ErrFrameShort is returned by a reader for a length below
	// FrameHeaderSize.
	ErrFrameShort = errors.New("wire: frame shorter than its header")
)

// Frame is one decoded frame.
type Frame struct {
	ReqID   uint64
	Op      uint16
	Payload []byte
}

// AppendFrame appends f's encoding to dst. It returns ErrFrameTooLarge,
// leaving dst as it was, if the frame's length would exceed max.
func AppendFrame(dst []byte, f Frame, max int) ([]byte, error) {
	dst, err := AppendFrameHeader(dst, f, max)
	if err != nil {
		return dst, err
	}
	return append(dst, f.Payload...), nil
}

// AppendFrameHeader appends the header of f to dst: its length, counting
// f.Payload, and the fields before the payload, which the caller writes
// after it, so that a large payload need not be copied next to its
// header. It returns ErrFrameTooLarge as AppendFrame does.
func AppendFrameHeader(dst []byte, f Frame, max int) ([]byte, error) {
	n := FrameHeaderSize + len(f.Payload)
	if n > max || uint64(n) > 1<<32-1 {
		return dst, fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, n, max)
	}
	dst = binary.BigEndian.AppendUint32(dst, uint32(n))
	dst = binary.BigEndian.AppendUint64(dst, f.ReqID)
	return binary.BigEndian.AppendUint16(dst, f.Op), nil
}

// FrameReader reads frames from a stream into one buffer that it reuses:
// a frame's Payload is valid until the next ReadFrame. Not safe for
// concurrent use.
type FrameReader struct {
	r   *bufio.Reader
	max int
	buf []byte
	hdr [4]byte // a field, so that reading into it does not allocate
}

// NewFrameReader returns a reader of frames from r whose length is at most
// max, or DefaultMaxFrameBytes if max ≤ 0.
func NewFrameReader(r io.Reader, max int) *FrameReader {
	if max <= 0 {
		max = DefaultMaxFrameBytes
	}
	return &FrameReader{r: bufio.NewReaderSize(r, 4096), max: max}
}

// ReadFrame reads the next frame. It returns io.EOF at a clean end of the
// stream, io.ErrUnexpectedEOF for a frame cut short, ErrFrameTooLarge or
// ErrFrameShort for a bad length, after which the stream is unusable, or
// the underlying reader's error.
func (fr *FrameReader) ReadFrame() (Frame, error) {
	if _, err := io.ReadFull(fr.r, fr.hdr[:]); err != nil {
		return Frame{}, err
	}
	n := uint64(binary.BigEndian.Uint32(fr.hdr[:]))
	if n > uint64(fr.max) {
		return Frame{}, fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, n, fr.max)
	}
	if n < FrameHeaderSize {
		return Frame{}, fmt.Errorf("%w: %d bytes", ErrFrameShort, n)
	}
	b, err := fr.readN(int(n))
	if err != nil {
		return Frame{}, err
	}
	return Frame{
		ReqID:   binary.BigEndian.Uint64(b[0:8]),
		Op:      binary.BigEndian.Uint16(b[8:10]),
		Payload: b[FrameHeaderSize:],
	}, nil
}

// readN reads n bytes into fr.buf, growing it at most growStep past what
// has arrived.
func (fr *FrameReader) readN(n int) ([]byte, error) {
	b := fr.buf[:0]
	for len(b) < n {
		if len(b) == cap(b) {
			b = append(b, make([]byte, min(n-len(b), growStep))...)[:len(b)]
		}
		k, err := io.ReadFull(fr.r, b[len(b):min(n, cap(b))])
		b = b[:len(b)+k]
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			fr.buf = b[:0]
			return nil, err
		}
	}
	fr.buf = b[:0]
	return b, nil
}
