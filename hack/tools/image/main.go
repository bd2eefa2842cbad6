// Command image assembles gpufleet's container image from binaries that the
// host's Go has built, and writes it as an OCI archive (a tar of an OCI image
// layout) without a container engine, a daemon or a registry. It is what
// `make image` runs (through hack/image.sh); the root Containerfile describes
// the same image for docker/podman build.
//
// The image is one layer on an empty base (FROM scratch):
//
//	/gpufleet                          the binary (ENTRYPOINT)
//	/gpufleet-agent                    the node agent alone (cmd/gpufleet-agent), what the agent DaemonSet runs
//	/usr/bin/nsenter                   the node agent's way into the host's namespaces (cmd/nsenter)
//	/etc/ssl/certs/ca-certificates.crt CA certificates
//	/etc/passwd, /etc/group            root and nonroot (65532)
//	/home/nonroot, /tmp
//
// with USER 65532:65532 and the org.opencontainers.image.* labels given with
// -label. Several -platform flags make a multi-platform image index. Every
// time stamp is -created, so the same inputs give the same digests.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// nonroot is the image's user, as in distroless' "nonroot".
const nonroot = 65532

const (
	passwd = "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group  = "root:x:0:\nnonroot:x:65532:\n"
	path   = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(s string) error { *m = append(*m, s); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	var platforms, labels multiFlag
	out := fs.String("out", "", "OCI archive to write (a tar of an OCI image layout)")
	tag := fs.String("tag", "", "the image's tag (org.opencontainers.image.ref.name in the layout's index.json)")
	binDir := fs.String("bin-dir", "", "directory with <os>_<arch>/gpufleet, <os>_<arch>/gpufleet-agent and <os>_<arch>/nsenter for each platform")
	caCerts := fs.String("ca-certs", "/etc/ssl/certs/ca-certificates.crt", "CA certificates bundle to ship")
	created := fs.String("created", "", "creation time of the image and of every file: Unix seconds (default: $SOURCE_DATE_EPOCH, else 0)")
	fs.Var(&platforms, "platform", "os/arch to include (repeat for a multi-platform index)")
	fs.Var(&labels, "label", "key=value label of the image config and annotation of the manifests (repeat)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || *tag == "" || *binDir == "" || len(platforms) == 0 {
		return fmt.Errorf("-out, -tag, -bin-dir and at least one -platform are required")
	}
	when, err := creationTime(*created)
	if err != nil {
		return err
	}
	lbls := map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return fmt.Errorf("-label %q: want key=value", l)
		}
		lbls[k] = v
	}
	certs, err := os.ReadFile(*caCerts)
	if err != nil {
		return fmt.Errorf("CA certificates: %w (Debian: apt-get install ca-certificates)", err)
	}

	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, p := range platforms {
		plat, err := v1.ParsePlatform(p)
		if err != nil {
			return err
		}
		dir := filepath.Join(*binDir, plat.OS+"_"+plat.Architecture)
		img, err := buildImage(plat, dir, certs, lbls, when)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if err := report(plat, img); err != nil {
			return err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: plat}})
	}
	idx = mutate.Annotations(idx, lbls).(v1.ImageIndex)
	return writeArchive(*out, *tag, idx, when)
}

func creationTime(s string) (time.Time, error) {
	if s == "" {
		s = os.Getenv("SOURCE_DATE_EPOCH")
	}
	if s == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	sec, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("creation time %q: want Unix seconds: %w", s, err)
	}
	return time.Unix(sec, 0).UTC(), nil
}

// entry is one file or directory of the image's layer.
type entry struct {
	name string
	mode int64
	uid  int
	dir  bool
	data []byte
}

func buildImage(plat *v1.Platform, dir string, certs []byte, labels map[string]string, when time.Time) (v1.Image, error) {
	bin, err := os.ReadFile(filepath.Join(dir, "gpufleet"))
	if err != nil {
		return nil, err
	}
	agent, err := os.ReadFile(filepath.Join(dir, "gpufleet-agent"))
	if err != nil {
		return nil, err
	}
	nsenter, err := os.ReadFile(filepath.Join(dir, "nsenter"))
	if err != nil {
		return nil, err
	}
	entries := []entry{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/group", mode: 0o644, data: []byte(group)},
		{name: "etc/passwd", mode: 0o644, data: []byte(passwd)},
		{name: "etc/ssl/", mode: 0o755, dir: true},
		{name: "etc/ssl/certs/", mode: 0o755, dir: true},
		{name: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, data: certs},
		{name: "gpufleet", mode: 0o755, data: bin},
		{name: "gpufleet-agent", mode: 0o755, data: agent},
		{name: "home/", mode: 0o755, dir: true},
		{name: "home/nonroot/", mode: 0o700, uid: nonroot, dir: true},
		{name: "tmp/", mode: 0o1777, dir: true},
		{name: "usr/", mode: 0o755, dir: true},
		{name: "usr/bin/", mode: 0o755, dir: true},
		{name: "usr/bin/nsenter", mode: 0o755, data: nsenter},
	}
	data, err := layerTar(entries, when)
	if err != nil {
		return nil, err
	}
	layer, err := layerOf(data)
	if err != nil {
		return nil, err
	}
	cfg := &v1.ConfigFile{
		Architecture: plat.Architecture,
		OS:           plat.OS,
		Variant:      plat.Variant,
		Created:      v1.Time{Time: when},
		Config: v1.Config{
			Entrypoint: []string{"/gpufleet"},
			User:       fmt.Sprintf("%d:%d", nonroot, nonroot),
			Env:        []string{path},
			WorkingDir: "/",
			Labels:     labels,
		},
		RootFS: v1.RootFS{Type: "layers"},
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, err
	}
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
		Created:   v1.Time{Time: when},
		CreatedBy: "hack/tools/image: /gpufleet, /gpufleet-agent, /usr/bin/nsenter, CA certificates, nonroot user",
	}})
	if err != nil {
		return nil, err
	}
	return mutate.Annotations(img, labels).(v1.Image), nil
}

func layerOf(data []byte) (v1.Layer, error) {
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// layerTar is the uncompressed layer: entries in order, owned by root (or
// nonroot where said), dated when.
func layerTar(entries []entry, when time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.uid, ModTime: when, Format: tar.FormatPAX}
		if e.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// report prints the image's digest and sizes.
func report(plat *v1.Platform, img v1.Image) error {
	d, err := img.Digest()
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	var compressed, uncompressed int64
	for _, l := range layers {
		s, err := l.Size()
		if err != nil {
			return err
		}
		compressed += s
		rc, err := l.Uncompressed()
		if err != nil {
			return err
		}
		n, err := io.Copy(io.Discard, rc)
		_ = rc.Close()
		if err != nil {
			return err
		}
		uncompressed += n
	}
	fmt.Printf("%s %s: %.1f MB compressed, %.1f MB unpacked\n", plat, d, float64(compressed)/1e6, float64(uncompressed)/1e6)
	return nil
}

// writeArchive writes idx as an OCI image layout whose index.json names it
// tag, tarred into out (files sorted, dated when).
func writeArchive(out, tag string, idx v1.ImageIndex, when time.Time) error {
	dir, err := os.MkdirTemp(filepath.Dir(out), ".layout-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": tag})); err != nil {
		return err
	}
	var files []string
	err = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if d.IsDir() {
			rel += "/"
		}
		files = append(files, rel)
		return nil
	})
	if err != nil {
		return err
	}
	slices.Sort(files)
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp) }() // after the rename: no such file
	tw := tar.NewWriter(f)
	for _, name := range files {
		h := &tar.Header{Name: name, Mode: 0o644, ModTime: when, Format: tar.FormatPAX, Typeflag: tar.TypeReg}
		var data []byte
		if strings.HasSuffix(name, "/") {
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		} else {
			if data, err = os.ReadFile(filepath.Join(dir, name)); err != nil {
				return err
			}
			h.Size = int64(len(data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	d, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("%s: index %s, tag %s\n", out, d, tag)
	return os.Rename(tmp, out)
}
