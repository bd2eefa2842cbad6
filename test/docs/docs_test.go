// Package docs checks the documentation: README.md, docs/*.md, the design
// notes docs/design/*.md and the generated references in docs/reference/
// (make docs). Every
// relative link resolves to a file of the repository (and, with a
// #fragment, to a heading of that file by GitHub's anchor rules), nothing
// points outside the repository, every `make <target>` named exists in the
// Makefile, and every gpufleet command line in a code block or code span
// names commands and flags that the built binary's --help lists. No
// tracked file speaks of the documents gpufleet was first specified from:
// the repository says what gpufleet does in its own words
// (docs/requirements.md). No cluster is needed.
package docs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"
)

// repoRoot is the repository root, two levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root %s: %v", root, err)
	}
	return root
}

// page is one Markdown file, split into prose and code.
type page struct {
	rel   string // path relative to the repository root
	lines []string
	// isFence[i] says whether line i is inside a fenced code block, and
	// lang[i] is that block's info string ("" for an unlabelled block).
	isFence []bool
	lang    []string
	// fenceLine[i] is true for the fence lines (```) themselves.
	fenceLine []bool
}

var fenceRE = regexp.MustCompile("^\\s*(```+|~~~+)\\s*([A-Za-z0-9_+-]*)")

func readPage(t *testing.T, root, rel string) *page {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	p := &page{rel: rel, lines: strings.Split(string(data), "\n")}
	var open string // the fence that opened the current block
	var lang string
	for _, l := range p.lines {
		m := fenceRE.FindStringSubmatch(l)
		switch {
		case open == "" && m != nil:
			open, lang = m[1], m[2]
			p.isFence, p.lang, p.fenceLine = append(p.isFence, false), append(p.lang, ""), append(p.fenceLine, true)
			continue
		case open != "" && m != nil && strings.HasPrefix(strings.TrimSpace(l), open) && strings.TrimSpace(l) == strings.TrimSpace(m[1]):
			open, lang = "", ""
			p.isFence, p.lang, p.fenceLine = append(p.isFence, false), append(p.lang, ""), append(p.fenceLine, true)
			continue
		}
		p.isFence = append(p.isFence, open != "")
		p.lang = append(p.lang, lang)
		p.fenceLine = append(p.fenceLine, false)
	}
	return p
}

// pages are README.md, every docs/*.md, every design note
// docs/design/*.md and every page of the generated references,
// docs/reference/**/*.md (make docs).
func pages(t *testing.T, root string) []*page {
	t.Helper()
	rels := []string{"README.md"}
	var docs []string
	for _, glob := range []string{"*.md", filepath.Join("design", "*.md")} {
		found, err := filepath.Glob(filepath.Join(root, "docs", glob))
		if err != nil {
			t.Fatal(err)
		}
		if len(found) == 0 {
			t.Fatalf("no docs/%s", filepath.ToSlash(glob))
		}
		docs = append(docs, found...)
	}
	err := filepath.WalkDir(filepath.Join(root, "docs", "reference"), func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".md") {
			docs = append(docs, path)
		}
		return err
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	for _, d := range docs {
		rel, err := filepath.Rel(root, d)
		if err != nil {
			t.Fatal(err)
		}
		rels = append(rels, filepath.ToSlash(rel))
	}
	var ps []*page
	for _, r := range rels {
		ps = append(ps, readPage(t, root, r))
	}
	return ps
}

var codeSpanRE = regexp.MustCompile("(`+)(.+?)(`+)")

// proseWithoutCode is a prose line with its code spans blanked, so that
// link syntax inside code is not taken for a link.
func proseWithoutCode(l string) string {
	return codeSpanRE.ReplaceAllStringFunc(l, func(s string) string { return strings.Repeat(" ", len(s)) })
}

// codeSpans are the contents of a prose line's code spans.
func codeSpans(l string) []string {
	var out []string
	for _, m := range codeSpanRE.FindAllStringSubmatch(l, -1) {
		if len(m[1]) == len(m[3]) {
			out = append(out, strings.TrimSpace(m[2]))
		}
	}
	return out
}

// GitHub's heading anchors: lower case; every character that is not a
// letter, digit, space, hyphen or underscore removed; spaces to hyphens;
// a repeated anchor gets -1, -2, … appended.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

var (
	headingRE    = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	inlineLinkRE = regexp.MustCompile(`!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	refDefRE     = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*(\S+)`)
	htmlLinkRE   = regexp.MustCompile(`(?:href|src)="([^"]+)"`)
)

// anchors are the heading anchors of a page.
func (p *page) anchors() map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for i, l := range p.lines {
		if p.isFence[i] || p.fenceLine[i] {
			continue
		}
		m := headingRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		// Link text stays, the link target goes.
		text := inlineLinkRE.ReplaceAllString(m[2], "$1")
		a := anchor(text)
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// links are the link targets of a page's prose, with their line numbers.
func (p *page) links() (targets []string, lineNos []int) {
	for i, l := range p.lines {
		if p.isFence[i] || p.fenceLine[i] {
			continue
		}
		prose := proseWithoutCode(l)
		for _, m := range inlineLinkRE.FindAllStringSubmatch(prose, -1) {
			targets, lineNos = append(targets, m[2]), append(lineNos, i+1)
		}
		for _, m := range htmlLinkRE.FindAllStringSubmatch(prose, -1) {
			targets, lineNos = append(targets, m[1]), append(lineNos, i+1)
		}
		if m := refDefRE.FindStringSubmatch(prose); m != nil {
			targets, lineNos = append(targets, m[1]), append(lineNos, i+1)
		}
	}
	return targets, lineNos
}

func TestRelativeLinksResolve(t *testing.T) {
	root := repoRoot(t)
	ps := pages(t, root)
	anchorsOf := map[string]map[string]bool{}
	for _, p := range ps {
		anchorsOf[p.rel] = p.anchors()
	}
	checked := 0
	for _, p := range ps {
		targets, lineNos := p.links()
		for k, target := range targets {
			where := fmt.Sprintf("%s:%d: link %q", p.rel, lineNos[k], target)
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			checked++
			file, frag, _ := strings.Cut(target, "#")
			dest := p.rel
			if file != "" {
				dest = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(p.rel), file)))
			}
			if dest == ".." || strings.HasPrefix(dest, "../") || filepath.IsAbs(file) {
				t.Errorf("%s points outside the repository", where)
				continue
			}
			info, err := os.Stat(filepath.Join(root, dest))
			if err != nil {
				t.Errorf("%s: %s does not exist", where, dest)
				continue
			}
			if frag == "" {
				continue
			}
			if info.IsDir() || !strings.HasSuffix(dest, ".md") {
				t.Errorf("%s: #%s on %s, which is not a Markdown file", where, frag, dest)
				continue
			}
			anchors, ok := anchorsOf[dest]
			if !ok {
				anchors = readPage(t, root, dest).anchors()
				anchorsOf[dest] = anchors
			}
			if !anchors[frag] {
				t.Errorf("%s: %s has no heading with anchor #%s", where, dest, frag)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative links found: the parser is broken")
	}
}

// TestNothingPointsOutside: no page refers to files outside the
// repository (a sibling checkout, a specification kept elsewhere).
func TestNothingPointsOutside(t *testing.T) {
	root := repoRoot(t)
	outside := regexp.MustCompile(`\.\./shared\b|(^|[^A-Za-z])SPEC([^A-Za-z]|$)|SPEC\.md`)
	for _, p := range pages(t, root) {
		for i, l := range p.lines {
			if outside.MatchString(l) {
				t.Errorf("%s:%d refers to something outside the repository: %s", p.rel, i+1, strings.TrimSpace(l))
			}
		}
	}
}

// originWording matches the phrases that named the documents gpufleet was
// first specified from, and the names built from them (a test, a helper, a
// test data file); TestOriginWording shows which. The [d] keeps this file
// from matching itself. A random seed (chaos.seed, "the same seed", fuzz
// seeds) is no such reference.
var originWording = regexp.MustCompile(`(?i)\bthe see[d]'s\b|see[d][ _.-]?(document|shortcoming|policy|clusterpolicy|example)`)

// trackedTextFiles are the repository's tracked files (git ls-files; every
// file under root but .git and bin/ when git is not at hand) that are
// text, without the tools' own modules (hack/tools) and the go.sum files.
func trackedTextFiles(t *testing.T, root string) map[string][]byte {
	t.Helper()
	var rels []string
	cmd := exec.Command("git", "ls-files", "-z")
	cmd.Dir = root
	if out, err := cmd.Output(); err == nil {
		for _, rel := range strings.Split(string(out), "\x00") {
			if rel != "" {
				rels = append(rels, rel)
			}
		}
	} else {
		t.Logf("git ls-files: %v; reading every file under %s", err, root)
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			rel = filepath.ToSlash(rel)
			if d.IsDir() && (rel == ".git" || rel == "bin") {
				return filepath.SkipDir
			}
			if !d.IsDir() {
				rels = append(rels, rel)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	files := map[string][]byte{}
	for _, rel := range rels {
		if strings.HasPrefix(rel, "hack/tools/") || path.Base(rel) == "go.sum" {
			continue
		}
		data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted in the work tree, not yet in the index
		}
		if err != nil {
			t.Fatal(err)
		}
		if bytes.IndexByte(data[:min(len(data), 8000)], 0) >= 0 {
			continue // binary
		}
		files[rel] = data
	}
	if len(files) == 0 {
		t.Fatal("no tracked text files found")
	}
	return files
}

// TestNoOriginDocumentWording: no tracked file refers to the documents
// gpufleet was first specified from; the requirements are
// docs/requirements.md, and the code, tests and docs say what gpufleet
// does in their own words.
func TestNoOriginDocumentWording(t *testing.T) {
	root := repoRoot(t)
	files := trackedTextFiles(t, root)
	rels := make([]string, 0, len(files))
	for rel := range files {
		rels = append(rels, rel)
	}
	sort.Strings(rels)
	for _, rel := range rels {
		if originWording.MatchString(rel) {
			t.Errorf("%s: the file's name refers to the origin documents; name it after what it holds", rel)
		}
		for i, l := range strings.Split(string(files[rel]), "\n") {
			if m := originWording.FindString(l); m != "" {
				t.Errorf("%s:%d: %q refers to the origin documents; say what gpufleet does (docs/requirements.md): %s", rel, i+1, m, strings.TrimSpace(l))
			}
		}
	}
}

// TestOriginWording pins what originWording matches; each phrase is split
// in two so that this file does not match it.
func TestOriginWording(t *testing.T) {
	for text, want := range map[string]bool{
		"the se" + "ed's 1.x shape":                       true,
		"The ClusterPolicy of the se" + "ed document":     true,
		"(se" + "ed shortcoming, issue 14)":               true,
		"not enabled by the se" + "ed policy":             true,
		"the se" + "ed ClusterPolicy":                     true,
		"testdata/se" + "ed-clusterpolicy.yaml":           true,
		"func TestSe" + "edPolicyDeploysTheStack(":        true,
		"\"se" + "ed example 1: 10 available nodes\"":     true,
		"newNM(n, node, \"se" + "ed.example\")":           true,
		"-chaos.seed=42":                                  false,
		"the same seed before and after":                  false,
		"simGPUNamespace seeds the simulated GPUs' UUIDs": false,
		"randomSnapshot(30, 40, 5, seed)":                 false,
		"// Seeds: the samples in pieces":                 false,
	} {
		if got := originWording.MatchString(text); got != want {
			t.Errorf("originWording.MatchString(%q) = %t, want %t", text, got, want)
		}
	}
}

// makeTargets are the targets the Makefile defines.
func makeTargets(t *testing.T, root string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	rule := regexp.MustCompile(`^([A-Za-z0-9_.-]+(?:\s+[A-Za-z0-9_.-]+)*)\s*:([^=]|$)`)
	out := map[string]bool{}
	for _, l := range strings.Split(string(data), "\n") {
		m := rule.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		for _, name := range strings.Fields(m[1]) {
			if !strings.HasPrefix(name, ".") {
				out[name] = true
			}
		}
	}
	if !out["dev"] || !out["test"] {
		t.Fatalf("Makefile targets %v lack dev or test: the parser is broken", out)
	}
	return out
}

// codeTexts are the pieces of code of a page: every line of a fenced
// block (for a console block, only the commands after a "$ " prompt), and
// every code span of the prose, each with its line number. Blocks of data
// (yaml, json, text, …) are left out.
func (p *page) codeTexts() (texts []string, lineNos []int) {
	for i, l := range p.lines {
		switch {
		case p.fenceLine[i]:
		case p.isFence[i]:
			switch p.lang[i] {
			case "", "sh", "bash", "shell":
				// A flag's line of a usage (the Options blocks of
				// docs/reference/cli) is no command.
				if p.lang[i] == "" && flagLineRE.MatchString(l) {
					continue
				}
				texts, lineNos = append(texts, l), append(lineNos, i+1)
			case "console":
				if cmd, ok := strings.CutPrefix(strings.TrimSpace(l), "$ "); ok {
					texts, lineNos = append(texts, cmd), append(lineNos, i+1)
				}
			}
		default:
			for _, c := range codeSpans(l) {
				texts, lineNos = append(texts, c), append(lineNos, i+1)
			}
		}
	}
	return texts, lineNos
}

var makeRE = regexp.MustCompile(`(?:^|[\s;&|(])make\s+([^\s;&|)` + "`" + `]+(?:\s+[^\s;&|)` + "`" + `]+)*)`)

func TestMakeTargetsExist(t *testing.T) {
	root := repoRoot(t)
	targets := makeTargets(t, root)
	found := 0
	for _, p := range pages(t, root) {
		texts, lineNos := p.codeTexts()
		for k, text := range texts {
			code, _, _ := strings.Cut(text, "#")
			for _, m := range makeRE.FindAllStringSubmatch(code, -1) {
				for _, word := range strings.Fields(m[1]) {
					if strings.HasPrefix(word, "-") || strings.Contains(word, "=") {
						continue
					}
					found++
					if !targets[word] {
						t.Errorf("%s:%d: make %s: no such target in the Makefile", p.rel, lineNos[k], word)
					}
					break // the first target; what follows is the target's arguments
				}
			}
		}
	}
	if found == 0 {
		t.Fatal("no make commands found: the parser is broken")
	}
}

// cli is the gpufleet binary's command tree as its --help shows it.
type cli struct {
	bin  string
	mu   sync.Mutex
	help map[string]helpPage // by command path, "" for the root
}

type helpPage struct {
	subcommands map[string]bool
	flags       map[string]bool // "--name" and "-x"
}

var (
	commandLineRE = regexp.MustCompile(`^\s{2}([a-z][a-z0-9-]*)\s+\S`) // cobra pads names to the longest: one space after it
	flagLineRE    = regexp.MustCompile(`^\s+(?:(-[A-Za-z0-9]),\s+)?(--[A-Za-z0-9-]+)`)
)

// buildCLI builds cmd/gpufleet once for the test binary.
func buildCLI(t *testing.T, root string) *cli {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "gpufleet")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/gpufleet")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/gpufleet: %v\n%s", err, out)
	}
	return &cli{bin: bin, help: map[string]helpPage{}}
}

// helpOf runs gpufleet <path> --help and parses its commands and flags.
func (c *cli) helpOf(t *testing.T, path []string) helpPage {
	t.Helper()
	key := strings.Join(path, " ")
	c.mu.Lock()
	defer c.mu.Unlock()
	if h, ok := c.help[key]; ok {
		return h
	}
	args := append(append([]string{}, path...), "--help")
	cmd := exec.Command(c.bin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG=/dev/null")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("gpufleet %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	h := helpPage{subcommands: map[string]bool{}, flags: map[string]bool{"--help": true, "-h": true}}
	section := ""
	for _, l := range strings.Split(string(out), "\n") {
		if l != "" && !strings.HasPrefix(l, " ") {
			section = strings.TrimSuffix(strings.TrimSpace(l), ":")
			continue
		}
		switch section {
		case "Available Commands", "Additional Commands":
			if m := commandLineRE.FindStringSubmatch(l); m != nil {
				h.subcommands[m[1]] = true
			}
		case "Flags", "Global Flags":
			if m := flagLineRE.FindStringSubmatch(l); m != nil {
				h.flags[m[2]] = true
				if m[1] != "" {
					h.flags[m[1]] = true
				}
			}
		}
	}
	c.help[key] = h
	return h
}

// shellWords splits a command on blanks, keeping quoted strings whole.
func shellWords(s string) []string {
	var words []string
	var b strings.Builder
	var quote rune
	inWord := false
	for _, r := range s {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				b.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, b.String())
				b.Reset()
				inWord = false
			}
		default:
			b.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, b.String())
	}
	return words
}

var segmentSep = regexp.MustCompile(`\|\||&&|[|;]|\$\(|\)`)

// gpufleetInvocations finds the gpufleet command lines in a piece of code:
// the words after gpufleet (or a path ending in /gpufleet, or kubectl
// gpufleet) in command position, up to the end of that command.
func gpufleetInvocations(code string) [][]string {
	if i := strings.Index(code, " #"); i >= 0 {
		code = code[:i]
	}
	if strings.HasPrefix(strings.TrimSpace(code), "#") {
		return nil
	}
	var out [][]string
	for _, seg := range segmentSep.Split(code, -1) {
		words := shellWords(strings.TrimSpace(seg))
		// Skip shell keywords and environment assignments before the command.
		for len(words) > 0 && (words[0] == "do" || words[0] == "then" || words[0] == "else" || words[0] == "time" ||
			(strings.Contains(words[0], "=") && !strings.HasPrefix(words[0], "-"))) {
			words = words[1:]
		}
		if len(words) > 1 && words[0] == "kubectl" && words[1] == "gpufleet" {
			words = words[1:]
		}
		if len(words) == 0 || (words[0] != "gpufleet" && !strings.HasSuffix(words[0], "/gpufleet")) {
			continue
		}
		out = append(out, words[1:])
	}
	return out
}

func TestGpufleetCommandsExist(t *testing.T) {
	root := repoRoot(t)
	var c *cli
	found := 0
	for _, p := range pages(t, root) {
		texts, lineNos := p.codeTexts()
		for k, text := range texts {
			for _, args := range gpufleetInvocations(text) {
				if c == nil {
					c = buildCLI(t, root)
				}
				found++
				where := fmt.Sprintf("%s:%d: gpufleet %s", p.rel, lineNos[k], strings.Join(args, " "))
				var path []string
				h := c.helpOf(t, path)
				descend := true
				for _, a := range args {
					switch {
					case a == "…" || a == "...":
						// an elided rest of the command line
					case strings.HasPrefix(a, "-"):
						name, _, _ := strings.Cut(a, "=")
						if name == "-" || name == "--" {
							continue
						}
						if !h.flags[name] {
							t.Errorf("%s: %s has no flag %s", where, strings.Join(append([]string{"gpufleet"}, path...), " "), name)
						}
					case descend && len(h.subcommands) > 0:
						if !h.subcommands[a] {
							t.Errorf("%s: %s has no command %q", where, strings.Join(append([]string{"gpufleet"}, path...), " "), a)
							descend = false
							continue
						}
						path = append(path, a)
						h = c.helpOf(t, path)
					default:
						descend = false // an argument: no more subcommands
					}
				}
			}
		}
	}
	if found == 0 {
		t.Fatal("no gpufleet commands found: the parser is broken")
	}
}

// TestAnchorRules pins the GitHub anchor rules the link check relies on.
func TestAnchorRules(t *testing.T) {
	for heading, want := range map[string]string{
		"Maintenance (`maintenance.nvidia.com/v1alpha1`)":                          "maintenance-maintenancenvidiacomv1alpha1",
		"GPU faults: detect, isolate the card, drain only its pods, reset, reboot": "gpu-faults-detect-isolate-the-card-drain-only-its-pods-reset-reboot",
		"What the policy's fields set":                                             "what-the-policys-fields-set",
		"`driver.manager`":                                                         "drivermanager",
		"Adopt, don't duplicate":                                                   "adopt-dont-duplicate",
		"One driver per node pool: NVIDIADriver (`nvidia.com/v1alpha1`)":           "one-driver-per-node-pool-nvidiadriver-nvidiacomv1alpha1",
		"Operations: running the operator, metrics, alerts, dashboards, runbooks":  "operations-running-the-operator-metrics-alerts-dashboards-runbooks",
		"snake_case and — dashes":                                                  "snake_case-and--dashes",
	} {
		if got := anchor(heading); got != want {
			t.Errorf("anchor(%q) = %q, want %q", heading, got, want)
		}
	}
}

// TestPagesAreListed: every docs page is reachable from the index by
// links between docs pages, so none is orphaned: the hand-written pages
// are linked from their directory's index (docs/*.md from docs/README.md,
// the design notes docs/design/*.md from docs/design/README.md, and
// docs/design/README.md from docs/README.md), the generated references of
// docs/reference/ from docs/README.md or from one another (a command's page
// from its parent's).
func TestPagesAreListed(t *testing.T) {
	root := repoRoot(t)
	byRel := map[string]*page{}
	for _, p := range pages(t, root) {
		byRel[p.rel] = p
	}
	reached := map[string]bool{"docs/README.md": true}
	queue := []string{"docs/README.md"}
	for len(queue) > 0 {
		p := byRel[queue[0]]
		queue = queue[1:]
		if p == nil {
			continue
		}
		targets, _ := p.links()
		for _, target := range targets {
			file, _, _ := strings.Cut(target, "#")
			if file == "" || strings.Contains(file, "://") {
				continue
			}
			dest := filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(p.rel), file)))
			if !reached[dest] && strings.HasPrefix(dest, "docs/") {
				reached[dest] = true
				queue = append(queue, dest)
			}
		}
	}
	var missing []string
	for rel := range byRel {
		if strings.HasPrefix(rel, "docs/") && !reached[rel] {
			missing = append(missing, rel)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("no links lead from docs/README.md to %v", missing)
	}
	// The hand-written pages are in their directory's index itself.
	linkedFrom := map[string]map[string]bool{} // index page -> pages it links
	notLinked := map[string][]string{}         // index page -> pages it misses
	for rel := range byRel {
		if !strings.HasPrefix(rel, "docs/") || strings.HasPrefix(rel, "docs/reference/") || rel == "docs/README.md" {
			continue
		}
		index := indexOf(rel)
		linked, ok := linkedFrom[index]
		if !ok {
			linked = map[string]bool{}
			if p := byRel[index]; p != nil {
				targets, _ := p.links()
				for _, target := range targets {
					file, _, _ := strings.Cut(target, "#")
					if file != "" && !strings.Contains(file, "://") {
						linked[path.Clean(path.Join(path.Dir(index), file))] = true
					}
				}
			}
			linkedFrom[index] = linked
		}
		if !linked[rel] {
			notLinked[index] = append(notLinked[index], rel)
		}
	}
	for index, missing := range notLinked {
		sort.Strings(missing)
		if byRel[index] == nil {
			t.Errorf("%v need an index page %s", missing, index)
			continue
		}
		t.Errorf("%s does not link %v", index, missing)
	}
}

// indexOf is the index page that must link a hand-written docs page: the
// README.md of its directory, or for a directory's README.md, the
// README.md of the directory above.
func indexOf(rel string) string {
	dir := path.Dir(rel)
	if path.Base(rel) == "README.md" {
		dir = path.Dir(dir)
	}
	return path.Join(dir, "README.md")
}

func TestIndexOf(t *testing.T) {
	for rel, want := range map[string]string{
		"docs/gpu-stack.md":         "docs/README.md",
		"docs/design/evictor.md":    "docs/design/README.md",
		"docs/design/README.md":     "docs/README.md",
		"docs/design/sub/README.md": "docs/design/README.md",
	} {
		if got := indexOf(rel); got != want {
			t.Errorf("indexOf(%q) = %q, want %q", rel, got, want)
		}
	}
}
