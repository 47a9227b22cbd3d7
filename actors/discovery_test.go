package actors

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/lsync/lsync/net/discovery"
)

func TestDialable(t *testing.T) {
	heard := []string{"127.0.0.1:7000", "192.168.1.5:7000", "[fe80::1%eth0]:7000", "[2001:db8::5]:7000", "[::1]:7000", "junk"}
	for _, c := range []struct {
		listen string
		want   []string
	}{
		{"127.0.0.1:7700", []string{"127.0.0.1:7000"}},
		{"0.0.0.0:7700", []string{"127.0.0.1:7000", "192.168.1.5:7000"}},
		{"192.168.1.9:7700", []string{"127.0.0.1:7000", "192.168.1.5:7000"}},
		{"[::]:7700", []string{"127.0.0.1:7000", "192.168.1.5:7000", "[fe80::1%eth0]:7000", "[2001:db8::5]:7000", "[::1]:7000"}},
		{"[2001:db8::9]:7700", []string{"[fe80::1%eth0]:7000", "[2001:db8::5]:7000", "[::1]:7000"}},
		{"[::1]:7700", []string{"[::1]:7000"}},
	} {
		if got := dialable(c.listen, heard); !slices.Equal(got, c.want) {
			t.Errorf("from %s: %v, want %v", c.listen, got, c.want)
		}
	}
}

func TestAnnouncedAddrs(t *testing.T) {
	host := []netip.Addr{netip.MustParseAddr("192.168.1.5"), netip.MustParseAddr("2001:db8::5")}
	for listen, want := range map[string][]string{
		"127.0.0.1:7700": {"127.0.0.1:7700"},
		"0.0.0.0:7700":   {":7700", "192.168.1.5:7700"},
		"[::]:7700":      {":7700", "192.168.1.5:7700", "[2001:db8::5]:7700"},
		"[fe80::1]:7700": {"[fe80::1]:7700"},
		"bogus":          nil,
	} {
		if got := announcedAddrs(listen, host); !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", listen, got, want)
		}
	}
	// However many addresses the host has, an announcement holds them.
	var many []netip.Addr
	for i := range 40 {
		many = append(many, netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}))
	}
	if got := announcedAddrs("[::]:7700", many); len(got) != discovery.MaxAddrs || discovery.ValidateAddrs(got) != nil {
		t.Errorf("with 40 host addresses: %d announced (%v)", len(got), discovery.ValidateAddrs(got))
	}
	for _, a := range hostAddrs() {
		if a.IsLoopback() || a.IsLinkLocalUnicast() {
			t.Errorf("host address %s", a)
		}
	}
}
