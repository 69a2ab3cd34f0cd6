package transport

import (
	"errors"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"
)

// readQuiet reads from c until it has been quiet for d, or closed, and
// returns what it read.
func readQuiet(t testing.TB, c net.Conn, d time.Duration) []byte {
	t.Helper()
	defer c.SetReadDeadline(time.Time{})
	var got []byte
	buf := make([]byte, 512)
	for {
		_ = c.SetReadDeadline(time.Now().Add(d))
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			return got
		}
	}
}

// listenOn starts a transport bound to host, port 0, that Cleanup closes.
func listenOn(t testing.TB, host string, cfg Config) *Transport {
	t.Helper()
	cfg.Bind = net.JoinHostPort(host, "0")
	if cfg.Secret == nil {
		cfg.Secret = secret
	}
	cfg.InsecurePlaintext = cfg.ServerTLS == nil && cfg.ClientTLS == nil
	tr, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tr.Close(); err != nil {
			t.Error(err)
		}
	})
	return tr
}

// flood opens silent TCP connections to addr from the addresses in from,
// in turn, keeping at most keep of them open (closing the oldest), until
// stop; it returns how many it opened. Connections the listener closes
// stay open on this side until they are the oldest.
type flood struct {
	wg     sync.WaitGroup
	stop   chan struct{}
	mu     sync.Mutex
	opened int // guarded by mu
}

func startFlood(t testing.TB, addr string, from []string, keep int) *flood {
	t.Helper()
	f := &flood{stop: make(chan struct{})}
	f.wg.Go(func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for i := 0; ; i++ {
			select {
			case <-f.stop:
				return
			default:
			}
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from[i%len(from)])}, Timeout: time.Second}
			c, err := d.Dial("tcp", addr)
			if err != nil {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			conns = append(conns, c)
			if len(conns) > keep {
				conns[0].Close()
				conns = conns[1:]
			}
			f.mu.Lock()
			f.opened++
			f.mu.Unlock()
			time.Sleep(500 * time.Microsecond)
		}
	})
	t.Cleanup(f.close)
	return f
}

// close stops the flood and closes its connections; safe to call twice.
func (f *flood) close() {
	select {
	case <-f.stop:
	default:
		close(f.stop)
	}
	f.wg.Wait()
}

func (f *flood) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.opened
}

// closedByPeer says whether err, from a write, is the peer closing the
// connection.
func closedByPeer(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
