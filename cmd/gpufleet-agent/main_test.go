package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestAgentBinaryLinksOnlyTheAgent: the agent's binary runs on every GPU
// node, and what it links costs memory there (the pages its package
// initialisation touches; BenchmarkAgentMemory in test/chaos measures it
// against `gpufleet agent` of the one binary). Of gpufleet's own packages
// it may link only the agent's; none of the heavy libraries the other
// commands use.
func TestAgentBinaryLinksOnlyTheAgent(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	const module = "github.com/gpufleet/gpufleet/"
	allowed := map[string]bool{
		module + "api/maintenance/v1alpha1": true,
		module + "api/repair/v1alpha1":      true,
		module + "cmd/gpufleet-agent":       true,
		module + "internal/agent":           true,
		module + "internal/agent/agentcmd":  true,
		module + "internal/cli":             true,
		module + "internal/gpufault":        true,
		module + "internal/version":         true,
	}
	// What only the other commands need: the chart and kustomize,
	// kubectl's drain and flags, the API server libraries, the operator's
	// memory limit; and what the agent does without: client-go's clientset
	// and informers of every API group, and controller-runtime but its
	// logger and kubeconfig loader (its manager and client link the
	// clientset: twice the agent's memory).
	forbidden := []string{
		"helm.sh/",
		"sigs.k8s.io/kustomize/",
		"k8s.io/kubectl/",
		"k8s.io/cli-runtime/",
		"k8s.io/apiserver/",
		"github.com/KimMachineGun/automemlimit",
		"k8s.io/client-go/kubernetes",
		"k8s.io/client-go/informers",
		"sigs.k8s.io/controller-runtime/",
	}
	allowedLibs := map[string]bool{
		"sigs.k8s.io/controller-runtime/pkg/log":           true,
		"sigs.k8s.io/controller-runtime/pkg/log/zap":       true,
		"sigs.k8s.io/controller-runtime/pkg/internal/log":  true,
		"sigs.k8s.io/controller-runtime/pkg/client/config": true,
	}
	deps := strings.Fields(string(out))
	for _, d := range deps {
		if strings.HasPrefix(d, module) && !allowed[d] {
			t.Errorf("the agent binary links %s", d)
		}
		for _, f := range forbidden {
			if strings.HasPrefix(d, f) && !allowedLibs[d] {
				t.Errorf("the agent binary links %s", d)
			}
		}
	}
	t.Logf("%d packages", len(deps))
}
