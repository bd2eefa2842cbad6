package gpustack

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	"github.com/gpufleet/gpufleet/internal/testobj"
)

// gpuNode is node "n", found a GPU on by node feature discovery, with
// labels (over NFD's) and runtime.
func gpuNode(labels map[string]string, runtime string) *corev1.Node {
	return testobj.Node("n", testobj.Labels(map[string]string{"feature.node.kubernetes.io/pci-10de.present": "true"}),
		testobj.Labels(labels), testobj.RuntimeVersion(runtime))
}

// applied returns the labels after applying changes.
func applied(n *corev1.Node, changes map[string]*string) map[string]string {
	out := map[string]string{}
	for k, v := range n.Labels {
		out[k] = v
	}
	for k, v := range changes {
		if v == nil {
			delete(out, k)
		} else {
			out[k] = *v
		}
	}
	return out
}

func deployLabels(labels map[string]string) map[string]string {
	out := map[string]string{}
	for _, c := range nvidiav1.Components {
		if v, ok := labels[c.DeployLabel]; ok {
			out[c.Key] = v
		}
	}
	return out
}

func TestNodeLabels(t *testing.T) {
	spec := &nvidiav1.ClusterPolicySpec{}
	migSpec := &nvidiav1.ClusterPolicySpec{MIGManager: nvidiav1.MIGManagerSpec{ComponentSpec: nvidiav1.ComponentSpec{Enabled: ptr.To(true)}}}
	stack := func(extra map[string]string) map[string]string {
		out := map[string]string{Driver: "true", ContainerToolkit: "true", DevicePlugin: "true", Validator: "true", DCGMExporter: "true", GFD: "true"}
		for k, v := range extra {
			if v == "" {
				delete(out, k)
			} else {
				out[k] = v
			}
		}
		return out
	}
	tests := map[string]struct {
		node        *corev1.Node
		spec        *nvidiav1.ClusterPolicySpec
		wantDeploy  map[string]string
		wantRuntime string
		wantPresent bool
	}{
		"new GPU node gets every enabled component at once (init containers keep the order)": {
			node: gpuNode(nil, "containerd://1.7"), spec: spec,
			wantDeploy: stack(nil), wantRuntime: "containerd", wantPresent: true,
		},
		"docker and cri-o runtimes": {
			node: gpuNode(map[string]string{"nvidia.com/gpu.deploy.driver": "true"}, "docker://27"), spec: spec,
			wantDeploy: stack(nil), wantRuntime: "docker", wantPresent: true,
		},
		"cri-o": {
			node: gpuNode(nil, "cri-o://1.31"), spec: spec, wantDeploy: stack(nil), wantRuntime: "crio", wantPresent: true,
		},
		"admin opt-out of the driver is kept; the rest is deployed": {
			node: gpuNode(map[string]string{"nvidia.com/gpu.deploy.driver": "false"}, "containerd://1.7"), spec: spec,
			wantDeploy: stack(map[string]string{Driver: "false"}), wantRuntime: "containerd", wantPresent: true,
		},
		"admin's gpu.present=false is not overwritten": {
			node: gpuNode(map[string]string{"nvidia.com/gpu.present": "false"}, "containerd://1.7"), spec: spec,
			wantDeploy: stack(nil), wantRuntime: "containerd", wantPresent: false,
		},
		"disabled component loses its label": {
			node:       gpuNode(map[string]string{"nvidia.com/gpu.deploy.driver": "true", "nvidia.com/gpu.deploy.container-toolkit": "true"}, "containerd://1.7"),
			spec:       &nvidiav1.ClusterPolicySpec{Toolkit: nvidiav1.ToolkitSpec{ComponentSpec: nvidiav1.ComponentSpec{Enabled: ptr.To(false)}}},
			wantDeploy: stack(map[string]string{ContainerToolkit: ""}), wantRuntime: "containerd", wantPresent: true,
		},
		"mig-manager enabled: only on a MIG-capable node": {
			node: gpuNode(map[string]string{nvidiav1.LabelMIGCapable: "true"}, "containerd://1.7"), spec: migSpec,
			wantDeploy: stack(map[string]string{MIGManager: "true"}), wantRuntime: "containerd", wantPresent: true,
		},
		"mig-manager enabled: not on a node without MIG (and a stale label is removed)": {
			node: gpuNode(map[string]string{nvidiav1.LabelMIGCapable: "false", "nvidia.com/gpu.deploy.mig-manager": "true"}, "containerd://1.7"), spec: migSpec,
			wantDeploy: stack(nil), wantRuntime: "containerd", wantPresent: true,
		},
		"unknown runtime falls back to the policy default": {
			node: gpuNode(nil, "frobnicator://1"), spec: &nvidiav1.ClusterPolicySpec{Operator: nvidiav1.OperatorSpec{DefaultRuntime: "docker"}},
			wantDeploy: stack(nil), wantRuntime: "docker", wantPresent: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := applied(tc.node, NodeLabels(tc.node, tc.spec))
			if diff := cmp.Diff(tc.wantDeploy, deployLabels(got)); diff != "" {
				t.Errorf("deploy labels (-want +got):\n%s", diff)
			}
			if got[LabelRuntime] != tc.wantRuntime {
				t.Errorf("runtime label = %q, want %q", got[LabelRuntime], tc.wantRuntime)
			}
			if (got[nvidiav1.LabelGPUPresent] == "true") != tc.wantPresent {
				t.Errorf("gpu.present = %q", got[nvidiav1.LabelGPUPresent])
			}
		})
	}
}

func TestNodeLosingItsGPULosesOurLabels(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{
		nvidiav1.LabelGPUPresent: "true", "nvidia.com/gpu.deploy.driver": "true", "nvidia.com/gpu.deploy.dcgm": "false", LabelRuntime: "containerd",
	}}}
	got := applied(n, NodeLabels(n, &nvidiav1.ClusterPolicySpec{}))
	want := map[string]string{"nvidia.com/gpu.deploy.dcgm": "false"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("labels after the GPU disappeared (-want +got):\n%s", diff)
	}
}

func TestNodeLabelsConverge(t *testing.T) {
	// Applying the changes once leaves nothing more to change.
	n := gpuNode(nil, "containerd://1.7")
	for range 2 {
		changes := NodeLabels(n, &nvidiav1.ClusterPolicySpec{})
		if len(changes) == 0 {
			return
		}
		n.Labels = applied(n, changes)
	}
	t.Fatalf("labels never converged: %v", n.Labels)
}

// migManager.config.default "all-disabled" labels MIG-capable nodes that
// have no MIG configuration, as NVIDIA's GPU Operator does; nothing else.
func TestMIGConfigDefaultLabel(t *testing.T) {
	capable := map[string]string{nvidiav1.LabelMIGCapable: "true"}
	withConfig := map[string]string{nvidiav1.LabelMIGCapable: "true", LabelMIGConfig: "all-1g.10gb"}
	spec := func(enabled bool, def string) *nvidiav1.ClusterPolicySpec {
		s := &nvidiav1.ClusterPolicySpec{}
		s.MIGManager.Enabled = ptr.To(enabled)
		if def != "" {
			s.MIGManager.Config = &nvidiav1.MIGManagerConfigSpec{Default: def}
		}
		return s
	}
	tests := map[string]struct {
		spec   *nvidiav1.ClusterPolicySpec
		labels map[string]string
		want   string // "" = no change of the label
	}{
		"chart default on a MIG-capable node":       {spec: spec(true, "all-disabled"), labels: capable, want: "all-disabled"},
		"the node has a MIG configuration":          {spec: spec(true, "all-disabled"), labels: withConfig},
		"not MIG-capable":                           {spec: spec(true, "all-disabled"), labels: map[string]string{}},
		"mig-manager disabled":                      {spec: spec(false, "all-disabled"), labels: capable},
		"another default is the administrator's":    {spec: spec(true, "all-1g.10gb"), labels: capable},
		"no default":                                {spec: spec(true, ""), labels: capable},
		"an empty label counts as no configuration": {spec: spec(true, "all-disabled"), labels: map[string]string{nvidiav1.LabelMIGCapable: "true", LabelMIGConfig: ""}, want: "all-disabled"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			n := gpuNode(tc.labels, "containerd://1.7")
			got := ""
			if v := NodeLabels(n, tc.spec)[LabelMIGConfig]; v != nil {
				got = *v
			}
			if got != tc.want {
				t.Errorf("mig.config change %q, want %q", got, tc.want)
			}
		})
	}
}
