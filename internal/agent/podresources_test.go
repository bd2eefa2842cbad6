package agent

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

func pod(ns, name string) repairv1.PodRef { return repairv1.PodRef{Namespace: ns, Name: name} }

func TestWithAllocations(t *testing.T) {
	faulty := rec(name3, ref3(), repairv1.GPUFaultStatus{Class: repairv1.GPUClassResetGPU})
	healthy := rec(name3, ref3(), repairv1.GPUFaultStatus{})
	withPods := func(r repairv1.GPUFault, pods ...repairv1.PodRef) repairv1.GPUFault {
		r = *r.DeepCopy()
		r.Status.Allocation = &repairv1.GPUAllocation{Resource: "nvidia.com/gpu", Pods: pods}
		return r
	}
	other := rec("gpu-003-0000-20-00-0", repairv1.GPURef{Index: ptr.To[int32](4), UUID: "GPU-4444", PCIBusID: "0000:20:00.0"},
		repairv1.GPUFaultStatus{Class: repairv1.GPUClassReboot})
	allocs := []DeviceAllocation{
		{Pod: pod("ml", "train-3"), Resource: "nvidia.com/gpu", DeviceIDs: []string{uuid3}},
		{Pod: pod("ml", "train-0"), Resource: "nvidia.com/gpu", DeviceIDs: []string{"GPU-0000", "GPU-1111"}},
		{Pod: pod("ml", "infer"), Resource: "nvidia.com/gpu.shared", DeviceIDs: []string{uuid3 + "::2"}},
		{Pod: pod("ml", "by-index"), Resource: "nvidia.com/gpu", DeviceIDs: []string{"4"}},
		{Pod: pod("net", "rdma"), Resource: "rdma/hca", DeviceIDs: []string{uuid3}},
	}
	tests := map[string]struct {
		records map[string]repairv1.GPUFault
		writes  []repairv1.GPUFault
		allocs  []DeviceAllocation
		known   bool
		want    []repairv1.GPUFault
	}{
		"an out-of-service GPU gets the pods given its UUID, a replica of it, not other resources": {
			records: records(faulty), allocs: allocs, known: true,
			want: []repairv1.GPUFault{withPods(faulty, pod("ml", "infer"), pod("ml", "train-3"))},
		},
		"device IDs may be indices (deviceIDStrategy=index)": {
			records: records(other), allocs: allocs, known: true,
			want: []repairv1.GPUFault{withPods(other, pod("ml", "by-index"))},
		},
		"no pod holds it: known, empty": {
			records: records(faulty), allocs: allocs[1:2], known: true,
			want: []repairv1.GPUFault{withPods(faulty)},
		},
		"unchanged: nothing to write": {
			records: records(withPods(faulty, pod("ml", "train-3"))), allocs: allocs[:1], known: true,
		},
		"not known: the allocation stays as it was": {
			records: records(withPods(faulty, pod("ml", "train-3"))),
		},
		"not known and never known: none": {
			records: records(faulty),
		},
		"back in service: the allocation goes": {
			records: records(withPods(healthy, pod("ml", "train-3"))), allocs: allocs, known: true,
			want: []repairv1.GPUFault{healthy},
		},
		"a record being written gets it in the same write, and the writes stay ordered": {
			records: records(), writes: []repairv1.GPUFault{other, faulty}, allocs: allocs, known: true,
			want: []repairv1.GPUFault{withPods(faulty, pod("ml", "infer"), pod("ml", "train-3")), withPods(other, pod("ml", "by-index"))},
		},
		"a written record going back in service loses it": {
			records: records(withPods(faulty, pod("ml", "train-3"))), writes: []repairv1.GPUFault{withPods(healthy, pod("ml", "train-3"))},
			want: []repairv1.GPUFault{healthy},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := WithAllocations(tc.records, tc.writes, tc.allocs, tc.known)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("writes (-want +got):\n%s", diff)
			}
		})
	}
}

// podLister is a kubelet pod-resources server that lists resp.
type podLister struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	resp *podresourcesv1.ListPodResourcesResponse
}

func (p *podLister) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	return p.resp, nil
}

// TestKubeletPodResources reads a pod-resources server on a unix socket, as
// the kubelet serves it.
func TestKubeletPodResources(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "kubelet.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(srv, &podLister{resp: &podresourcesv1.ListPodResourcesResponse{
		PodResources: []*podresourcesv1.PodResources{
			{Namespace: "ml", Name: "train-3", Containers: []*podresourcesv1.ContainerResources{
				{Name: "main", Devices: []*podresourcesv1.ContainerDevices{{ResourceName: "nvidia.com/gpu", DeviceIds: []string{uuid3}}}},
				{Name: "sidecar"},
			}},
			{Namespace: "kube-system", Name: "cpu-only", Containers: []*podresourcesv1.ContainerResources{{Name: "c", CpuIds: []int64{1}}}},
		},
	}})
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)

	k := &KubeletPodResources{Socket: sock, Timeout: 5 * time.Second}
	got, err := k.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := []DeviceAllocation{{Pod: pod("ml", "train-3"), Resource: "nvidia.com/gpu", DeviceIDs: []string{uuid3}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("allocations (-want +got):\n%s", diff)
	}

	// The agent's source reads it; without a socket it says so.
	h := &HostGPUSource{PodResources: k}
	if got, err := h.GPUPods(t.Context(), nil); err != nil || len(got) != 1 {
		t.Errorf("HostGPUSource.GPUPods: %v, %v", got, err)
	}
	if _, err := (&HostGPUSource{}).GPUPods(t.Context(), nil); !errors.Is(err, ErrNoPodResources) {
		t.Errorf("without a socket: %v, want ErrNoPodResources", err)
	}
	missing := &KubeletPodResources{Socket: filepath.Join(t.TempDir(), "none.sock"), Timeout: time.Second}
	if _, err := missing.List(t.Context()); err == nil {
		t.Error("a missing socket gave no error")
	}
}

// fakeGPUPods is a GPUSource that also tells the pods of the GPUs.
type fakeGPUPods struct {
	fakeGPUs
	allocs []DeviceAllocation
	err    error
	calls  int
}

func (f *fakeGPUPods) GPUPods(context.Context, *corev1.Node) ([]DeviceAllocation, error) {
	f.calls++
	return f.allocs, f.err
}

// TestGPUMonitorRecordsThePodsOfAFaultyGPU: the monitor asks which pods
// hold the GPUs only while one is out of service, records them on the
// GPU's record in the same write, and looks again later (no watch in the
// pod-resources API); a failing API keeps what was recorded.
func TestGPUMonitorRecordsThePodsOfAFaultyGPU(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(gNow)
	w := &writeCounter{}
	c := newFakeClient(t, w.funcs(nil), gpuNode(gNode))
	src := &fakeGPUPods{fakeGPUs: fakeGPUs{obs: GPUObservation{DCGM: health(nil)}},
		allocs: []DeviceAllocation{{Pod: pod("ml", "train-3"), Resource: "nvidia.com/gpu", DeviceIDs: []string{uuid3}}}}
	m := &GPUMonitor{Client: clientAPI{c}, Source: src, Clock: clk, NodeName: gNode}
	pass := func() time.Duration {
		t.Helper()
		res, err := m.Reconcile(t.Context(), gNode)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := pass(); res != 0 || src.calls != 0 {
		t.Fatalf("healthy GPUs: requeue %s, pod-resources calls %d; want neither", res, src.calls)
	}
	src.obs.DCGM = health(dbe(2))
	if res := pass(); res != podResourcesPoll {
		t.Errorf("a GPU out of service: requeue %s, want %s", res, podResourcesPoll)
	}
	f := listFaults(t, c)
	if len(f) != 1 || f[0].Status.Allocation == nil || !cmp.Equal(f[0].Status.Allocation.Pods, []repairv1.PodRef{pod("ml", "train-3")}) {
		t.Fatalf("records %+v, want GPU 3's with pod ml/train-3", f)
	}
	w.writes = nil
	src.err = errors.New("connection refused")
	pass()
	if len(w.writes) != 0 {
		t.Errorf("an unreadable pod-resources API wrote %v", w.writes)
	}
	src.err = nil
	src.obs.DCGM = health(nil) // the reset cleared the counter
	pass()
	if f := listFaults(t, c); f[0].Status.Allocation != nil {
		t.Errorf("back in service, allocation %+v", f[0].Status.Allocation)
	}
}
