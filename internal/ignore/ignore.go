// Package ignore reads a location's ignore file (.lsyncignore, at the
// location's root) and says which paths under the location it keeps out
// of the library. The syntax is gitignore's (https://git-scm.com/docs/gitignore),
// for one file at the root:
//
//   - blank lines match nothing; a line starting with # is a comment;
//     \# and \! at the start stand for a literal # or !;
//   - trailing spaces are dropped unless escaped with a backslash;
//   - ! negates: a path an earlier pattern excluded is included again,
//     except that nothing inside an excluded folder can be included again
//     (the folder is not walked);
//   - a slash at the start or in the middle anchors the pattern to the
//     location's root; without one the pattern matches a name at any depth;
//   - a slash at the end matches folders only;
//   - * and ? match anything but a slash, [...] one character of a class
//     ([!...] and [^...] negate it; [:alpha:] and the other POSIX classes
//     work); a leading **/ matches in every folder, a trailing /** matches
//     everything inside, and /**/ in the middle zero or more folders.
//
// The last pattern that matches a path decides. Paths are relative to the
// location's root, slash-separated, and matched case-sensitively.
//
// Where git silently matches nothing (an unclosed [, a reversed range, a
// pattern ending in a lone backslash, a bare ! or /), a pattern is bad:
// it is skipped, the others still apply, and Bad names it with its line so
// the user can fix it. A matcher never fails as a whole.
//
// Hazards: ? matches one character (a rune), where git matches one byte;
// a \r before the line end is dropped (files edited on Windows), as git
// does; .lsyncignore files in sub-folders are not read.
package ignore

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// FileName is the ignore file at a location's root.
const FileName = ".lsyncignore"

// maxFileSize bounds what is read of an ignore file: a larger one is an
// error, not a reason to allocate without limit.
const maxFileSize = 1 << 20

// BadPattern is a pattern that was skipped, and why.
type BadPattern struct {
	Line    int    `json:"line"`
	Pattern string `json:"pattern"`
	Reason  string `json:"reason"`
}

func (b BadPattern) String() string {
	return fmt.Sprintf("line %d %q: %s", b.Line, b.Pattern, b.Reason)
}

// Matcher holds the patterns of one ignore file. The nil *Matcher (no
// ignore file) ignores nothing; a Matcher is safe for concurrent use.
type Matcher struct {
	patterns []pattern
	bad      []BadPattern
}

// pattern is one usable line.
type pattern struct {
	line    int
	negate  bool // a ! pattern: a match includes the path again
	dirOnly bool // a trailing slash: matches folders only
	// base: the pattern has no slash and matches a path's last name;
	// otherwise it matches the whole path from the root.
	base bool
	// How it matches, the fastest that says the same: a literal, a
	// literal suffix (*.tmp), or the regular expression.
	literal string
	suffix  string
	re      *regexp.Regexp
}

// Load reads the ignore file at root. No file is no patterns (nil, nil);
// a file that cannot be read is an error (the caller must not then take
// every ignored path for one to index).
func Load(root string) (*Matcher, error) {
	p := filepath.Join(root, FileName)
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		if _, lerr := os.Lstat(p); lerr == nil {
			return nil, fmt.Errorf("ignore file %s is a link to nothing", p)
		}
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ignore file: %w", err)
	}
	defer f.Close()
	if info, err := f.Stat(); err != nil {
		return nil, fmt.Errorf("ignore file: %w", err)
	} else if !info.Mode().IsRegular() {
		return nil, fmt.Errorf("ignore file %s is not a regular file", p)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("ignore file: %w", err)
	}
	if len(b) > maxFileSize {
		return nil, fmt.Errorf("ignore file %s is larger than %d bytes", p, maxFileSize)
	}
	return Parse(b), nil
}

// Parse reads the patterns of an ignore file's contents.
func Parse(data []byte) *Matcher {
	m := &Matcher{}
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf")) // a UTF-8 byte order mark
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSuffix(line, "\r")
		if strings.HasPrefix(line, "#") {
			continue
		}
		line = trimTrailingSpaces(line)
		if line == "" {
			continue
		}
		p, err := compile(line)
		if err != nil {
			m.bad = append(m.bad, BadPattern{Line: i + 1, Pattern: line, Reason: err.Error()})
			continue
		}
		p.line = i + 1
		m.patterns = append(m.patterns, p)
	}
	return m
}

// trimTrailingSpaces drops the spaces at the end of a line that no
// backslash escapes ("a\ " keeps its space; "a\  " keeps one).
func trimTrailingSpaces(s string) string {
	end := len(s)
	for end > 0 && s[end-1] == ' ' {
		// An odd number of backslashes before this space escapes it.
		n := 0
		for j := end - 2; j >= 0 && s[j] == '\\'; j-- {
			n++
		}
		if n%2 == 1 {
			break
		}
		end--
	}
	return s[:end]
}

// compile turns one line (not blank, not a comment) into a pattern.
func compile(line string) (pattern, error) {
	var p pattern
	if strings.HasPrefix(line, "!") {
		p.negate = true
		line = line[1:]
	}
	if strings.HasSuffix(line, "/") {
		p.dirOnly = true
		line = line[:len(line)-1]
	}
	if line == "" {
		return p, errors.New("empty pattern")
	}
	// A slash at the start or in the middle anchors the pattern to the
	// root (a leading one is not part of what it matches).
	p.base = !strings.Contains(line, "/")
	line = strings.TrimPrefix(line, "/")
	if line == "" {
		return p, errors.New("empty pattern")
	}
	expr, lit, err := translate(line)
	if err != nil {
		return p, err
	}
	switch {
	case lit != "" || expr == "":
		p.literal = lit
	case p.base && len(line) > 1 && line[0] == '*' && !strings.ContainsAny(line[1:], `*?[\`):
		p.suffix = line[1:]
	default:
		re, err := regexp.Compile("(?s)^" + expr + "$")
		if err != nil {
			return p, fmt.Errorf("bad pattern: %w", err)
		}
		p.re = re
	}
	return p, nil
}

// translate turns a glob into a regular expression; lit is the glob's
// text when it has no wildcard (and then expr is unused).
func translate(glob string) (expr, lit string, err error) {
	var b strings.Builder
	var plain strings.Builder
	wild := false
	for i := 0; i < len(glob); {
		c := glob[i]
		// ** is special only as a whole name: after the start or a slash,
		// before the end or a slash.
		atStart := i == 0 || glob[i-1] == '/'
		switch c {
		case '\\':
			if i+1 >= len(glob) {
				return "", "", errors.New("ends in a lone backslash")
			}
			r := nextRune(glob[i+1:])
			b.WriteString(regexp.QuoteMeta(r))
			plain.WriteString(r)
			i += 1 + len(r)
		case '*':
			wild = true
			if strings.HasPrefix(glob[i:], "**") && atStart && (i+2 == len(glob) || glob[i+2] == '/') {
				switch {
				case i+2 == len(glob):
					b.WriteString(".*") // trailing /** (or ** alone): everything
					i += 2
				default:
					b.WriteString("(?:.*/)?") // leading **/ or middle /**/: zero or more folders
					i += 3
				}
				continue
			}
			// Other runs of asterisks are one asterisk.
			for i < len(glob) && glob[i] == '*' {
				i++
			}
			b.WriteString("[^/]*")
		case '?':
			wild = true
			b.WriteString("[^/]")
			i++
		case '[':
			wild = true
			class, n, err := translateClass(glob[i:])
			if err != nil {
				return "", "", err
			}
			b.WriteString(class)
			i += n
		default:
			r := nextRune(glob[i:])
			b.WriteString(regexp.QuoteMeta(r))
			plain.WriteString(r)
			i += len(r)
		}
	}
	if !wild {
		return "", plain.String(), nil
	}
	return b.String(), "", nil
}

func nextRune(s string) string {
	for i := range s {
		if i > 0 {
			return s[:i]
		}
	}
	return s
}

// posixClasses are the [:name:] classes, as regular expression class
// items; those that hold a slash leave it out (a class never matches one).
var posixClasses = map[string]string{
	"alnum": "0-9A-Za-z", "alpha": "A-Za-z", "blank": `\t `, "cntrl": `\x00-\x1f\x7f`,
	"digit": "0-9", "graph": `!-.0-~`, "lower": "a-z", "print": ` -.0-~`,
	"punct": `!-.:-@\[-` + "`" + `{-~`, "space": `\t-\r `, "upper": "A-Z", "xdigit": "0-9A-Fa-f",
}

// translateClass turns the bracket expression at the start of s into a
// regular expression class that never matches a slash, and says how many
// bytes of s it took.
func translateClass(s string) (string, int, error) {
	i := 1
	negate := false
	if i < len(s) && (s[i] == '!' || s[i] == '^') {
		negate = true
		i++
	}
	var items []string
	first := true
	for {
		if i >= len(s) {
			return "", 0, errors.New("unclosed [")
		}
		c := s[i]
		if c == ']' && !first {
			i++
			break
		}
		first = false
		if c == '[' && strings.HasPrefix(s[i:], "[:") {
			end := strings.Index(s[i+2:], ":]")
			if end < 0 {
				return "", 0, errors.New("unclosed [:")
			}
			name := s[i+2 : i+2+end]
			cls, ok := posixClasses[name]
			if !ok {
				return "", 0, fmt.Errorf("unknown class [:%s:]", name)
			}
			items = append(items, cls)
			i += 2 + end + 2
			continue
		}
		lo, n, err := classChar(s[i:])
		if err != nil {
			return "", 0, err
		}
		i += n
		hi := lo
		if i+1 < len(s) && s[i] == '-' && s[i+1] != ']' {
			h, n, err := classChar(s[i+1:])
			if err != nil {
				return "", 0, err
			}
			if h < lo {
				return "", 0, fmt.Errorf("reversed range %c-%c", lo, h)
			}
			hi = h
			i += 1 + n
		}
		// A class never matches a slash: a range over one is split.
		switch {
		case lo == '/' && hi == '/':
		case lo <= '/' && '/' <= hi:
			if lo < '/' {
				items = append(items, classRange(lo, '/'-1))
			}
			if hi > '/' {
				items = append(items, classRange('/'+1, hi))
			}
		default:
			items = append(items, classRange(lo, hi))
		}
	}
	var b strings.Builder
	if negate {
		b.WriteString("[^/")
		for _, it := range items {
			b.WriteString(it)
		}
		b.WriteString("]")
		return b.String(), i, nil
	}
	if len(items) == 0 {
		return "", 0, errors.New("a class that matches nothing")
	}
	b.WriteString("[")
	for _, it := range items {
		b.WriteString(it)
	}
	b.WriteString("]")
	return b.String(), i, nil
}

// classChar reads one character of a class (escaped or not).
func classChar(s string) (rune, int, error) {
	n := 0
	if s[0] == '\\' {
		if len(s) < 2 {
			return 0, 0, errors.New("unclosed [")
		}
		n = 1
	}
	r := []rune(nextRune(s[n:]))[0]
	return r, n + len(string(r)), nil
}

func classRange(lo, hi rune) string {
	q := func(r rune) string { return fmt.Sprintf(`\x{%x}`, r) }
	if lo == hi {
		return q(lo)
	}
	return q(lo) + "-" + q(hi)
}

// Len is how many usable patterns there are.
func (m *Matcher) Len() int {
	if m == nil {
		return 0
	}
	return len(m.patterns)
}

// Bad lists the patterns that were skipped.
func (m *Matcher) Bad() []BadPattern {
	if m == nil {
		return nil
	}
	return m.bad
}

// Empty says whether m ignores nothing at all.
func (m *Matcher) Empty() bool { return m.Len() == 0 }

// Match reports whether rel (a path under the root, slash-separated, no
// leading slash; dir: it is a folder) is ignored by the last pattern that
// matches it, taking its parent folders as not ignored: what a walk that
// does not descend into ignored folders asks.
func (m *Matcher) Match(rel string, dir bool) bool {
	if m == nil || rel == "" {
		return false
	}
	base := rel[strings.LastIndexByte(rel, '/')+1:]
	for i := len(m.patterns) - 1; i >= 0; i-- {
		p := &m.patterns[i]
		if p.dirOnly && !dir {
			continue
		}
		subject := rel
		if p.base {
			subject = base
		}
		if p.matches(subject) {
			return !p.negate
		}
	}
	return false
}

func (p *pattern) matches(s string) bool {
	switch {
	case p.re != nil:
		return p.re.MatchString(s)
	case p.suffix != "":
		return strings.HasSuffix(s, p.suffix)
	default:
		return s == p.literal
	}
}

// Ignored reports whether rel is ignored, itself or because a folder it
// lies in is (nothing inside an ignored folder can be included again).
func (m *Matcher) Ignored(rel string, dir bool) bool {
	if m.Empty() {
		return false
	}
	for i := 0; i < len(rel); i++ {
		if rel[i] == '/' && m.Match(rel[:i], true) {
			return true
		}
	}
	return m.Match(rel, dir)
}
