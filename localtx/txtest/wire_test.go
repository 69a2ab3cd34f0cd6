package txtest

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"testing"
)

func TestIsCommit(t *testing.T) {
	for q, want := range map[string]bool{
		"commit": true, "COMMIT": true, " Commit ; ": true, "commit work": true,
		"COMMIT TRANSACTION": true, "end": true, "END WORK": true,
		"": false, "committed": false, "commit and chain": false, "rollback": false,
		"select 'commit'": false, "commit prepared 'x'": false,
	} {
		if got := isCommit(q); got != want {
			t.Errorf("isCommit(%q) = %v, want %v", q, got, want)
		}
	}
}

// pgMsg is a typed PostgreSQL message.
func pgMsg(typ byte, body string) []byte {
	b := []byte{typ, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(4+len(body)))
	return append(b, body...)
}

// pgUntyped is a startup-phase PostgreSQL message: code and body.
func pgUntyped(code uint32, body string) []byte {
	b := make([]byte, 8, 8+len(body))
	binary.BigEndian.PutUint32(b, uint32(8+len(body)))
	binary.BigEndian.PutUint32(b[4:], code)
	return append(b, body...)
}

// myPacket is a MySQL packet.
func myPacket(seq byte, payload []byte) []byte {
	n := len(payload)
	return append([]byte{byte(n), byte(n >> 8), byte(n >> 16), seq}, payload...)
}

// frame feeds stream to a new framer in reads of step bytes and returns
// what it found of each message.
func frame(t *testing.T, wire Wire, client bool, stream []byte, step int) []string {
	t.Helper()
	f := newFramer(wire, client)
	var out []string
	end := 0
	for off := 0; off < len(stream); off += step {
		chunk := stream[off:min(off+step, len(stream))]
		msgs, err := f.feed(chunk)
		if err != nil {
			t.Fatalf("feed: %v", err)
		}
		for _, m := range msgs {
			if got := off + m.end - m.len; got != end {
				t.Fatalf("message starts at %d, want %d", got, end)
			}
			end = off + m.end
			s := string(rune(m.typ))
			switch {
			case m.commit:
				s += " commit"
			case m.handshake:
				s += " handshake"
			case wire == PostgresWire && m.typ == 0 && m.code() == pgEncryptionRequest:
				s += " encryption"
			}
			out = append(out, s)
		}
	}
	if end != len(stream) {
		t.Fatalf("messages end at %d of %d", end, len(stream))
	}
	return out
}

func TestFramer(t *testing.T) {
	var pg bytes.Buffer
	pg.Write(pgUntyped(pgSSLRequest, ""))
	pg.Write(pgUntyped(196608, "user\x00postgres\x00\x00"))
	pg.Write(pgMsg('P', "\x00commit\x00\x00\x00")) // extended protocol: not seen
	pg.Write(pgMsg('Q', "select 1\x00"))
	pg.Write(pgMsg('Q', "commit\x00"))
	pg.Write(pgMsg('S', ""))
	big := bytes.Repeat([]byte("x"), 3*headMax)
	pg.Write(pgMsg('Q', "commit"+string(big)+"\x00"))

	var my bytes.Buffer
	caps := make([]byte, 32)
	binary.LittleEndian.PutUint32(caps, 0x000fa685)
	my.Write(myPacket(1, caps))
	my.Write(myPacket(3, []byte("\x03COMMIT"))) // an auth continuation, not a command
	my.Write(myPacket(0, []byte("\x03SELECT 1")))
	my.Write(myPacket(0, []byte("\x03COMMIT")))
	full := append([]byte{0x03}, bytes.Repeat([]byte(" "), 1<<24-2)...)
	my.Write(myPacket(0, full))
	my.Write(myPacket(0, []byte("\x03COMMIT"))) // continues the payload above

	for _, c := range []struct {
		name   string
		wire   Wire
		stream []byte
		want   []string
	}{
		{"postgres", PostgresWire, pg.Bytes(), []string{"\x00 encryption", "\x00", "P", "Q", "Q commit", "S", "Q"}},
		{"mysql", MySQLWire, my.Bytes(), []string{"\x00 handshake", "\x00", "\x00", "\x00 commit", "\x00", "\x00"}},
	} {
		for _, step := range []int{1, 3, 7, 1 << 16, len(c.stream)} {
			if c.wire == MySQLWire && step < 7 {
				continue // 16 MiB a byte at a time is slow
			}
			if got := frame(t, c.wire, true, c.stream, step); !reflect.DeepEqual(got, c.want) {
				t.Errorf("%s in reads of %d: %q, want %q", c.name, step, got, c.want)
			}
		}
	}
	if _, err := newFramer(PostgresWire, false).feed(pgMsg('C', "")[:1:1]); err != nil {
		t.Errorf("a partial header: %v", err)
	}
	if _, err := newFramer(PostgresWire, false).feed([]byte{'C', 0, 0, 0, 3}); err == nil {
		t.Error("a length below 4 is not refused")
	}
}

func TestReplyPart(t *testing.T) {
	pg := &proxyConn{p: &Proxy{wire: PostgresWire}}
	my := &proxyConn{p: &Proxy{wire: MySQLWire}}
	for _, c := range []struct {
		c     *proxyConn
		m     message
		reply string
		done  bool
	}{
		{pg, message{typ: 'C', head: []byte("COMMIT\x00")}, "COMMIT", false},
		{pg, message{typ: 'E', head: []byte("SERROR\x00C40001\x00Mcould not serialize\x00\x00")}, "ERROR 40001", false},
		{pg, message{typ: 'N', head: []byte("SWARNING\x00\x00")}, "", false},
		{pg, message{typ: 'Z', head: []byte("I")}, "", true},
		{my, message{head: []byte{0x00, 0, 0, 2, 0, 0, 0}}, "OK", true},
		{my, message{head: []byte{0xff, 0xbd, 0x04, '#'}}, "ERROR 1213", true},
	} {
		if reply, done := c.c.replyPart(c.m); reply != c.reply || done != c.done {
			t.Errorf("replyPart(%c %q) = %q, %v; want %q, %v", c.m.typ, c.m.head, reply, done, c.reply, c.done)
		}
	}
}

func TestProxyDSN(t *testing.T) {
	for _, c := range []struct {
		server, dsn, proxied, target string
	}{
		{"postgres", "postgres://postgres@127.0.0.1:55432/zeze?sslmode=disable",
			"postgres://postgres@127.0.0.1:9/zeze?sslmode=disable", "127.0.0.1:55432"},
		{"postgres", "postgresql://u:p%40ss@db.example:6000/x",
			"postgresql://u:p%40ss@127.0.0.1:9/x", "db.example:6000"},
		{"postgres", "postgres://u@[::1]/x", "postgres://u@127.0.0.1:9/x", "[::1]:5432"},
		{"mysql", "zeze:zeze@tcp(127.0.0.1:53306)/zeze", "zeze:zeze@tcp(127.0.0.1:9)/zeze", "127.0.0.1:53306"},
		{"mysql", "u:p@tcp(db.example)/x?parseTime=true", "u:p@tcp(127.0.0.1:9)/x?parseTime=true", "db.example:3306"},
	} {
		proxied, target, err := ProxyDSN(c.server, c.dsn, "127.0.0.1:9")
		if err != nil || proxied != c.proxied || target != c.target {
			t.Errorf("ProxyDSN(%s, %s) = %q, %q, %v; want %q, %q", c.server, c.dsn, proxied, target, err, c.proxied, c.target)
		}
	}
	for _, c := range []struct{ server, dsn string }{
		{"postgres", "host=127.0.0.1 port=5432"},
		{"postgres", "postgres://u@h1:1,h2:2/x"},
		{"postgres", "postgres:///x?host=/tmp"},
		{"mysql", "u:p@unix(/tmp/mysql.sock)/x"},
		{"mysql", "u:p@tcp(h:1)/x?tls=skip-verify"},
		{"oracle", "x"},
	} {
		if proxied, _, err := ProxyDSN(c.server, c.dsn, "127.0.0.1:9"); err == nil {
			t.Errorf("ProxyDSN(%s, %s) = %q, want an error", c.server, c.dsn, proxied)
		}
	}
}
