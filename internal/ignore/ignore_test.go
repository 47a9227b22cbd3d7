package ignore

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// A case is one path under the root: a folder when dir, and whether it is
// ignored (itself or through a folder it lies in).
type gcase struct {
	path string
	dir  bool
	want bool
}

// groups are ignore files with the verdicts git gives (checked against
// git itself by TestAgainstGit), each from a rule of
// https://git-scm.com/docs/gitignore.
var groups = []struct {
	name  string
	file  string
	cases []gcase
}{
	{"blank lines and comments match nothing", "\n# a comment\n   \n#notes.txt\n", []gcase{
		{"# a comment", false, false}, {"#notes.txt", false, false}, {"a", false, false},
	}},
	{"a backslash before the first hash is a literal hash", "\\#notes.txt\n", []gcase{
		{"#notes.txt", false, true}, {"notes.txt", false, false},
	}},
	{"a backslash before the first ! is a literal !", "\\!important!.txt\n", []gcase{
		{"!important!.txt", false, true}, {"important!.txt", false, false},
	}},
	{"trailing spaces are dropped unless escaped", "foo   \nbar\\ \nbaz\\  \n", []gcase{
		{"foo", false, true}, {"foo ", false, false},
		{"bar ", false, true}, {"bar", false, false},
		{"baz ", false, true}, {"baz", false, false},
	}},
	{"! includes again what an earlier pattern excluded", "*.log\n!keep.log\n", []gcase{
		{"a.log", false, true}, {"sub/b.log", false, true},
		{"keep.log", false, false}, {"sub/keep.log", false, false},
	}},
	{"the last matching pattern decides", "!a.txt\n*.txt\n", []gcase{
		{"a.txt", false, true}, {"b.txt", false, true},
	}},
	{"nothing inside an excluded folder can be included again", "build/\n!build/keep.txt\n!build/sub/\n", []gcase{
		{"build", true, true}, {"build/keep.txt", false, true},
		{"build/sub", true, true}, {"build/sub/x", false, true},
	}},
	{"exclude everything except folder foo/bar", "/*\n!/foo\n/foo/*\n!/foo/bar\n", []gcase{
		{"foo", true, false}, {"foo/bar", true, false}, {"foo/bar/x.c", false, false},
		{"foo/baz", false, true}, {"top.txt", false, true}, {"other", true, true}, {"other/x", false, true},
	}},
	{"hello.* matches at any depth", "hello.*\n", []gcase{
		{"hello.txt", false, true}, {"hello.c", false, true}, {"a/hello.java", false, true}, {"hello", false, false},
	}},
	{"/hello.* matches at the root only", "/hello.*\n", []gcase{
		{"hello.txt", false, true}, {"hello.c", false, true}, {"a/hello.java", false, false},
	}},
	{"foo/ matches folders only, and what they hold", "foo/\n", []gcase{
		{"foo", true, true}, {"foo/x", false, true}, {"a/foo", true, true}, {"a/foo/y", false, true},
		{"b/foo", false, false}, // a file
	}},
	{"a pattern without a slash matches folders too", "node_modules\n", []gcase{
		{"node_modules", true, true}, {"node_modules/x.js", false, true}, {"web/node_modules", true, true},
		{"lib/node_modules", false, true},
	}},
	{"a middle slash anchors: doc/frotz", "doc/frotz\n", []gcase{
		{"doc/frotz", false, true}, {"a/doc/frotz", false, false}, {"doc", true, false},
	}},
	{"a leading slash is not relevant with a middle one: /doc/frotz", "/doc/frotz\n", []gcase{
		{"doc/frotz", false, true}, {"a/doc/frotz", false, false},
	}},
	{"foo/* matches one level (the rest through its folders)", "foo/*\n", []gcase{
		{"foo/test.json", false, true}, {"foo/bar", true, true}, {"foo/bar/hello.c", false, true},
		{"foo", true, false}, {"x/foo/y", false, false},
	}},
	{"* and ? do not match a slash", "a*/b\nf?o\n", []gcase{
		{"ab/b", false, true}, {"a/b", false, true}, {"a/c/b", false, false},
		{"foo", false, true}, {"fxo", false, true}, {"fo", false, false}, {"fooo", false, false},
	}},
	{"classes", "[abc].txt\n[!abc].md\n[0-9]x\n[[:digit:]][[:upper:]].log\n[]]z\n[a-]y\n", []gcase{
		{"a.txt", false, true}, {"d.txt", false, false},
		{"a.md", false, false}, {"d.md", false, true},
		{"5x", false, true}, {"ax", false, false},
		{"1A.log", false, true}, {"1a.log", false, false},
		{"]z", false, true}, {"-y", false, true}, {"ay", false, true}, {"by", false, false},
	}},
	{"a leading **/ matches in every folder", "**/foo\n**/x/bar\n", []gcase{
		{"foo", false, true}, {"a/foo", false, true}, {"a/b/foo", true, true},
		{"x/bar", false, true}, {"k/x/bar", false, true}, {"x/k/bar", false, false},
	}},
	{"a trailing /** matches everything inside", "abc/**\n", []gcase{
		{"abc", true, false}, {"abc/x", false, true}, {"abc/d/e", false, true}, {"z/abc/x", false, false},
	}},
	{"/**/ matches zero or more folders", "a/**/b\n", []gcase{
		{"a/b", false, true}, {"a/x/b", false, true}, {"a/x/y/b", false, true},
		{"z/a/b", false, false}, {"a/bb", false, false},
	}},
	{"other runs of asterisks are one asterisk", "a**b\nx/**y\n", []gcase{
		{"ab", false, true}, {"aqqb", false, true}, {"aq/b", false, false},
		{"x/y", false, true}, {"x/zy", false, true}, {"x/q/y", false, false},
	}},
	{"** alone matches everything", "**\n!keep\n", []gcase{
		{"a", false, true}, {"d", true, true}, {"d/keep", false, true}, {"keep", false, false},
	}},
	{"! with a trailing slash includes folders again", "tmp*\n!tmpdir/\n", []gcase{
		{"tmpfile", false, true}, {"tmpdir", true, false}, {"tmpdir/a", false, false},
	}},
	{"bad patterns are skipped, the others apply", "[abc\n!\n/\n[z-a]x\nq\\\n*.tmp\n[[:nope:]]\n", []gcase{
		{"[abc", false, false}, {"ax", false, false}, {"q", false, false}, {"a.tmp", false, true},
		{"n", false, false},
	}},
}

func TestMatcher(t *testing.T) {
	for _, g := range groups {
		m := Parse([]byte(g.file))
		for _, c := range g.cases {
			if got := m.Ignored(c.path, c.dir); got != c.want {
				t.Errorf("%s: %q (dir %v) ignored %v, want %v", g.name, c.path, c.dir, got, c.want)
			}
		}
	}
}

// Match looks at the path alone (its folders taken as not ignored): the
// spec's "foo/*" does not match foo/bar/hello.c itself.
func TestMatchAlone(t *testing.T) {
	m := Parse([]byte("foo/*\n"))
	if !m.Match("foo/bar", true) || m.Match("foo/bar/hello.c", false) || !m.Ignored("foo/bar/hello.c", false) {
		t.Fatal("foo/* matches foo/bar, not foo/bar/hello.c itself, which is ignored through foo/bar")
	}
}

func TestBadPatterns(t *testing.T) {
	m := Parse([]byte("ok\n[abc\n!\n/\n[z-a]x\nq\\\n*.tmp\n[[:nope:]]\n[/]\n"))
	var lines []int
	for _, b := range m.Bad() {
		lines = append(lines, b.Line)
		if b.Reason == "" || b.Pattern == "" {
			t.Errorf("bad pattern without a reason or text: %+v", b)
		}
	}
	if want := []int{2, 3, 4, 5, 6, 8, 9}; !slices.Equal(lines, want) {
		t.Fatalf("bad lines %v, want %v (%v)", lines, want, m.Bad())
	}
	if m.Len() != 2 {
		t.Fatalf("%d usable patterns, want 2", m.Len())
	}
	if s := m.Bad()[0].String(); s != `line 2 "[abc": unclosed [` {
		t.Fatalf("a bad pattern says %q", s)
	}
}

func TestLineEndings(t *testing.T) {
	m := Parse([]byte("\xef\xbb\xbf*.tmp\r\nbuild/\r\n"))
	if m.Len() != 2 || !m.Ignored("a.tmp", false) || !m.Ignored("build", true) || len(m.Bad()) != 0 {
		t.Fatalf("a BOM and CRLF line ends: %d patterns, bad %v", m.Len(), m.Bad())
	}
}

func TestNilMatcher(t *testing.T) {
	var m *Matcher
	if m.Ignored("a", false) || m.Match("a", true) || m.Len() != 0 || !m.Empty() || m.Bad() != nil {
		t.Fatal("the nil matcher ignores nothing")
	}
}

func TestLoad(t *testing.T) {
	root := t.TempDir()
	if m, err := Load(root); m != nil || err != nil {
		t.Fatalf("no file: %v %v", m, err)
	}
	if err := os.WriteFile(filepath.Join(root, FileName), []byte("*.tmp\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if m, err := Load(root); err != nil || !m.Ignored("x.tmp", false) {
		t.Fatalf("load: %v %v", m, err)
	}
	if err := os.WriteFile(filepath.Join(root, FileName), bytes.Repeat([]byte("a\n"), maxFileSize), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(root); err == nil {
		t.Fatal("an ignore file over the limit loaded")
	}
	must(t, os.Remove(filepath.Join(root, FileName)))
	must(t, os.Mkdir(filepath.Join(root, FileName), 0o755))
	if _, err := Load(root); err == nil {
		t.Fatal("a folder named like the ignore file loaded")
	}
	must(t, os.Remove(filepath.Join(root, FileName)))
	must(t, os.Symlink(filepath.Join(root, "nowhere"), filepath.Join(root, FileName)))
	if _, err := Load(root); err == nil {
		t.Fatal("an ignore file linking to nothing loaded as no file")
	}
}

// The table is git's behaviour, not our reading of its manual: each group
// is checked with git check-ignore in a real tree, when git is installed.
func TestAgainstGit(t *testing.T) {
	gitBin, err := exec.LookPath("git")
	if err != nil {
		t.Skip("git is not installed")
	}
	for _, g := range groups {
		dir := t.TempDir()
		run := func(stdin []byte, args ...string) []byte {
			cmd := exec.Command(gitBin, append([]string{"-C", dir}, args...)...)
			cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir, "XDG_CONFIG_HOME="+dir)
			cmd.Stdin = bytes.NewReader(stdin)
			out, err := cmd.Output()
			if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() == 1 && args[0] == "check-ignore" {
				return out // none ignored
			}
			if err != nil {
				t.Fatalf("%s: git %v: %v", g.name, args, err)
			}
			return out
		}
		run(nil, "init", "-q")
		must(t, os.WriteFile(filepath.Join(dir, ".gitignore"), []byte(g.file), 0o644))
		var in []byte
		for _, c := range g.cases {
			p := filepath.Join(dir, filepath.FromSlash(c.path))
			if c.dir {
				must(t, os.MkdirAll(p, 0o755))
			} else {
				must(t, os.MkdirAll(filepath.Dir(p), 0o755))
				must(t, os.WriteFile(p, nil, 0o644))
			}
			in = append(append(in, c.path...), 0)
		}
		ignored := map[string]bool{}
		for _, p := range bytes.Split(run(in, "check-ignore", "--stdin", "-z"), []byte{0}) {
			ignored[string(p)] = true
		}
		for _, c := range g.cases {
			if ignored[c.path] != c.want {
				t.Errorf("%s: git says %q ignored %v; the table says %v", g.name, c.path, ignored[c.path], c.want)
			}
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func BenchmarkMatch(b *testing.B) {
	m := Parse([]byte("*.tmp\nbuild/\n!keep.tmp\n/docs/**/draft-*\n[Tt]humbs.db\n"))
	paths := []string{"photos/2024/img-0001.jpg", "src/build", "docs/a/b/draft-1.md", "x/Thumbs.db", "a/b/c/keep.tmp"}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		m.Ignored(paths[i%len(paths)], i%2 == 1)
	}
}
