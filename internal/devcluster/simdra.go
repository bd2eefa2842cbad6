package devcluster

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// The simulated DRA driver publishes what NVIDIA's DRA driver for GPUs
// (github.com/NVIDIA/k8s-dra-driver-gpu, since renamed
// sigs.k8s.io/dra-driver-nvidia-gpu; v0.4.0 cmd/gpu-kubelet-plugin,
// GpuInfo.GetDevice) publishes for full GPUs. It has no kubelet plugin:
// kwok plays the kubelet, so a pod whose claim the scheduler allocated
// simply runs. Like that driver since v25.12 it publishes no "index" or
// "minor" attribute (the device name gpu-<i> carries it) and the PCI bus
// ID as the standard attribute resource.kubernetes.io/pciBusID.
const (
	// DRADriver is the name of NVIDIA's DRA driver for GPUs
	// (resourceslice.spec.driver, deviceTaintRule.spec.deviceSelector.driver).
	DRADriver = "gpu.nvidia.com"
	// GPUDeviceClassName names the DeviceClass of full GPUs, as NVIDIA's
	// Helm chart does.
	GPUDeviceClassName = "gpu.nvidia.com"
	// GPUClaimTemplateName is the ResourceClaimTemplate (one full GPU) that
	// CreateGPUClaimPod uses.
	GPUClaimTemplateName = "one-gpu"
	// gpuClaimName names the claim in the pods CreateGPUClaimPod makes.
	gpuClaimName = "gpu"
)

// The simulated GPU model, as NVML describes an H100 SXM and its driver.
const (
	simGPUProduct      = "NVIDIA H100 80GB HBM3"
	simGPUBrand        = "Nvidia"
	simGPUArchitecture = "Hopper"
	simGPUCompute      = "9.0.0"
	simGPUDriver       = "570.133.20"
	simGPUCUDA         = "12.8.0"
	// attrPCIBusID is the standard attribute the driver publishes the PCI
	// bus ID as (k8s.io/dynamic-resource-allocation/deviceattribute).
	attrPCIBusID resourcev1.QualifiedName = "resource.kubernetes.io/pciBusID"
)

// simGPUMemory is an H100 80GB's memory as NVML reports it (85520809984 bytes).
var simGPUMemory = resource.MustParse("81559Mi")

// ResourceSlice returns the ResourceSlice the simulated DRA driver
// publishes for the node this spec describes, once created with uid: pool
// and slice named after the node, one device per GPU (SimGPUDevice(i),
// with the identity SimGPU(node, i)), owned by the Node so that the
// garbage collector removes it with the node. Nil for a node without GPUs,
// or whose GPUs only the device plugin gives out.
func (s NodeSpec) ResourceSlice(uid types.UID) *resourcev1.ResourceSlice {
	if s.GPUs <= 0 || s.DevicePluginOnly {
		return nil
	}
	devices := make([]resourcev1.Device, s.GPUs)
	for i := range devices {
		gpu := SimGPU(s.Name, i)
		devices[i] = resourcev1.Device{
			Name: SimGPUDevice(i),
			Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
				"type":                  {StringValue: ptr.To("gpu")},
				"uuid":                  {StringValue: ptr.To(gpu.UUID)},
				"productName":           {StringValue: ptr.To(simGPUProduct)},
				"brand":                 {StringValue: ptr.To(simGPUBrand)},
				"architecture":          {StringValue: ptr.To(simGPUArchitecture)},
				"cudaComputeCapability": {VersionValue: ptr.To(simGPUCompute)},
				"driverVersion":         {VersionValue: ptr.To(simGPUDriver)},
				"cudaDriverVersion":     {VersionValue: ptr.To(simGPUCUDA)},
				attrPCIBusID:            {StringValue: ptr.To(gpu.PCIBusID)},
			},
			Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{
				"memory": {Value: simGPUMemory.DeepCopy()},
			},
		}
	}
	return &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: s.Name + "-" + DRADriver,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Node", Name: s.Name, UID: uid, Controller: ptr.To(true),
			}},
		},
		Spec: resourcev1.ResourceSliceSpec{
			Driver:   DRADriver,
			Pool:     resourcev1.ResourcePool{Name: s.Name, Generation: 1, ResourceSliceCount: 1},
			NodeName: ptr.To(s.Name),
			Devices:  devices,
		},
	}
}

// Device taints of NVIDIA's DRA driver (its kubelet plugin's health
// monitor, cmd/gpu-kubelet-plugin/device_health.go): one taint per key on
// the device, the value and effect of the latest event, kept until the
// kubelet plugin restarts.
const (
	DRATaintXID     = DRADriver + "/xid"
	DRATaintGPULost = DRADriver + "/gpu-lost"
)

// SimDRATaints are the device taints the simulated DRA driver's kubelet
// plugin, started at since, puts on each GPU of the host (by index): for
// an XID since then, gpu.nvidia.com/xid=<code>, NoSchedule — None for the
// XIDs the driver treats as application errors (the device plugin's
// list) — the latest one's; for a GPU off the bus, gpu.nvidia.com/gpu-lost
// (NoSchedule).
func SimDRATaints(h SimGPUHost, since time.Time) map[int][]resourcev1.DeviceTaint {
	out := map[int][]resourcev1.DeviceTaint{}
	xid := map[int]resourcev1.DeviceTaint{}
	for _, x := range simXIDs(h) {
		if x.at.Before(since) {
			continue
		}
		effect := resourcev1.DeviceTaintEffectNoSchedule
		if slices.Contains(devicePluginSkippedXIDs, x.code) {
			effect = resourcev1.DeviceTaintEffectNone
		}
		xid[x.gpu] = resourcev1.DeviceTaint{Key: DRATaintXID, Value: strconv.Itoa(x.code), Effect: effect}
	}
	for i := range h.GPUs {
		if t, ok := xid[i]; ok {
			out[i] = append(out[i], t)
		}
		if h.State[i].Missing {
			out[i] = append(out[i], resourcev1.DeviceTaint{Key: DRATaintGPULost, Effect: resourcev1.DeviceTaintEffectNoSchedule})
		}
	}
	return out
}

// syncSliceTaints writes the simulated driver's device taints (SimDRATaints)
// into the node's ResourceSlice when they differ (one update of the slice
// as the loop's cache holds it — a stale one is refused and the pass runs
// again; a taint that stays keeps its timeAdded, a new or changed one gets
// the API server's).
func (c *Cluster) syncSliceTaints(ctx context.Context, node *corev1.Node, since time.Time, published cache.Store) error {
	h, err := ReadSimGPUHost(node)
	if err != nil || h.GPUs == 0 {
		return err
	}
	want := SimDRATaints(h, since)
	obj, ok, err := published.GetByKey(node.Name + "-" + DRADriver)
	if err != nil || !ok {
		return err // a device-plugin node, or not published yet (the slice's creation queues the node)
	}
	slice := obj.(*resourcev1.ResourceSlice).DeepCopy()
	if slice.Spec.NodeName == nil || *slice.Spec.NodeName != node.Name || !metav1.IsControlledBy(slice, node) {
		return nil // an earlier node's slice, about to be replaced
	}
	changed := false
	for d := range slice.Spec.Devices {
		dev := &slice.Spec.Devices[d]
		i := -1
		for g := range h.GPUs {
			if dev.Name == SimGPUDevice(g) {
				i = g
			}
		}
		if i < 0 {
			continue
		}
		var next []resourcev1.DeviceTaint
		for _, t := range want[i] {
			for _, old := range dev.Taints {
				if old.Key == t.Key && old.Value == t.Value && old.Effect == t.Effect {
					t.TimeAdded = old.TimeAdded
				}
			}
			next = append(next, t)
		}
		if !equality.Semantic.DeepEqual(next, dev.Taints) && (len(next) > 0 || len(dev.Taints) > 0) {
			dev.Taints, changed = next, true
		}
	}
	if !changed {
		return nil
	}
	if _, err := c.Client.ResourceV1().ResourceSlices().Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("updating the device taints of ResourceSlice %s: %w", slice.Name, err)
	}
	return nil
}

// GPUDeviceClass returns the DeviceClass of full GPUs as NVIDIA's Helm
// chart defines it: the driver's devices of type "gpu".
func GPUDeviceClass() *resourcev1.DeviceClass {
	return &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: GPUDeviceClassName},
		Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{
			Expression: fmt.Sprintf("device.driver == %q && device.attributes[%q].type == 'gpu'", DRADriver, DRADriver),
		}}}},
	}
}

// publishGPUSlice publishes the node's ResourceSlice (one create). A slice
// of an earlier node of the same name that the garbage collector has not
// removed yet is replaced; one of this node is left alone.
func (c *Cluster) publishGPUSlice(ctx context.Context, s NodeSpec, uid types.UID) error {
	slice := s.ResourceSlice(uid)
	if slice == nil {
		return nil
	}
	api := c.Client.ResourceV1().ResourceSlices()
	_, err := api.Create(ctx, slice, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		old, getErr := api.Get(ctx, slice.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(getErr):
		case getErr != nil:
			return fmt.Errorf("reading ResourceSlice %s: %w", slice.Name, getErr)
		case metav1.IsControlledBy(old, &metav1.ObjectMeta{UID: uid}):
			return nil
		default:
			// The UID precondition keeps this from deleting a slice that
			// someone else replaced in between.
			if err := api.Delete(ctx, slice.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &old.UID}}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("deleting stale ResourceSlice %s: %w", slice.Name, err)
			}
		}
		_, err = api.Create(ctx, slice, metav1.CreateOptions{})
	}
	if err != nil {
		return fmt.Errorf("publishing ResourceSlice of node %s: %w", s.Name, err)
	}
	return nil
}

// ensureGPUDeviceClass creates the GPU DeviceClass unless it exists.
func (c *Cluster) ensureGPUDeviceClass(ctx context.Context) error {
	_, err := c.Client.ResourceV1().DeviceClasses().Create(ctx, GPUDeviceClass(), metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating DeviceClass %s: %w", GPUDeviceClassName, err)
	}
	return nil
}

// GPUClaimTemplate returns a ResourceClaimTemplate asking for one device
// of the GPU DeviceClass.
func GPUClaimTemplate(namespace, name string) *resourcev1.ResourceClaimTemplate {
	return &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{
			Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
				Name: "gpu",
				Exactly: &resourcev1.ExactDeviceRequest{
					DeviceClassName: GPUDeviceClassName,
					AllocationMode:  resourcev1.DeviceAllocationModeExactCount,
					Count:           1,
				},
			}}},
		}},
	}
}

// GPUClaimPod returns a pod whose container uses a claim made from the
// template. It is pinned to node by a node selector, not spec.nodeName, so
// the scheduler places it and allocates its claim.
func GPUClaimPod(namespace, name, template, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: corev1.PodSpec{
			NodeSelector:   map[string]string{corev1.LabelHostname: node},
			ResourceClaims: []corev1.PodResourceClaim{{Name: gpuClaimName, ResourceClaimTemplateName: ptr.To(template)}},
			Containers: []corev1.Container{{
				Name:      "main",
				Image:     "registry.example/cuda:12",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: gpuClaimName}}},
			}},
		},
	}
}

// CreateGPUClaimPod creates a pod using one GPU through a claim from the
// template GPUClaimTemplateName (created in the namespace unless it exists),
// pinned to node (see GPUClaimPod).
func (c *Cluster) CreateGPUClaimPod(ctx context.Context, namespace, name, node string) (*corev1.Pod, error) {
	_, err := c.Client.ResourceV1().ResourceClaimTemplates(namespace).Create(ctx, GPUClaimTemplate(namespace, GPUClaimTemplateName), metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating ResourceClaimTemplate %s/%s: %w", namespace, GPUClaimTemplateName, err)
	}
	pod, err := c.Client.CoreV1().Pods(namespace).Create(ctx, GPUClaimPod(namespace, name, GPUClaimTemplateName, node), metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating pod %s/%s: %w", namespace, name, err)
	}
	return pod, nil
}

// AllocatedDevices returns the names of the devices allocated to the pod's
// claims, sorted; none while its claims are not created or not allocated.
func (c *Cluster) AllocatedDevices(ctx context.Context, namespace, pod string) ([]string, error) {
	p, err := c.Client.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading pod %s/%s: %w", namespace, pod, err)
	}
	var devices []string
	for _, pc := range p.Spec.ResourceClaims {
		claim := ptr.Deref(pc.ResourceClaimName, "")
		for _, st := range p.Status.ResourceClaimStatuses {
			if st.Name == pc.Name && st.ResourceClaimName != nil {
				claim = *st.ResourceClaimName
			}
		}
		if claim == "" {
			continue
		}
		rc, err := c.Client.ResourceV1().ResourceClaims(namespace).Get(ctx, claim, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("reading ResourceClaim %s/%s of pod %s: %w", namespace, claim, pod, err)
		}
		if rc.Status.Allocation == nil {
			continue
		}
		for _, r := range rc.Status.Allocation.Devices.Results {
			devices = append(devices, r.Device)
		}
	}
	slices.Sort(devices)
	return devices, nil
}
