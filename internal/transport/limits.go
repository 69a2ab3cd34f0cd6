package transport

import (
	"net"
	"net/netip"
	"sync"
	"time"
)

// gate bounds the accepted connections that have not yet proven
// themselves: at most perSource from one source (an IPv4 address, or an
// IPv6 /64, which one host usually holds whole) and total in all. When
// every slot is taken, a connection from a source holding fewer than the
// most any source holds takes the oldest slot of that source, so that an
// attacker with few addresses, whatever it sends, cannot keep a peer from
// another address out: it holds at most perSource slots per address, and
// loses slots to any source that holds fewer. Safe for concurrent use.
type gate struct {
	perSource, total int

	mu      sync.Mutex
	n       int                          // guarded by mu: slots taken
	seq     uint64                       // guarded by mu: the last slot's number
	sources map[netip.Prefix]*gateSource // guarded by mu
}

type gateSource struct {
	slots []*slot // oldest first
}

// slot is one accepted connection's place in the gate until leave.
type slot struct {
	conn net.Conn
	src  netip.Prefix
	seq  uint64 // in the order slots were taken
	gone bool   // guarded by gate.mu: left, or evicted
}

// refusal says why enter refused a connection.
type refusal int

const (
	admitted refusal = iota
	overSource
	overTotal
)

func newGate(perSource, total int) *gate {
	return &gate{perSource: perSource, total: total, sources: make(map[netip.Prefix]*gateSource)}
}

// sourceOf is the source a remote address counts under: the address for
// IPv4 (and IPv4-mapped IPv6), its /64 for IPv6. Addresses that are no IP
// address share the zero prefix.
func sourceOf(a net.Addr) netip.Prefix {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Prefix{}
	}
	ip := ap.Addr().Unmap().WithZone("")
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, _ := ip.Prefix(bits)
	return p
}

// enter takes a slot for c, or refuses it with the reason. A slot taken
// from another source is closed before enter returns; that connection's
// leave is then a no-op.
func (g *gate) enter(c net.Conn) (*slot, refusal) {
	src := sourceOf(c.RemoteAddr())
	var evict net.Conn
	defer func() {
		if evict != nil {
			evict.Close()
		}
	}()
	g.mu.Lock()
	defer g.mu.Unlock()
	own := g.sources[src]
	var held int
	if own != nil {
		held = len(own.slots)
	}
	if held >= g.perSource {
		return nil, overSource
	}
	if g.n >= g.total {
		var most *gateSource
		for _, s := range g.sources { // ties: the source whose oldest slot is older
			if most == nil || len(s.slots) > len(most.slots) ||
				len(s.slots) == len(most.slots) && s.slots[0].seq < most.slots[0].seq {
				most = s
			}
		}
		// Take a slot only from a source that still holds more than this
		// one will, so that two sources never take slots back and forth.
		if most == nil || len(most.slots) <= held+1 {
			return nil, overTotal
		}
		old := most.slots[0]
		g.remove(old)
		evict = old.conn
	}
	g.seq++
	s := &slot{conn: c, src: src, seq: g.seq}
	if own == nil {
		own = &gateSource{}
		g.sources[src] = own
	}
	own.slots = append(own.slots, s)
	g.n++
	return s, admitted
}

// leave gives back s's slot, unless it was taken from it.
func (g *gate) leave(s *slot) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.remove(s)
}

func (g *gate) remove(s *slot) {
	if s.gone {
		return
	}
	s.gone = true
	g.n--
	src := g.sources[s.src]
	for i, x := range src.slots {
		if x == s {
			src.slots = append(src.slots[:i], src.slots[i+1:]...)
			break
		}
	}
	if len(src.slots) == 0 {
		delete(g.sources, s.src)
	}
}

// taken is the number of slots taken.
func (g *gate) taken() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n
}

// logLimit lets one log line per source through per interval and counts
// the ones it holds back, so that a flood of refused connections costs a
// line per source and interval, not one per connection. It remembers at
// most logLimitSources sources; past that, lines of new sources are held
// back until old entries expire. Safe for concurrent use.
type logLimit struct {
	interval time.Duration

	mu   sync.Mutex
	seen map[netip.Prefix]*logEntry // guarded by mu
}

type logEntry struct {
	at   time.Time // when a line last went through
	held int       // lines held back since
}

const (
	logLimitSources    = 1024
	refusalLogInterval = time.Minute // Transport.refusals' interval
)

// allow reports whether a line about src may be logged at now, and how
// many were held back since the last one.
func (l *logLimit) allow(src netip.Prefix, now time.Time) (ok bool, held int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil {
		l.seen = make(map[netip.Prefix]*logEntry)
	}
	e := l.seen[src]
	if e == nil {
		if len(l.seen) >= logLimitSources {
			for k, v := range l.seen {
				if now.Sub(v.at) >= l.interval {
					delete(l.seen, k)
				}
			}
			if len(l.seen) >= logLimitSources {
				return false, 0
			}
		}
		l.seen[src] = &logEntry{at: now}
		return true, 0
	}
	if now.Sub(e.at) < l.interval {
		e.held++
		return false, 0
	}
	held = e.held
	e.at, e.held = now, 0
	return true, held
}
