package agent

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// Which pods hold which GPU, in device-plugin mode: the kubelet gives each
// container the device IDs the NVIDIA device plugin advertises for
// nvidia.com/gpu — GPU UUIDs by default, GPU indices with
// deviceIDStrategy=index, "<UUID>::<replica>" with time-slicing — and
// tells them through its pod-resources API on the node. The agent reads it
// while a GPU of its node is out of service and records the pods on the
// GPU's GPUFault (status.allocation); the repair drains exactly those.

// DefaultPodResourcesSocket is the kubelet's pod-resources socket.
const DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// DeviceAllocation is one container's devices of one resource, as the
// kubelet's pod-resources API reports them.
type DeviceAllocation struct {
	Pod       repairv1.PodRef
	Resource  string
	DeviceIDs []string
}

// GPUPodsSource is a GPUSource that can also tell which pods the kubelet
// gave the node's device-plugin GPUs. ErrNoPodResources: it cannot (not
// configured); any other error: it could not read it now.
type GPUPodsSource interface {
	GPUPods(ctx context.Context, node *corev1.Node) ([]DeviceAllocation, error)
}

// ErrNoPodResources says a source is not configured to read pod resources.
var ErrNoPodResources = errors.New("pod-resources API not configured")

// podResourcesPoll is how often the monitor reads the pod resources again
// while a GPU of its node is out of service (the API has no watch; a pod
// may still be given the GPU before the device plugin marks it unhealthy).
const podResourcesPoll = 10 * time.Second

// WithAllocations returns writes completed with the GPUs' allocations:
// every record (as written, else as read) whose GPU is out of service gets
// the pods allocs give it (known) or keeps what it had (not known: the
// API could not be read); a record in service has none. Records whose
// allocation changed are added to the writes, which stay ordered by name.
func WithAllocations(records map[string]repairv1.GPUFault, writes []repairv1.GPUFault, allocs []DeviceAllocation, known bool) []repairv1.GPUFault {
	byName := make(map[string]int, len(writes))
	for i, w := range writes {
		byName[w.Name] = i
	}
	names := make([]string, 0, len(records)+len(writes))
	for n := range records {
		if _, ok := byName[n]; !ok {
			names = append(names, n)
		}
	}
	for _, w := range writes {
		names = append(names, w.Name)
	}
	sort.Strings(names)
	var out []repairv1.GPUFault
	for _, n := range names {
		i, written := byName[n]
		var r *repairv1.GPUFault
		if written {
			r = writes[i].DeepCopy()
		} else {
			rec := records[n]
			r = rec.DeepCopy()
		}
		want := r.Status.Allocation
		switch {
		case r.InService():
			want = nil
		case known:
			want = allocationOf(r.Spec.GPU, allocs)
		}
		changed := !equality.Semantic.DeepEqual(want, r.Status.Allocation)
		r.Status.Allocation = want
		if written || changed {
			out = append(out, *r)
		}
	}
	return out
}

// allocationOf is the GPU's allocation among allocs: the pods with a
// device ID of an nvidia.com/gpu resource (nvidia.com/gpu, or a renamed
// shared one such as nvidia.com/gpu.shared) that names it — its UUID, a
// time-slicing replica of it (<UUID>::<n>), or its index.
func allocationOf(g repairv1.GPURef, allocs []DeviceAllocation) *repairv1.GPUAllocation {
	a := &repairv1.GPUAllocation{Resource: string(ResourceGPU)}
	seen := map[repairv1.PodRef]bool{}
	for _, d := range allocs {
		if !strings.HasPrefix(d.Resource, string(ResourceGPU)) || seen[d.Pod] {
			continue
		}
		for _, id := range d.DeviceIDs {
			if namesGPU(id, g) {
				seen[d.Pod] = true
				a.Pods = append(a.Pods, d.Pod)
				break
			}
		}
	}
	sort.Slice(a.Pods, func(i, j int) bool { return a.Pods[i].String() < a.Pods[j].String() })
	if len(a.Pods) > maxAllocatedPods {
		a.Pods = a.Pods[:maxAllocatedPods]
	}
	return a
}

// maxAllocatedPods is the API's bound on an allocation's pods.
const maxAllocatedPods = 64

func namesGPU(id string, g repairv1.GPURef) bool {
	id, _, _ = strings.Cut(id, "::")
	switch {
	case g.UUID != "" && strings.EqualFold(id, g.UUID):
		return true
	case g.Index != nil:
		return id == strconv.Itoa(int(*g.Index))
	}
	return false
}

// AllocationsOf flattens a pod-resources List response.
func AllocationsOf(resp *podresourcesv1.ListPodResourcesResponse) []DeviceAllocation {
	var out []DeviceAllocation
	for _, p := range resp.GetPodResources() {
		ref := repairv1.PodRef{Namespace: p.GetNamespace(), Name: p.GetName()}
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				if len(d.GetDeviceIds()) > 0 {
					out = append(out, DeviceAllocation{Pod: ref, Resource: d.GetResourceName(), DeviceIDs: d.GetDeviceIds()})
				}
			}
		}
	}
	return out
}

// KubeletPodResources reads the kubelet's pod-resources API (v1 List) over
// its unix socket. The connection is made on first use and kept.
type KubeletPodResources struct {
	// Socket is the socket's path (DefaultPodResourcesSocket).
	Socket string
	// Timeout bounds one List call (default 5 s).
	Timeout time.Duration

	mu     sync.Mutex
	client podresourcesv1.PodResourcesListerClient
}

// List returns the devices of every container the kubelet runs.
func (k *KubeletPodResources) List(ctx context.Context) ([]DeviceAllocation, error) {
	c, err := k.lister()
	if err != nil {
		return nil, err
	}
	timeout := k.Timeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := c.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("listing pod resources from the kubelet (%s): %w", k.Socket, err)
	}
	return AllocationsOf(resp), nil
}

func (k *KubeletPodResources) lister() (podresourcesv1.PodResourcesListerClient, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.client != nil {
		return k.client, nil
	}
	conn, err := grpc.NewClient("unix://"+k.Socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// The kubelet's own limit for this API's responses.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16*1024*1024)))
	if err != nil {
		return nil, fmt.Errorf("connecting to the kubelet's pod-resources socket %s: %w", k.Socket, err)
	}
	k.client = podresourcesv1.NewPodResourcesListerClient(conn)
	return k.client, nil
}
