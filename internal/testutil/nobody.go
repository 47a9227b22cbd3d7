//go:build unix

package testutil

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// NobodyUID and NobodyGID are the unprivileged user and group that
// RerunAsNobody runs a test as, and that tests give to the processes they
// start without root's privileges (nobody and nogroup on Linux).
const (
	NobodyUID = 65534
	NobodyGID = 65534
)

// RerunAsNobody lets a test that needs an ordinary user's limits (a folder
// of mode 000 it cannot read, say) run under root too, rather than skip
// there: CI runs as root, which reads every folder.
//
// Not root, it returns false and the test goes on. Root, it runs this
// test again, alone, in a child process of the same test binary as uid
// and gid 65534 (no supplementary groups), fails t with the child's
// output unless the child ran the test and passed it (a child that ran no
// test fails too; one that skipped it skips t), and returns true: the
// caller then returns at once.
//
//	if testutil.RerunAsNobody(t) {
//		return
//	}
//
// Call it first, before t.Parallel, before a synctest bubble and before
// the test makes anything: the child makes its own. The child gets a copy
// of the test binary in a fresh directory (go test's build directory is
// closed to other users), HOME and TMPDIR in a fresh directory of its own,
// the parent's other environment and working directory (which uid 65534
// must be able to enter), -test.short if the parent has it, and the time
// left before t's deadline. Subtests work: the child runs t.Name() only.
func RerunAsNobody(t *testing.T) bool {
	t.Helper()
	if os.Geteuid() != 0 {
		return false
	}
	// One directory for the binary (0755, so uid 65534 can reach it) and
	// one, inside, that the child owns for HOME and TMPDIR. Root removes
	// both whatever the child left there.
	dir, err := os.MkdirTemp("", "rerun-nobody-")
	if err != nil {
		t.Fatalf("rerun as nobody: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	home := filepath.Join(dir, "home")
	bin := filepath.Join(dir, "test.bin")
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatalf("rerun as nobody: %v", err)
	}
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatalf("rerun as nobody: %v", err)
	}
	if err := os.Chown(home, NobodyUID, NobodyGID); err != nil {
		t.Fatalf("rerun as nobody: %v", err)
	}
	if err := copyExecutable(bin); err != nil {
		t.Fatalf("rerun as nobody: copy the test binary: %v", err)
	}

	// -test.run matches each level of a subtest's name on its own.
	parts := strings.Split(t.Name(), "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	args := []string{"-test.run=" + strings.Join(parts, "/"), "-test.count=1", "-test.v"}
	if testing.Short() {
		args = append(args, "-test.short")
	}
	ctx := context.Background()
	if deadline, ok := t.Deadline(); ok {
		// The child gives up a little before the parent's own timeout, so
		// the parent lives to print what the child said.
		left := time.Until(deadline) * 9 / 10
		args = append(args, "-test.timeout="+left.String())
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, left+5*time.Second)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "HOME="+home, "TMPDIR="+home)
	cmd.Dir = home // the checkout may lie under a folder closed to others
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// No Groups: the child drops root's supplementary groups.
		Credential: &syscall.Credential{Uid: NobodyUID, Gid: NobodyGID},
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	runErr := cmd.Run()

	// go test -v prints "--- PASS: Name (…)" for the test and each of its
	// subtests, indented by depth; this test's own line is what counts.
	output := out.String()
	indent := strings.Repeat("    ", strings.Count(t.Name(), "/"))
	said := func(verdict string) bool {
		return strings.Contains("\n"+output, "\n"+indent+"--- "+verdict+": "+t.Name()+" (")
	}
	switch {
	case runErr != nil:
		t.Fatalf("as uid %d: %v:\n%s", NobodyUID, runErr, output)
	case said("PASS"):
		t.Logf("ran as uid %d in a child process: passed", NobodyUID)
	case said("SKIP"):
		t.Skipf("as uid %d the test skipped:\n%s", NobodyUID, output)
	default:
		// Exit 0 but no verdict: the child matched no test ("testing:
		// warning: no tests to run"); never a silent pass.
		t.Fatalf("as uid %d the child ran no test %s:\n%s", NobodyUID, t.Name(), output)
	}
	return true
}

// copyExecutable copies the running test binary to dst, mode 0755.
func copyExecutable(dst string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	src, err := os.Open(exe)
	if err != nil {
		return err
	}
	defer src.Close()
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, src); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Chmod(dst, 0o755) // whatever the umask
}
