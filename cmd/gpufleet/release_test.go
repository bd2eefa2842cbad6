package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestReleaseBinaryLinksNoDevelopmentCode: the shipped operator is built
// with the release tag (hack/image.sh). It has no gpufleet dev or sim and
// links neither the local control plane nor the simulators (devcluster
// and what only it uses), which the development build (make build) keeps.
func TestReleaseBinaryLinksNoDevelopmentCode(t *testing.T) {
	deps := func(tags ...string) map[string]bool {
		args := append([]string{"list", "-deps"}, tags...)
		out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %v: %v\n%s", tags, err, out)
		}
		m := map[string]bool{}
		for _, p := range strings.Fields(string(out)) {
			m[p] = true
		}
		return m
	}
	const devcluster = "github.com/gpufleet/gpufleet/internal/devcluster"
	if !deps()[devcluster] {
		t.Fatalf("the development build does not link %s: this test checks nothing", devcluster)
	}
	for p := range deps("-tags", "release") {
		if strings.HasPrefix(p, devcluster) {
			t.Errorf("the release build links %s", p)
		}
	}
}
