package allocation

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/gpufleet/gpufleet/internal/testobj"
)

// pod builds a pod whose containers request gpus each (0: no request).
func pod(ns, name, node string, phase corev1.PodPhase, gpus ...int64) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: phase}}
	for i, g := range gpus {
		c := corev1.Container{Name: "c" + string(rune('0'+i))}
		if g > 0 {
			c.Resources.Requests = corev1.ResourceList{ResourceGPU: *resource.NewQuantity(g, resource.DecimalSI)}
			c.Resources.Limits = c.Resources.Requests
		}
		p.Spec.Containers = append(p.Spec.Containers, c)
	}
	return p
}

// withClaim gives a pod a ResourceClaim.
func withClaim(p *corev1.Pod) *corev1.Pod {
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu"}}
	return p
}

// claim builds a ResourceClaim in namespace ml allocated devices of each
// named driver, reserved for pods.
func claim(name string, drivers []string, pods ...string) *resourcev1.ResourceClaim {
	c := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name}}
	if len(drivers) > 0 {
		c.Status.Allocation = &resourcev1.AllocationResult{}
		for i, d := range drivers {
			c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
				resourcev1.DeviceRequestAllocationResult{Request: "gpu", Driver: d, Pool: "gpu-1", Device: "gpu-" + string(rune('0'+i))})
		}
	}
	for _, p := range pods {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourcev1.ResourceClaimConsumerReference{Resource: "pods", Name: p, UID: types.UID("u-" + p)})
	}
	return c
}

const header = `
# HELP gpufleet_allocation_namespace_gpus GPUs held by a namespace's non-terminated pods (the sum of gpufleet_allocation_pod_gpus), by source.
# TYPE gpufleet_allocation_namespace_gpus gauge
# HELP gpufleet_allocation_node_allocatable_gpus A node's nvidia.com/gpu allocatable (what the device plugin offers to pods; less than capacity when GPUs are unhealthy).
# TYPE gpufleet_allocation_node_allocatable_gpus gauge
# HELP gpufleet_allocation_node_capacity_gpus A node's nvidia.com/gpu capacity (nodes with a non-zero capacity only).
# TYPE gpufleet_allocation_node_capacity_gpus gauge
# HELP gpufleet_allocation_pod_gpus GPUs held by a non-terminated pod: its nvidia.com/gpu request (source device-plugin; node empty while unscheduled) or the gpu.nvidia.com devices allocated to its ResourceClaims (source dra; a shared claim counts for every pod using it).
# TYPE gpufleet_allocation_pod_gpus gauge
`

func TestCollector(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	initContainerPod := pod("ml", "init", "gpu-1", corev1.PodRunning, 1)
	initContainerPod.Spec.InitContainers = []corev1.Container{{Name: "warmup", Resources: corev1.ResourceRequirements{
		Requests: corev1.ResourceList{ResourceGPU: *resource.NewQuantity(4, resource.DecimalSI)}}}}
	tests := map[string]struct {
		objects []client.Object
		claims  bool
		ready   bool
		want    string
	}{
		"not synced or not the leader: nothing": {
			objects: []client.Object{testobj.Node("gpu-1", testobj.Pool("a"), testobj.GPUs(8, 8)), pod("ml", "train", "gpu-1", corev1.PodRunning, 2)},
			ready:   false, want: "",
		},
		"device plugin: per pod and namespace, init containers as the scheduler counts them, terminated and CPU pods left out": {
			objects: []client.Object{
				testobj.Node("gpu-1", testobj.Pool("a"), testobj.GPUs(8, 7)),
				testobj.Node("gpu-2", testobj.Pool("b"), testobj.GPUs(4, 4)),
				testobj.Node("cpu-1"),
				pod("ml", "train", "gpu-1", corev1.PodRunning, 2, 1),
				pod("ml", "pending", "", corev1.PodPending, 1),
				pod("ml", "done", "gpu-1", corev1.PodSucceeded, 4),
				pod("ml", "failed", "gpu-2", corev1.PodFailed, 4),
				pod("web", "cpu", "cpu-1", corev1.PodRunning, 0),
				pod("infer", "serve", "gpu-2", corev1.PodRunning, 1),
				initContainerPod,
			},
			ready: true,
			want: header + `
gpufleet_allocation_namespace_gpus{namespace="infer",source="device-plugin"} 1
gpufleet_allocation_namespace_gpus{namespace="ml",source="device-plugin"} 8
gpufleet_allocation_node_allocatable_gpus{node="gpu-1",pool="a"} 7
gpufleet_allocation_node_allocatable_gpus{node="gpu-2",pool="b"} 4
gpufleet_allocation_node_capacity_gpus{node="gpu-1",pool="a"} 8
gpufleet_allocation_node_capacity_gpus{node="gpu-2",pool="b"} 4
gpufleet_allocation_pod_gpus{namespace="infer",node="gpu-2",pod="serve",pool="b",source="device-plugin"} 1
gpufleet_allocation_pod_gpus{namespace="ml",node="",pod="pending",pool="",source="device-plugin"} 1
gpufleet_allocation_pod_gpus{namespace="ml",node="gpu-1",pod="init",pool="a",source="device-plugin"} 4
gpufleet_allocation_pod_gpus{namespace="ml",node="gpu-1",pod="train",pool="a",source="device-plugin"} 3
`,
		},
		"DRA: devices of gpu.nvidia.com in claims reserved for live pods; other drivers, unallocated claims and gone pods left out": {
			objects: []client.Object{
				testobj.Node("gpu-1", testobj.Pool("a"), testobj.GPUs(8, 8)),
				withClaim(pod("ml", "dra", "gpu-1", corev1.PodRunning, 0)),
				withClaim(pod("ml", "shared", "gpu-1", corev1.PodRunning, 0)),
				withClaim(pod("ml", "done", "gpu-1", corev1.PodSucceeded, 0)),
				pod("ml", "no-claims", "gpu-1", corev1.PodRunning, 0),
				claim("two", []string{DRADriver, DRADriver, "nic.example.com"}, "dra"),
				claim("one", []string{DRADriver}, "dra", "shared", "done", "gone", "no-claims"),
				claim("pending", nil, "dra"),
				claim("nic", []string{"nic.example.com"}, "shared"),
			},
			claims: true, ready: true,
			want: header + `
gpufleet_allocation_namespace_gpus{namespace="ml",source="dra"} 4
gpufleet_allocation_node_allocatable_gpus{node="gpu-1",pool="a"} 8
gpufleet_allocation_node_capacity_gpus{node="gpu-1",pool="a"} 8
gpufleet_allocation_pod_gpus{namespace="ml",node="gpu-1",pod="dra",pool="a",source="dra"} 3
gpufleet_allocation_pod_gpus{namespace="ml",node="gpu-1",pod="shared",pool="a",source="dra"} 1
`,
		},
		"claims not served: no DRA series": {
			objects: []client.Object{withClaim(pod("ml", "dra", "gpu-1", corev1.PodRunning, 0)), claim("one", []string{DRADriver}, "dra")},
			claims:  false, ready: true, want: "",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var nodes []client.Object
			var listed []any
			for _, o := range tc.objects {
				if _, ok := o.(*corev1.Node); ok {
					nodes = append(nodes, o)
				} else {
					listed = append(listed, o)
				}
			}
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(nodes...).Build()
			pods, claims := newStore(keepPod), newStore(keepClaim)
			if err := pods.Replace(listed, "1"); err != nil {
				t.Fatal(err)
			}
			if err := claims.Replace(listed, "1"); err != nil {
				t.Fatal(err)
			}
			src := &Source{Nodes: c, Pods: pods.snapshot, Ready: func() bool { return tc.ready }}
			if tc.claims {
				src.Claims = claims.snapshot
			}
			col := &Collector{}
			col.SetSource(src)
			if err := testutil.CollectAndCompare(col, strings.NewReader(tc.want)); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestCollectorWithoutSourceExportsNothing(t *testing.T) {
	if n := testutil.CollectAndCount(&Collector{}); n != 0 {
		t.Errorf("%d series without a source", n)
	}
}

// TestStoreKeepsOnlyGPUPods: a pod is kept while it holds GPUs or uses
// claims, and dropped when it terminates or is deleted (a tombstone too).
func TestStoreKeepsOnlyGPUPods(t *testing.T) {
	s := newStore(keepPod)
	train := pod("ml", "train", "gpu-1", corev1.PodRunning, 2, 1)
	if err := s.Replace([]any{train, pod("web", "cpu", "cpu-1", corev1.PodRunning, 0)}, "1"); err != nil {
		t.Fatal(err)
	}
	if !s.synced.Load() {
		t.Errorf("not synced after the list")
	}
	want := []PodGPUs{{Namespace: "ml", Name: "train", Node: "gpu-1", GPUs: 3}}
	if diff := cmp.Diff(want, s.snapshot()); diff != "" {
		t.Errorf("after the list (-want +got):\n%s", diff)
	}
	dra := pod("ml", "dra", "", corev1.PodPending, 0)
	dra.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu"}}
	_ = s.Add(dra)
	done := pod("ml", "train", "gpu-1", corev1.PodSucceeded, 2, 1)
	_ = s.Update(done)
	want = []PodGPUs{{Namespace: "ml", Name: "dra"}}
	if diff := cmp.Diff(want, s.snapshot()); diff != "" {
		t.Errorf("after a pod with a claim and a terminated pod (-want +got):\n%s", diff)
	}
	_ = s.Delete(toolscache.DeletedFinalStateUnknown{Key: "ml/dra", Obj: dra})
	if got := s.snapshot(); len(got) != 0 {
		t.Errorf("after a tombstone: %v", got)
	}
}

func TestKeepClaimKeepsGPUResultsAndPods(t *testing.T) {
	c := claim("one", []string{DRADriver, "nic.example.com", DRADriver}, "a")
	c.Status.ReservedFor = append(c.Status.ReservedFor, resourcev1.ResourceClaimConsumerReference{APIGroup: "example.com", Resource: "jobs", Name: "j"})
	got, ok := keepClaim(c)
	if diff := cmp.Diff(ClaimGPUs{Namespace: "ml", GPUs: 2, Pods: []string{"a"}}, got); !ok || diff != "" {
		t.Errorf("kept %t (-want +got):\n%s", ok, diff)
	}
	if _, ok := keepClaim(claim("nic", []string{"nic.example.com"}, "a")); ok {
		t.Errorf("a claim without GPUs is kept")
	}
}
