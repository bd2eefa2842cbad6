//go:build image

// Package image checks gpufleet's container image and release artifacts as
// `make image` and `make release` build them (make test-image; the build tag
// keeps these tests out of `make test`, as building the image for two
// architectures takes minutes from a cold build cache). The tests build a
// release once, with hack/release.sh (which builds the image with
// hack/image.sh, the code path of `make image`), into a temporary directory,
// then unpack the OCI archive with the standard library only — not with the
// library that wrote it — and check the entrypoint, the user, the labels,
// the files, that the binaries are static for their architecture, that the
// binary of the host's architecture prints the stamped version, that the
// image's nsenter enters another process's namespaces, and what the packaged
// chart and install.yaml reference.
package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"crypto/x509"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// The release the tests build: a version no real release has.
const (
	testVersion = "v0.0.0-imagetest"
	testTag     = "0.0.0-imagetest" // the image tag and the chart's version
	repository  = "ghcr.io/gpufleet/gpufleet"
)

var platforms = []string{"linux/amd64", "linux/arm64"}

// root is the source tree (the tests run in test/image).
func root(t *testing.T) string {
	t.Helper()
	r, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(r, "hack", "release.sh")); err != nil {
		t.Fatalf("not in the gpufleet tree: %v", err)
	}
	return r
}

func helmBin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(root(t), "bin", "helm")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s not built: run `make helm` (or make test-image, which builds it)", bin)
	}
	return bin
}

var (
	releaseOnce sync.Once
	releaseDir  string
	releaseErr  error
	releaseTook time.Duration
)

// release builds the test release once per test binary and returns its
// directory.
func release(t *testing.T) string {
	t.Helper()
	helmBin(t)
	releaseOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gpufleet-release-")
		if err != nil {
			releaseErr = err
			return
		}
		releaseDir = dir
		cmd := exec.Command(filepath.Join(root(t), "hack", "release.sh"))
		cmd.Dir = root(t)
		cmd.Env = append(os.Environ(), "VERSION="+testVersion, "OUT="+dir, "COMMIT=", "LDFLAGS=", "IMAGE_TAG=")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		start := time.Now()
		if err := cmd.Run(); err != nil {
			releaseErr = fmt.Errorf("hack/release.sh VERSION=%s: %w\n%s", testVersion, err, out.String())
		}
		releaseTook = time.Since(start)
		fmt.Printf("hack/release.sh VERSION=%s (%s):\n%s", testVersion, releaseTook.Round(time.Second), out.String())
	})
	if releaseErr != nil {
		t.Fatal(releaseErr)
	}
	return releaseDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if releaseDir != "" {
		_ = os.RemoveAll(releaseDir)
	}
	os.Exit(code)
}

// ociArchive is an unpacked OCI archive: its files by name, every blob
// checked against its digest.
type ociArchive map[string][]byte

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations"`
	Platform    *struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
	} `json:"platform"`
}

type index struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType"`
	Manifests     []descriptor      `json:"manifests"`
	Annotations   map[string]string `json:"annotations"`
}

type manifest struct {
	MediaType   string            `json:"mediaType"`
	Config      descriptor        `json:"config"`
	Layers      []descriptor      `json:"layers"`
	Annotations map[string]string `json:"annotations"`
}

type imageConfig struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
	Config       struct {
		Entrypoint []string          `json:"Entrypoint"`
		Cmd        []string          `json:"Cmd"`
		User       string            `json:"User"`
		Env        []string          `json:"Env"`
		Labels     map[string]string `json:"Labels"`
	} `json:"config"`
	RootFS struct {
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
}

func readArchive(t *testing.T, path string) ociArchive {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	a := ociArchive{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		a[h.Name] = data
	}
	if !strings.Contains(string(a["oci-layout"]), `"imageLayoutVersion"`) {
		t.Fatalf("%s: no oci-layout file: not an OCI image layout", path)
	}
	return a
}

// blob returns the blob of d, checking its size and digest.
func (a ociArchive) blob(t *testing.T, d descriptor) []byte {
	t.Helper()
	hexDigest, ok := strings.CutPrefix(d.Digest, "sha256:")
	if !ok {
		t.Fatalf("digest %q is not sha256", d.Digest)
	}
	data, ok := a["blobs/sha256/"+hexDigest]
	if !ok {
		t.Fatalf("blob %s missing", d.Digest)
	}
	sum := sha256.Sum256(data)
	if hex.EncodeToString(sum[:]) != hexDigest || int64(len(data)) != d.Size {
		t.Fatalf("blob %s: digest or size (%d, descriptor %d) does not match", d.Digest, len(data), d.Size)
	}
	return data
}

func decode[T any](t *testing.T, data []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// platformImage is one platform's image in the archive.
type platformImage struct {
	platform string
	manifest manifest
	config   imageConfig
	layer    []byte // compressed
	files    map[string]*tar.Header
	contents map[string][]byte
}

var (
	imagesOnce       sync.Once
	imagesByPlatform map[string]*platformImage
)

// images returns the images of the test release's archive by platform,
// checking the layout's index (one entry: the image index, named with the
// tag) on the way. The archive is read once; a test that reads it first
// reports what is wrong with it, later ones fail.
func images(t *testing.T) map[string]*platformImage {
	t.Helper()
	imagesOnce.Do(func() { imagesByPlatform = readImages(t) })
	if imagesByPlatform == nil {
		t.Fatal("the image archive could not be read (see the first failure)")
	}
	return imagesByPlatform
}

func readImages(t *testing.T) map[string]*platformImage {
	t.Helper()
	arc := readArchive(t, filepath.Join(release(t), "gpufleet-"+testTag+".oci.tar"))
	top := decode[index](t, arc["index.json"])
	if len(top.Manifests) != 1 {
		t.Fatalf("index.json has %d entries, want 1 (the image index)", len(top.Manifests))
	}
	entry := top.Manifests[0]
	if entry.MediaType != "application/vnd.oci.image.index.v1+json" {
		t.Errorf("index.json entry is a %s, want an OCI image index", entry.MediaType)
	}
	if got := entry.Annotations["org.opencontainers.image.ref.name"]; got != testTag {
		t.Errorf("index.json names the image %q, want the tag %q", got, testTag)
	}
	idx := decode[index](t, arc.blob(t, entry))
	out := map[string]*platformImage{}
	for _, d := range idx.Manifests {
		if d.Platform == nil {
			t.Fatalf("image index entry %s has no platform", d.Digest)
		}
		if d.MediaType != "application/vnd.oci.image.manifest.v1+json" {
			t.Errorf("%s: manifest media type %s", d.Digest, d.MediaType)
		}
		p := &platformImage{platform: d.Platform.OS + "/" + d.Platform.Architecture}
		p.manifest = decode[manifest](t, arc.blob(t, d))
		p.config = decode[imageConfig](t, arc.blob(t, p.manifest.Config))
		if len(p.manifest.Layers) != 1 {
			t.Fatalf("%s: %d layers, want 1", p.platform, len(p.manifest.Layers))
		}
		p.layer = arc.blob(t, p.manifest.Layers[0])
		p.files, p.contents = unpack(t, p.layer)
		out[p.platform] = p
	}
	got := slices.Sorted(func(yield func(string) bool) {
		for p := range out {
			if !yield(p) {
				return
			}
		}
	})
	if !slices.Equal(got, platforms) {
		t.Fatalf("platforms %v, want %v", got, platforms)
	}
	return out
}

func unpack(t *testing.T, layer []byte) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(layer))
	if err != nil {
		t.Fatalf("layer is not gzip: %v", err)
	}
	files, contents := map[string]*tar.Header{}, map[string][]byte{}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, contents
		}
		if err != nil {
			t.Fatal(err)
		}
		name := "/" + strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")
		files[name] = h
		if h.Typeflag == tar.TypeReg {
			if contents[name], err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func gitHead(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("git", "-C", root(t), "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse HEAD: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// TestImageConfig: the entrypoint, the nonroot user, PATH (for nsenter),
// the platform, and the org.opencontainers.image labels.
func TestImageConfig(t *testing.T) {
	head := gitHead(t)
	for _, p := range images(t) {
		c := p.config
		if c.OS+"/"+c.Architecture != p.platform {
			t.Errorf("%s: config says %s/%s", p.platform, c.OS, c.Architecture)
		}
		if !slices.Equal(c.Config.Entrypoint, []string{"/gpufleet"}) || len(c.Config.Cmd) != 0 {
			t.Errorf("%s: entrypoint %q cmd %q, want [/gpufleet] and none", p.platform, c.Config.Entrypoint, c.Config.Cmd)
		}
		if c.Config.User != "65532:65532" {
			t.Errorf("%s: user %q, want 65532:65532 (nonroot)", p.platform, c.Config.User)
		}
		if !slices.ContainsFunc(c.Config.Env, func(e string) bool { return strings.HasPrefix(e, "PATH=") && strings.Contains(e, "/usr/bin") }) {
			t.Errorf("%s: env %q has no PATH with /usr/bin (the agent runs nsenter by name)", p.platform, c.Config.Env)
		}
		want := map[string]string{
			"org.opencontainers.image.source":   "https://github.com/gpufleet/gpufleet",
			"org.opencontainers.image.revision": head,
			"org.opencontainers.image.version":  testVersion,
			"org.opencontainers.image.licenses": "Apache-2.0",
		}
		for k, v := range want {
			if c.Config.Labels[k] != v {
				t.Errorf("%s: label %s = %q, want %q", p.platform, k, c.Config.Labels[k], v)
			}
			if p.manifest.Annotations[k] != v {
				t.Errorf("%s: manifest annotation %s = %q, want %q", p.platform, k, p.manifest.Annotations[k], v)
			}
		}
		if len(c.RootFS.DiffIDs) != 1 {
			t.Errorf("%s: %d diff IDs for 1 layer", p.platform, len(c.RootFS.DiffIDs))
		}
	}
}

// TestImageContents: the image holds the binary, the agent's own binary,
// nsenter, the CA certificates and the user database, and nothing else;
// the three binaries are static executables of the image's architecture.
// It reports the sizes.
func TestImageContents(t *testing.T) {
	want := map[string]struct {
		mode int64
		uid  int
		dir  bool
	}{
		"/etc":                               {0o755, 0, true},
		"/etc/group":                         {0o644, 0, false},
		"/etc/passwd":                        {0o644, 0, false},
		"/etc/ssl":                           {0o755, 0, true},
		"/etc/ssl/certs":                     {0o755, 0, true},
		"/etc/ssl/certs/ca-certificates.crt": {0o644, 0, false},
		"/gpufleet":                          {0o755, 0, false},
		"/gpufleet-agent":                    {0o755, 0, false},
		"/home":                              {0o755, 0, true},
		"/home/nonroot":                      {0o700, 65532, true},
		"/tmp":                               {0o1777, 0, true},
		"/usr":                               {0o755, 0, true},
		"/usr/bin":                           {0o755, 0, true},
		"/usr/bin/nsenter":                   {0o755, 0, false},
	}
	machine := map[string]elf.Machine{"linux/amd64": elf.EM_X86_64, "linux/arm64": elf.EM_AARCH64}
	for _, platform := range platforms {
		p := images(t)[platform]
		var unpacked int64
		for name, h := range p.files {
			w, ok := want[name]
			if !ok {
				t.Errorf("%s: unexpected %s in the image (%d bytes)", platform, name, h.Size)
				continue
			}
			if h.Mode != w.mode || h.Uid != w.uid || h.Gid != w.uid || (h.Typeflag == tar.TypeDir) != w.dir {
				t.Errorf("%s: %s mode %o uid %d gid %d dir %t, want %o %d %d %t", platform, name, h.Mode, h.Uid, h.Gid, h.Typeflag == tar.TypeDir, w.mode, w.uid, w.uid, w.dir)
			}
			unpacked += h.Size
		}
		for name := range want {
			if _, ok := p.files[name]; !ok {
				t.Errorf("%s: %s missing from the image", platform, name)
			}
		}
		if !strings.Contains(string(p.contents["/etc/passwd"]), "nonroot:x:65532:65532:") {
			t.Errorf("%s: /etc/passwd has no nonroot 65532:\n%s", platform, p.contents["/etc/passwd"])
		}
		if pool := x509.NewCertPool(); !pool.AppendCertsFromPEM(p.contents["/etc/ssl/certs/ca-certificates.crt"]) {
			t.Errorf("%s: no certificate in /etc/ssl/certs/ca-certificates.crt", platform)
		}
		for _, bin := range []string{"/gpufleet", "/gpufleet-agent", "/usr/bin/nsenter"} {
			f, err := elf.NewFile(bytes.NewReader(p.contents[bin]))
			if err != nil {
				t.Errorf("%s: %s is not an ELF executable: %v", platform, bin, err)
				continue
			}
			if f.Machine != machine[platform] {
				t.Errorf("%s: %s is for %s", platform, bin, f.Machine)
			}
			for _, prog := range f.Progs {
				if prog.Type == elf.PT_INTERP {
					t.Errorf("%s: %s is dynamically linked (has an interpreter)", platform, bin)
				}
			}
		}
		rest := unpacked
		for _, f := range []string{"/gpufleet", "/gpufleet-agent", "/usr/bin/nsenter", "/etc/ssl/certs/ca-certificates.crt"} {
			rest -= p.files[f].Size
		}
		t.Logf("%s: %.1f MB compressed, %.1f MB unpacked: /gpufleet %.1f MB, /gpufleet-agent %.1f MB, /usr/bin/nsenter %.1f MB, CA certificates %.0f kB, the rest %d bytes",
			platform, float64(len(p.layer))/1e6, float64(unpacked)/1e6, float64(p.files["/gpufleet"].Size)/1e6,
			float64(p.files["/gpufleet-agent"].Size)/1e6, float64(p.files["/usr/bin/nsenter"].Size)/1e6,
			float64(p.files["/etc/ssl/certs/ca-certificates.crt"].Size)/1e3, rest)
	}
}

// extract writes a file of the host architecture's image to a temporary
// directory.
func extract(t *testing.T, name string) string {
	t.Helper()
	host := "linux/" + runtime.GOARCH
	p, ok := images(t)[host]
	if !ok {
		t.Fatalf("no image for the host's platform %s", host)
	}
	path := filepath.Join(t.TempDir(), filepath.Base(name))
	if err := os.WriteFile(path, p.contents[name], 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestBinaryRuns: the image's binary prints the version it was stamped
// with, and so does the agent's binary.
func TestBinaryRuns(t *testing.T) {
	bin := extract(t, "/gpufleet")
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("gpufleet version: %v: %s", err, out)
	}
	commit, err := exec.Command("git", "-C", root(t), "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("gpufleet %s (commit %s, ", testVersion, strings.TrimSpace(string(commit)))
	if !strings.HasPrefix(string(out), want) {
		t.Errorf("gpufleet version printed %q, want %q...", out, want)
	}
	t.Logf("gpufleet version: %s", strings.TrimSpace(string(out)))
	agentOut, err := exec.Command(extract(t, "/gpufleet-agent"), "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("gpufleet-agent --version: %v: %s", err, agentOut)
	}
	if !strings.HasPrefix(string(agentOut), want) {
		t.Errorf("gpufleet-agent --version printed %q, want %q...", agentOut, want)
	}
}
