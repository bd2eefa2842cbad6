package repair

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// The note on a GPUFault of a device-plugin node says what holds: the
// plugin took the GPU out, or else what the repair drains (as the repair
// does it: the pods the kubelet gave the GPU when known, else every GPU
// pod of the node).
func TestDevicePluginNote(t *testing.T) {
	node := func(allocatable string) *corev1.Node {
		return &corev1.Node{Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{gpuResource: resource.MustParse("8")},
			Allocatable: corev1.ResourceList{gpuResource: resource.MustParse(allocatable)},
		}}
	}
	pods := func(names ...string) *repairv1.GPUAllocation {
		a := &repairv1.GPUAllocation{Resource: string(gpuResource)}
		for _, n := range names {
			a.Pods = append(a.Pods, repairv1.PodRef{Namespace: "ml", Name: n})
		}
		return a
	}
	cases := map[string]struct {
		node        *corev1.Node
		alloc       *repairv1.GPUAllocation
		want, avoid []string
	}{
		"the plugin took it out (7 of 8)": {node: node("7"), alloc: pods("a"),
			want: []string{"allocatable 7 of 8"}, avoid: []string{"NOT isolated"}},
		"one pod holds it": {node: node("8"), alloc: pods("train-0"),
			want:  []string{"NOT isolated", "drains only the 1 pod(s) the kubelet gave this GPU (pod-resources: ml/train-0)"},
			avoid: []string{"every pod", "node's GPU pods"}},
		"many pods": {node: node("8"), alloc: pods("a", "b", "c", "d", "e"),
			want: []string{"only the 5 pod(s)", "ml/a, ml/b, ml/c and 2 more"}},
		"no pod holds it": {node: node("8"), alloc: pods(),
			want: []string{"no pod holds this GPU", "drains none"}},
		"not known": {node: node("8"),
			want: []string{"not known yet", "every pod of the node that requests nvidia.com/gpu"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := devicePluginNote(tc.node, "gpu.nvidia.com", tc.alloc)
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("note %q lacks %q", got, w)
				}
			}
			for _, a := range tc.avoid {
				if strings.Contains(got, a) {
					t.Errorf("note %q says %q", got, a)
				}
			}
		})
	}
}
