// Package fspath holds the path test that the rescan, the watcher and the
// CLI's location lookups share.
package fspath

import (
	"path/filepath"
	"strings"
)

// Within reports whether p is dir or lies under it. Both are clean,
// absolute paths; "/a/bc" is not within "/a/b".
func Within(dir, p string) bool {
	if p == dir {
		return true
	}
	sep := string(filepath.Separator)
	return strings.HasPrefix(p, strings.TrimSuffix(dir, sep)+sep)
}
