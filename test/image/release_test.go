//go:build image

package image

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestReleaseArtifacts: make release writes the image archive, the chart,
// install.yaml and their checksums; the packaged chart has the release's
// version and appVersion and, with its default values, runs the release's
// image; so does install.yaml.
func TestReleaseArtifacts(t *testing.T) {
	dir := release(t)
	files := map[string]bool{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		files[e.Name()] = true
	}
	chart := "gpufleet-" + testTag + ".tgz"
	want := []string{"SHA256SUMS", "gpufleet-" + testTag + ".oci.tar", chart, "gpufleet-crds-" + testTag + ".tgz", "install.yaml"}
	if got := slices.Sorted(mapKeys(files)); !slices.Equal(got, want) {
		t.Errorf("release files %v, want %v", got, want)
	}

	// SHA256SUMS covers every other file.
	sums, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	summed := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(sums))
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q", sc.Text())
		}
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if h := sha256.Sum256(data); hex.EncodeToString(h[:]) != sum {
			t.Errorf("SHA256SUMS: %s does not match", name)
		}
		summed[name] = true
	}
	for name := range files {
		if name != "SHA256SUMS" && !summed[name] {
			t.Errorf("SHA256SUMS lacks %s", name)
		}
	}

	// The packaged chart: version and appVersion, and the image of every
	// container with the default values.
	meta := helm(t, "show", "chart", filepath.Join(dir, chart))
	var c struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(meta, &c); err != nil {
		t.Fatal(err)
	}
	if c.Version != testTag || c.AppVersion != testTag {
		t.Errorf("packaged chart version %q appVersion %q, want %q", c.Version, c.AppVersion, testTag)
	}
	wantImage := repository + ":" + testTag
	rendered := helm(t, "template", "gpufleet", filepath.Join(dir, chart), "--namespace", "gpufleet-system")
	// The operator, the agent and the pre-delete uninstall hook.
	checkImages(t, "helm template of "+chart, rendered, wantImage, 3)

	install, err := os.ReadFile(filepath.Join(dir, "install.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	checkImages(t, "install.yaml", install, wantImage, 2)
	crds, _ := filepath.Glob(filepath.Join(root(t), "config", "crd", "bases", "*.yaml"))
	if n := bytes.Count(install, []byte("\nkind: CustomResourceDefinition\n")); n != len(crds) || n == 0 {
		t.Errorf("install.yaml has %d CRDs, config/crd/bases %d", n, len(crds))
	}
	for _, kind := range []string{"Namespace", "ClusterRole", "ClusterRoleBinding", "ServiceAccount", "Deployment", "DaemonSet"} {
		if !bytes.Contains(install, []byte("\nkind: "+kind+"\n")) {
			t.Errorf("install.yaml has no %s", kind)
		}
	}
}

func mapKeys(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// checkImages checks that the manifests run exactly want, in n containers.
func checkImages(t *testing.T, what string, manifests []byte, want string, n int) {
	t.Helper()
	var got []string
	for _, m := range regexp.MustCompile(`(?m)^\s+image: (\S+)`).FindAllSubmatch(manifests, -1) {
		got = append(got, strings.Trim(string(m[1]), `"'`))
	}
	if len(got) != n {
		t.Errorf("%s: %d images %v, want %d", what, len(got), got, n)
	}
	for _, img := range got {
		if img != want {
			t.Errorf("%s runs %s, want the release's %s", what, img, want)
		}
	}
}

func helm(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(helmBin(t), args...)
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// TestTreeVersionsAgree: in the tree, the chart's version and appVersion
// and config/default's image tag are the same release (make set-version
// keeps them so), no placeholder; the chart's image tag defaults to
// appVersion; both name the same repository.
func TestTreeVersionsAgree(t *testing.T) {
	r := root(t)
	var chart struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	readYAML(t, filepath.Join(r, "charts", "gpufleet", "Chart.yaml"), &chart)
	var values struct {
		Image struct {
			Repository string `json:"repository"`
			Tag        string `json:"tag"`
		} `json:"image"`
	}
	readYAML(t, filepath.Join(r, "charts", "gpufleet", "values.yaml"), &values)
	var kust struct {
		Images []struct {
			Name   string `json:"name"`
			NewTag string `json:"newTag"`
		} `json:"images"`
	}
	readYAML(t, filepath.Join(r, "config", "default", "kustomization.yaml"), &kust)

	if !regexp.MustCompile(`^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$`).MatchString(chart.AppVersion) || chart.AppVersion != chart.Version {
		t.Errorf("Chart.yaml version %q appVersion %q: want the same release X.Y.Z", chart.Version, chart.AppVersion)
	}
	if values.Image.Tag != "" || values.Image.Repository != repository {
		t.Errorf("values.yaml image %s:%q, want %s with the tag empty (appVersion)", values.Image.Repository, values.Image.Tag, repository)
	}
	if len(kust.Images) != 1 || kust.Images[0].Name != repository || kust.Images[0].NewTag != chart.AppVersion {
		t.Errorf("config/default images %+v, want %s with newTag %s (the chart's appVersion)", kust.Images, repository, chart.AppVersion)
	}
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestContainerfileMatches: the Containerfile (for docker/podman build,
// which cannot run here) describes the image that make image builds: a
// static build with the version stamped, nsenter, a final stage from
// scratch, the nonroot user, the entrypoint and the labels.
func TestContainerfileMatches(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root(t), "Containerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var stages []string
	var final []string // the last stage's instructions
	sc := bufio.NewScanner(bytes.NewReader(data))
	var line string
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(l, "#") || l == "" {
			continue
		}
		line += l
		if strings.HasSuffix(line, `\`) {
			line = strings.TrimSuffix(line, `\`) + " "
			continue
		}
		if strings.HasPrefix(line, "FROM ") {
			stages = append(stages, line)
			final = nil
		}
		final = append(final, line)
		line = ""
	}
	if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	if len(stages) != 2 || stages[1] != "FROM scratch" {
		t.Errorf("stages %q, want a build stage and FROM scratch", stages)
	}
	all := string(data)
	for _, s := range []string{"CGO_ENABLED=0", "-trimpath", "internal/version.Version=${VERSION}", "internal/version.Commit=", "./cmd/gpufleet-agent", "./cmd/nsenter",
		"/etc/ssl/certs/ca-certificates.crt", "nonroot:x:65532:65532:"} {
		if !strings.Contains(all, s) {
			t.Errorf("the Containerfile's build lacks %q", s)
		}
	}
	want := []string{`USER 65532:65532`, `ENTRYPOINT ["/gpufleet"]`, "ENV PATH="}
	for _, w := range want {
		if !slices.ContainsFunc(final, func(s string) bool { return strings.HasPrefix(s, w) }) {
			t.Errorf("the final stage lacks %s: %q", w, final)
		}
	}
	labels := strings.Join(slices.DeleteFunc(slices.Clone(final), func(s string) bool { return !strings.HasPrefix(s, "LABEL ") }), " ")
	for _, l := range []string{"source", "revision", "version", "licenses"} {
		if !strings.Contains(labels, "org.opencontainers.image."+l+"=") {
			t.Errorf("the final stage has no label org.opencontainers.image.%s", l)
		}
	}
}
