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
// loses slots to any source that holds fewer.
//
// Connections from the addresses known says are nodes' count in a pool of
// their own, with the same bounds, so that an attacker with as many
// addresses as there are slots, holding one each, keeps no node out
// either: an accepted TCP connection's source address cannot be forged, as
// the TCP handshake needs the source's answer. Safe for concurrent use.
type gate struct {
	perSource, total int
	known            func(netip.Addr) bool // nil: every source is unknown

	mu    sync.Mutex
	seq   uint64      // guarded by mu: the last slot's number
	pools [2]gatePool // guarded by mu: unknown sources', known sources'
}

// gatePool is the slots of the known or of the unknown sources.
type gatePool struct {
	n       int // slots taken
	sources map[netip.Prefix]*gateSource
}

type gateSource struct {
	slots []*slot // oldest first
}

// slot is one accepted connection's place in the gate until leave.
type slot struct {
	conn net.Conn
	src  netip.Prefix
	pool *gatePool
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

// newGate returns a gate with the bounds above; known, if not nil, says
// which source addresses are nodes'. It is called without the gate's lock
// for every connection, so it must be cheap and must not block.
func newGate(perSource, total int, known func(netip.Addr) bool) *gate {
	g := &gate{perSource: perSource, total: total, known: known}
	for i := range g.pools {
		g.pools[i].sources = make(map[netip.Prefix]*gateSource)
	}
	return g
}

// sourceOf is the source a remote address counts under: the address for
// IPv4 (and IPv4-mapped IPv6), its /64 for IPv6. Addresses that are no IP
// address share the zero prefix.
func sourceOf(a net.Addr) netip.Prefix {
	p, _ := sourceAddr(a)
	return p
}

// sourceAddr is sourceOf(a) and a's IP address, unmapped and without a
// zone; the zero Addr if a is no IP address.
func sourceAddr(a net.Addr) (netip.Prefix, netip.Addr) {
	var ap netip.AddrPort
	if t, ok := a.(*net.TCPAddr); ok {
		ap = t.AddrPort()
	} else if p, err := netip.ParseAddrPort(a.String()); err == nil {
		ap = p
	}
	if !ap.IsValid() {
		return netip.Prefix{}, netip.Addr{}
	}
	ip := ap.Addr().Unmap().WithZone("")
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, _ := ip.Prefix(bits)
	return p, ip
}

// enter takes a slot for c, or refuses it with the reason. A slot taken
// from another source is closed before enter returns; that connection's
// leave is then a no-op.
func (g *gate) enter(c net.Conn) (*slot, refusal) {
	src, ip := sourceAddr(c.RemoteAddr())
	pool := &g.pools[0]
	if g.known != nil && ip.IsValid() && g.known(ip) {
		pool = &g.pools[1]
	}
	var evict net.Conn
	defer func() {
		if evict != nil {
			evict.Close()
		}
	}()
	g.mu.Lock()
	defer g.mu.Unlock()
	own := pool.sources[src]
	var held int
	if own != nil {
		held = len(own.slots)
	}
	if held >= g.perSource {
		return nil, overSource
	}
	if pool.n >= g.total {
		var most *gateSource
		for _, s := range pool.sources { // ties: the source whose oldest slot is older
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
	s := &slot{conn: c, src: src, pool: pool, seq: g.seq}
	if own == nil {
		own = &gateSource{}
		pool.sources[src] = own
	}
	own.slots = append(own.slots, s)
	pool.n++
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
	s.pool.n--
	src := s.pool.sources[s.src]
	for i, x := range src.slots {
		if x == s {
			src.slots = append(src.slots[:i], src.slots[i+1:]...)
			break
		}
	}
	if len(src.slots) == 0 {
		delete(s.pool.sources, s.src)
	}
}

// taken is the number of slots taken, in both pools.
func (g *gate) taken() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.pools[0].n + g.pools[1].n
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
