package devcluster

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// gpuPod is a pod of node gpu-003 requesting gpus nvidia.com/gpu, created
// age ago, with AnnotationGPUs held if not empty.
func gpuPod(name string, gpus int, age time.Duration, held string) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name, CreationTimestamp: metav1.NewTime(simT.Add(-age))},
		Spec: corev1.PodSpec{NodeName: "gpu-003", Containers: []corev1.Container{{Name: "c"}}}}
	if gpus > 0 {
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{ResourceGPU: *resource.NewQuantity(int64(gpus), resource.DecimalSI)}
	}
	if held != "" {
		p.Annotations = map[string]string{AnnotationGPUs: held}
	}
	return p
}

// pluginPod is a pod of the simulated device plugin on node gpu-003,
// created (the plugin started) at start.
func pluginPod(start time.Time) corev1.Pod {
	return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "sim-nvidia-device-plugin-x", CreationTimestamp: metav1.NewTime(start),
		Labels: map[string]string{"app.kubernetes.io/name": "nvidia-device-plugin"}}, Spec: corev1.PodSpec{NodeName: "gpu-003", Containers: []corev1.Container{{Name: "plugin"}}}}
}

// TestSimDevicePluginAllocate: pods waiting for GPUs get the lowest free
// healthy ones, oldest pod first; a GPU held by another pod, off the bus,
// or with an XID the plugin does not skip is not given; an application XID
// and an ECC count (which the plugin does not see) do not matter; after a
// reset the GPU is given again only once the plugin restarted; a pod that cannot get all it asks for gets
// none.
func TestSimDevicePluginAllocate(t *testing.T) {
	type step func(t *testing.T, c *Cluster)
	xid := func(gpu, code int) step {
		return func(t *testing.T, c *Cluster) {
			if err := c.InjectXID(t.Context(), "gpu-003", gpu, code); err != nil {
				t.Fatal(err)
			}
		}
	}
	state := func(gpu int, fn func(*SimGPUState)) step {
		return func(t *testing.T, c *Cluster) {
			if err := c.SetGPUState(t.Context(), "gpu-003", gpu, fn); err != nil {
				t.Fatal(err)
			}
		}
	}
	reset := func(gpu int) step {
		return func(t *testing.T, c *Cluster) {
			err := SimExecutor{Cluster: c}.Execute(context.Background(), simNode(t, c), repairv1.ActionResetGPU, []repairv1.GPURef{SimGPU("gpu-003", gpu)})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := map[string]struct {
		host []step
		pods []corev1.Pod
		want map[string]string
	}{
		"the lowest free GPUs, oldest pod first": {
			pods: []corev1.Pod{gpuPod("b", 1, time.Minute, ""), gpuPod("a", 2, time.Hour, ""), gpuPod("held", 1, time.Hour, "1"), gpuPod("cpu", 0, time.Hour, "")},
			want: map[string]string{"ml/a": "0,2", "ml/b": "3"},
		},
		"a finished pod holds nothing": {
			pods: []corev1.Pod{func() corev1.Pod {
				p := gpuPod("done", 1, time.Hour, "0")
				p.Status.Phase = corev1.PodSucceeded
				return p
			}(),
				gpuPod("new", 1, time.Minute, "")},
			want: map[string]string{"ml/new": "0"},
		},
		"an XID the plugin sees: the GPU is not given": {
			host: []step{xid(0, 48)},
			pods: []corev1.Pod{gpuPod("new", 1, time.Minute, "")},
			want: map[string]string{"ml/new": "1"},
		},
		"an application XID and an ECC count: given": {
			host: []step{xid(0, 13), state(1, func(s *SimGPUState) { s.VolatileDBE = 2 })},
			pods: []corev1.Pod{gpuPod("new", 2, time.Minute, "")},
			want: map[string]string{"ml/new": "0,1"},
		},
		"off the bus: not given": {
			host: []step{state(0, func(s *SimGPUState) { s.Missing = true })},
			pods: []corev1.Pod{gpuPod("new", 1, time.Minute, "")},
			want: map[string]string{"ml/new": "1"},
		},
		"reset after the XID: still not given (the plugin never marks a GPU healthy again)": {
			host: []step{xid(0, 48), reset(0)},
			pods: []corev1.Pod{gpuPod("new", 1, time.Minute, "")},
			want: map[string]string{"ml/new": "1"},
		},
		"the plugin restarted after the XID: given again": {
			host: []step{xid(0, 48), reset(0)},
			pods: []corev1.Pod{gpuPod("new", 1, time.Minute, ""), pluginPod(simT.Add(time.Second))},
			want: map[string]string{"ml/new": "0"},
		},
		"the plugin started before the XID: not given": {
			host: []step{xid(0, 48), reset(0)},
			pods: []corev1.Pod{gpuPod("new", 1, time.Minute, ""), pluginPod(simT.Add(-time.Hour))},
			want: map[string]string{"ml/new": "1"},
		},
		"not enough free GPUs: none": {
			pods: []corev1.Pod{gpuPod("held", 6, time.Hour, "0,1,2,3,4,5"), gpuPod("big", 3, time.Minute, ""), gpuPod("small", 2, time.Second, "")},
			want: map[string]string{"ml/small": "6,7"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c, _ := simHostCluster(t)
			for _, s := range tc.host {
				s(t, c)
			}
			got := map[string]string{}
			for k, v := range SimDevicePluginAllocate(simNode(t, c), tc.pods, nil) {
				got[k.String()] = v
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("allocations (-want +got):\n%s", diff)
			}
		})
	}
	// Pods of other nodes are not this node's.
	other := gpuPod("elsewhere", 1, time.Minute, "")
	other.Spec.NodeName = "gpu-004"
	c, _ := simHostCluster(t)
	if got := SimDevicePluginAllocate(simNode(t, c), []corev1.Pod{other}, nil); len(got) != 0 {
		t.Errorf("a pod of another node got %v", got)
	}
}

// TestSimDevicePluginAllocatable: the node advertises the GPUs that pass
// the plugin's health check (allocatable 7 of 8 with one XID it sees),
// not fewer for what it does not see (an application XID, an ECC count),
// all again once the plugin restarted after the XID (a reset is not
// enough); nothing to change when the status already
// says so.
func TestSimDevicePluginAllocatable(t *testing.T) {
	xid := func(gpu, code int) func(*testing.T, *Cluster) {
		return func(t *testing.T, c *Cluster) {
			if err := c.InjectXID(t.Context(), "gpu-003", gpu, code); err != nil {
				t.Fatal(err)
			}
		}
	}
	reset := func(gpu int) func(*testing.T, *Cluster) {
		return func(t *testing.T, c *Cluster) {
			err := SimExecutor{Cluster: c}.Execute(context.Background(), simNode(t, c), repairv1.ActionResetGPU, []repairv1.GPURef{SimGPU("gpu-003", gpu)})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	for name, tc := range map[string]struct {
		host        []func(*testing.T, *Cluster)
		allocatable string // the node's status before ("" none)
		pluginStart time.Time
		want        int
		change      bool
	}{
		"healthy, as advertised":                   {allocatable: "8", want: 8},
		"healthy, not advertised yet":              {want: 8, change: true},
		"one XID the plugin sees: 7 of 8":          {host: []func(*testing.T, *Cluster){xid(3, 48)}, allocatable: "8", want: 7, change: true},
		"two GPUs out":                             {host: []func(*testing.T, *Cluster){xid(3, 48), xid(5, 79)}, allocatable: "7", want: 6, change: true},
		"an application XID: all 8":                {host: []func(*testing.T, *Cluster){xid(3, 13)}, allocatable: "8", want: 8},
		"reset: still 7 until the plugin restarts": {host: []func(*testing.T, *Cluster){xid(3, 48), reset(3)}, allocatable: "7", want: 7},
		"the plugin restarted after the XID: all 8 again": {host: []func(*testing.T, *Cluster){xid(3, 48), reset(3)}, allocatable: "7",
			pluginStart: simT.Add(time.Second), want: 8, change: true},
		"the plugin restarted before the XID: 7": {host: []func(*testing.T, *Cluster){xid(3, 48)}, allocatable: "7",
			pluginStart: simT.Add(-time.Second), want: 7},
		"an ECC count the plugin does not see": {host: []func(*testing.T, *Cluster){func(t *testing.T, c *Cluster) {
			_ = c.SetGPUState(t.Context(), "gpu-003", 2, func(s *SimGPUState) { s.VolatileDBE = 2 })
		}}, allocatable: "8", want: 8},
	} {
		t.Run(name, func(t *testing.T) {
			c, _ := simHostCluster(t)
			for _, s := range tc.host {
				s(t, c)
			}
			n := simNode(t, c)
			delete(n.Status.Allocatable, ResourceGPU)
			if tc.allocatable != "" {
				n.Status.Allocatable[ResourceGPU] = resource.MustParse(tc.allocatable)
			}
			if got, change := SimDevicePluginAllocatable(n, tc.pluginStart); got != tc.want || change != tc.change {
				t.Errorf("got %d (change %t), want %d (change %t)", got, change, tc.want, tc.change)
			}
		})
	}
}

// TestSimPluginPassesKeepTheLatestWaits: the queue waits of the simulated
// GPU plugins' passes are kept for the latest passes only (a dev cluster
// runs for days); the passes after a mark are returned while kept.
func TestSimPluginPassesKeepTheLatestWaits(t *testing.T) {
	s := &simDevicePlugin{last: map[string]SimPluginSync{}}
	c := &Cluster{simPlugins: s}
	total := 2*simPluginWaitsKept + 5
	for i := range total {
		s.record("gpu-000", SimPluginSync{Waited: time.Duration(i)})
	}
	if got := c.SimPluginPasses(); got != total {
		t.Errorf("%d passes counted, want %d", got, total)
	}
	if n := len(s.waits); n > 2*simPluginWaitsKept {
		t.Errorf("%d waits kept, want at most %d", n, 2*simPluginWaitsKept)
	}
	since := c.SimPluginWaitsSince(total - 3)
	if len(since) != 3 || since[0] != time.Duration(total-3) || since[2] != time.Duration(total-1) {
		t.Errorf("the waits of the last 3 passes: %v", since)
	}
	if got := c.SimPluginWaitsSince(0); len(got) != len(s.waits) || got[0] != time.Duration(simPluginWaitsKept) {
		t.Errorf("the waits since the start: %d kept, first %v; want those still kept", len(got), got[0])
	}
	if last, ok := c.SimPluginLastSync("gpu-000"); !ok || last.Waited != time.Duration(total-1) {
		t.Errorf("last pass %+v, %t", last, ok)
	}
	if _, ok := (&Cluster{}).SimPluginLastSync("gpu-000"); ok {
		t.Errorf("a cluster without the simulated plugins reported a pass")
	}
}
