package wire

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"

	"github.com/zeze-go/mq/internal/fuzzseed"
)

func frameBytes(t testing.TB, fs ...Frame) []byte {
	t.Helper()
	var b []byte
	for _, f := range fs {
		var err error
		if b, err = AppendFrame(b, f, DefaultMaxFrameBytes); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

func TestFrameReader_ReadFrame(t *testing.T) {
	big := bytes.Repeat([]byte{7}, 3*growStep+5)
	cases := []struct {
		name string
		in   []byte
		max  int
		want []Frame
		err  error
	}{
		{"OK", frameBytes(t, Frame{1, 2, []byte("a")}, Frame{3, 4, nil}, Frame{5, 6, big}), 0,
			[]Frame{{1, 2, []byte("a")}, {3, 4, []byte{}}, {5, 6, big}}, io.EOF},
		{"Empty", nil, 0, nil, io.EOF},
		{"CutLength", []byte{0, 0}, 0, nil, io.ErrUnexpectedEOF},
		{"CutPayload", frameBytes(t, Frame{1, 2, []byte("abc")})[:15], 0, nil, io.ErrUnexpectedEOF},
		{"CutBigPayload", frameBytes(t, Frame{1, 2, big})[:2*growStep], 0, nil, io.ErrUnexpectedEOF},
		{"HugeLength", []byte{0xff, 0xff, 0xff, 0xff}, 0, nil, ErrFrameTooLarge},
		{"OnePastMax", frameBytes(t, Frame{1, 2, []byte("abc")}), FrameHeaderSize + 2, nil, ErrFrameTooLarge},
		{"AtMax", frameBytes(t, Frame{1, 2, []byte("abc")}), FrameHeaderSize + 3, []Frame{{1, 2, []byte("abc")}}, io.EOF},
		{"ShortLength", []byte{0, 0, 0, FrameHeaderSize - 1, 1, 2, 3, 4, 5, 6, 7, 8, 9}, 0, nil, ErrFrameShort},
		{"MsgpackPrefix", []byte{0xdd, 0xff, 0xff, 0xff, 0xff}, 0, nil, ErrFrameTooLarge},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, split := range []bool{false, true} {
				var r io.Reader = bytes.NewReader(c.in)
				if split {
					r = iotest.OneByteReader(r)
				}
				fr := NewFrameReader(r, c.max)
				var got []Frame
				var err error
				fuzzseed.CheckAlloc(t, len(c.in), func() {
					for {
						var f Frame
						if f, err = fr.ReadFrame(); err != nil {
							break
						}
						f.Payload = append([]byte{}, f.Payload...)
						got = append(got, f)
					}
				})
				if !errors.Is(err, c.err) {
					t.Fatalf("split %v: error %v, want %v", split, err, c.err)
				}
				if len(got) != len(c.want) {
					t.Fatalf("split %v: %d frames, want %d", split, len(got), len(c.want))
				}
				for i := range got {
					if got[i].ReqID != c.want[i].ReqID || got[i].Op != c.want[i].Op || !bytes.Equal(got[i].Payload, c.want[i].Payload) {
						t.Fatalf("split %v: frame %d is %+v, want %+v", split, i, got[i], c.want[i])
					}
				}
			}
		})
	}
}

func TestFrameReader_ReusesBuffer(t *testing.T) {
	fs := []Frame{{1, 1, []byte("first")}}
	for i := range 20 {
		fs = append(fs, Frame{uint64(i), 2, []byte("other")})
	}
	in := frameBytes(t, fs...)
	fr := NewFrameReader(bytes.NewReader(in), 0)
	a, err := fr.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	p := &a.Payload[0]
	allocs := testing.AllocsPerRun(10, func() {
		b, err := fr.ReadFrame()
		if err != nil || &b.Payload[0] != p {
			t.Fatalf("second frame %+v, %v: buffer not reused", b, err)
		}
	})
	if allocs != 0 {
		t.Fatalf("second frame allocated %v times", allocs)
	}
}

func TestAppendFrame(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		b, err := AppendFrame([]byte("x"), Frame{0x0102030405060708, 0x0a0b, []byte("pq")}, 12)
		want := []byte("x\x00\x00\x00\x0c\x01\x02\x03\x04\x05\x06\x07\x08\x0a\x0bpq")
		if err != nil || !bytes.Equal(b, want) {
			t.Fatalf("%x, %v; want %x", b, err, want)
		}
	})
	t.Run("ErrFrameTooLarge", func(t *testing.T) {
		b, err := AppendFrame([]byte("x"), Frame{Payload: []byte("pqr")}, 12)
		if !errors.Is(err, ErrFrameTooLarge) || string(b) != "x" {
			t.Fatalf("%q, %v; want x, ErrFrameTooLarge", b, err)
		}
	})
	t.Run("Header", func(t *testing.T) {
		b, err := AppendFrameHeader([]byte("x"), Frame{0x0102030405060708, 0x0a0b, []byte("pq")}, 12)
		want := []byte("x\x00\x00\x00\x0c\x01\x02\x03\x04\x05\x06\x07\x08\x0a\x0b")
		if err != nil || !bytes.Equal(b, want) {
			t.Fatalf("%x, %v; want %x", b, err, want)
		}
		if b, err := AppendFrameHeader([]byte("x"), Frame{Payload: []byte("pqr")}, 12); !errors.Is(err, ErrFrameTooLarge) || string(b) != "x" {
			t.Fatalf("%q, %v; want x, ErrFrameTooLarge", b, err)
		}
	})
}

// FuzzReadFrame: the frame reader never panics, allocates about what it
// was given, reads the same frames whole or a byte at a time, and the frames
// it reads encode back to the bytes it consumed.
func FuzzReadFrame(f *testing.F) {
	f.Add(frameBytes(f, Frame{1, 2, []byte("payload")}, Frame{3, 4, nil}), 0)
	f.Add(frameBytes(f, Frame{1, 2, []byte("payload")}), FrameHeaderSize+6)
	for _, p := range []string{"\xdd\xff\xff\xff\xff", "\xdf\xff\xff\xff\xff", "\xdb\xff\xff\xff\xff", "\xc6\xff\xff\xff\xff", "\x00\x00\x00\x09", "\x00\x40\x00\x01"} {
		f.Add([]byte(p), 0)
	}
	f.Fuzz(func(t *testing.T, in []byte, max int) {
		max %= 1 << 20
		read := func(r io.Reader) ([]byte, error) {
			fr := NewFrameReader(r, max)
			var enc []byte
			for {
				fm, err := fr.ReadFrame()
				if err != nil {
					return enc, err
				}
				if enc, err = AppendFrame(enc, fm, fr.max); err != nil {
					t.Fatalf("read frame %+v does not encode: %v", fm, err)
				}
			}
		}
		var whole []byte
		var err error
		fuzzseed.CheckAlloc(t, len(in), func() { whole, err = read(bytes.NewReader(in)) })
		if !bytes.HasPrefix(in, whole) {
			t.Fatalf("frames read from %x encode to %x", in, whole)
		}
		if err == io.EOF && len(whole) != len(in) {
			t.Fatalf("clean end after %d of %d bytes", len(whole), len(in))
		}
		split, err2 := read(iotest.OneByteReader(bytes.NewReader(in)))
		if !bytes.Equal(split, whole) || (err == nil) != (err2 == nil) || (err != nil && err.Error() != err2.Error()) {
			t.Fatalf("byte at a time: %x, %v; whole: %x, %v", split, err2, whole, err)
		}
	})
}
