package actors

import (
	"slices"
	"testing"
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
	for listen, want := range map[string][]string{
		"127.0.0.1:7700": {"127.0.0.1:7700"},
		"0.0.0.0:7700":   {":7700"},
		"[::]:7700":      {":7700"},
		"[fe80::1]:7700": {"[fe80::1]:7700"},
		"bogus":          nil,
	} {
		if got := announcedAddrs(listen); !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", listen, got, want)
		}
	}
}
