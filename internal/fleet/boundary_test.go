package fleet

import (
	"os/exec"
	"strings"
	"testing"
)

// TestFleetViewDoesNotLinkTheGPUStackController: the fleet view (gpufleet
// status, explain, ui) reads the GPU stack's components and labels from
// its API (api/nvidia/v1/stack.go), never from internal/gpustack, the
// controller that deploys the stack (issue 32). .golangci.yml's depguard
// rule fleet-view-off-the-gpu-stack-controller says the same to the
// linter; this test holds where the linter is not built. It looks at every
// dependency, the tests' included, so that the boundary cannot be crossed
// through a package in between.
func TestFleetViewDoesNotLinkTheGPUStackController(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-test", ".", "./ui").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps -test . ./ui: %v\n%s", err, out)
	}
	const forbidden = "github.com/gpufleet/gpufleet/internal/gpustack"
	deps := strings.Fields(string(out))
	for _, d := range deps {
		if d == forbidden || strings.HasPrefix(d, forbidden+"/") {
			t.Errorf("internal/fleet or internal/fleet/ui depends on %s: use the GPU stack's API, api/nvidia/v1 (stack.go)", d)
		}
	}
	if len(deps) == 0 {
		t.Fatal("go list -deps listed no package")
	}
}
