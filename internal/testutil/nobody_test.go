//go:build unix

package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// A subtest (its name rewritten by testing: "as nobody" → "as_nobody")
// runs as uid 65534 under root, and not as root anywhere.
func TestRerunAsNobody(t *testing.T) {
	root := os.Geteuid() == 0
	t.Run("as nobody", func(t *testing.T) {
		if RerunAsNobody(t) {
			if !root {
				t.Fatal("RerunAsNobody reran a test that is not root")
			}
			return
		}
		if os.Geteuid() == 0 {
			t.Fatal("RerunAsNobody let root run the test")
		}
		// Its temporary directories are its own.
		if err := os.WriteFile(filepath.Join(t.TempDir(), "f"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	})
}

// A rerun whose child runs no test fails. Under root this test runs itself
// again with rerunInnerEnv set: then its subtest is named after the euid,
// "0", and the child, uid 65534, has no such subtest to run.
func TestRerunAsNobodyRefusesNoTest(t *testing.T) {
	const rerunInnerEnv = "LSYNC_TESTUTIL_RERUN_INNER"
	if os.Getenv(rerunInnerEnv) != "" {
		t.Run(strconv.Itoa(os.Geteuid()), func(t *testing.T) {
			if RerunAsNobody(t) {
				return
			}
		})
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("RerunAsNobody reruns only root's tests")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), rerunInnerEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "the child ran no test "+t.Name()+"/0") {
		t.Fatalf("a rerun that ran no test: %v\n%s", err, out)
	}
}
