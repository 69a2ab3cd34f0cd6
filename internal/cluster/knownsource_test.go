package cluster

import (
	"net/netip"
	"testing"
)

// TestAgent_KnownSource: the addresses of the seeds and of the saved
// address book are known sources, before the metadata group is open; host
// names and other addresses are not.
func TestAgent_KnownSource(t *testing.T) {
	n := &Agent{cfg: AgentConfig{Seeds: []string{"10.0.0.1:7000", "seed.example:7000"}}}
	n.book.Store(&map[string]string{"b": "[2001:db8::2]:7000", "c": "10.0.0.3:7001"})
	for _, c := range []struct {
		ip   string
		want bool
	}{
		{"10.0.0.1", true},
		{"10.0.0.3", true},
		{"2001:db8::2", true},
		{"10.0.0.2", false},
		{"2001:db8::3", false},
	} {
		if got := n.knownSource(netip.MustParseAddr(c.ip)); got != c.want {
			t.Errorf("knownSource(%s) = %v, want %v", c.ip, got, c.want)
		}
	}
}
