package fspath

import "testing"

func TestWithin(t *testing.T) {
	for _, c := range []struct {
		dir, p string
		want   bool
	}{
		{"/a/b", "/a/b", true},
		{"/a/b", "/a/b/c", true},
		{"/a/b", "/a/bc", false},
		{"/a/b", "/a", false},
		{"/", "/x", true},
		{"/", "/", true},
	} {
		if got := Within(c.dir, c.p); got != c.want {
			t.Errorf("Within(%q, %q) = %v, want %v", c.dir, c.p, got, c.want)
		}
	}
}
