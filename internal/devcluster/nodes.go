package devcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Well-known labels of simulated nodes.
const (
	// LabelPool names the node pool (auto-repair works one pool at a time).
	LabelPool = "gpufleet.dev/pool"
	// NFD labels, as Node Feature Discovery sets them on real GPU nodes.
	LabelNFDNvidiaPCI = "feature.node.kubernetes.io/pci-10de.present"
	LabelNFDOSID      = "feature.node.kubernetes.io/system-os_release.ID"
	LabelNFDOSVersion = "feature.node.kubernetes.io/system-os_release.VERSION_ID"
	LabelNFDKernel    = "feature.node.kubernetes.io/kernel-version.full"
	// ResourceGPU is the extended resource the device plugin advertises.
	ResourceGPU corev1.ResourceName = "nvidia.com/gpu"
)

// Container runtime versions as kubelets report them.
const (
	RuntimeContainerd = "containerd://1.7.24"
	RuntimeDocker     = "docker://27.3.1"
	RuntimeCRIO       = "cri-o://1.31.2"
)

// NodeSpec describes one simulated node.
type NodeSpec struct {
	Name string
	// Pool is the value of LabelPool.
	Pool string
	// GPUs is the number of GPUs; 0 makes a CPU-only node without NVIDIA
	// PCI labels.
	GPUs int
	// DevicePluginOnly: the simulated DRA driver does not publish the
	// node's GPUs; pods get them as nvidia.com/gpu only (the classic
	// device plugin), and sim.gpufleet.dev/gpus on a pod says which (set
	// by the simulated device plugin, simdeviceplugin.go, unless the pod
	// has it already). The node is labelled LabelDevicePluginOnly.
	DevicePluginOnly bool
	// OSID and OSVersion as in /etc/os-release (e.g. "ubuntu", "22.04").
	OSID, OSVersion string
	// Runtime is status.nodeInfo.containerRuntimeVersion.
	Runtime string
	// Kernel is the kernel version.
	Kernel string
	// Labels are added to the generated ones (and win).
	Labels map[string]string
	// Taints are set on the node.
	Taints []corev1.Taint
	// Unschedulable creates the node cordoned.
	Unschedulable bool
	// Capacity overrides entries of the generated capacity (and
	// allocatable), e.g. pods: 0 for a node the scheduler cannot use.
	Capacity corev1.ResourceList
}

// GPUNodes returns n GPU node specs named gpu-000…, spread round-robin over
// pools pools (pool-a, pool-b, … pool-z, then pool-26, …), all ubuntu 22.04 with containerd and 8 GPUs.
func GPUNodes(n, pools int) []NodeSpec {
	if pools < 1 {
		pools = 1
	}
	specs := make([]NodeSpec, n)
	for i := range specs {
		specs[i] = NodeSpec{
			Name: fmt.Sprintf("gpu-%03d", i),
			Pool: "pool-" + poolSuffix(i%pools),
			GPUs: 8,
		}
	}
	return specs
}

// LabelGPUClique is the label GPU feature discovery puts on the nodes of
// one NVLink domain (e.g. the nodes of a GB200 NVL72 rack).
const LabelGPUClique = "nvidia.com/gpu.clique"

// InDomains labels the GPU nodes of specs into n NVLink domains
// (LabelGPUClique, values rack-0 …), consecutive nodes together; n ≤ 0
// leaves them in none.
func InDomains(specs []NodeSpec, n int) {
	var gpu []int
	for i, s := range specs {
		if s.GPUs > 0 {
			gpu = append(gpu, i)
		}
	}
	if n <= 0 || len(gpu) == 0 {
		return
	}
	per := (len(gpu) + n - 1) / n
	for k, i := range gpu {
		if specs[i].Labels == nil {
			specs[i].Labels = map[string]string{}
		}
		specs[i].Labels[LabelGPUClique] = fmt.Sprintf("rack-%d", k/per)
	}
}

func (s NodeSpec) withDefaults() NodeSpec {
	if s.OSID == "" {
		s.OSID = "ubuntu"
	}
	if s.OSVersion == "" {
		s.OSVersion = "22.04"
	}
	if s.Runtime == "" {
		s.Runtime = RuntimeContainerd
	}
	if s.Kernel == "" {
		s.Kernel = "5.15.0-126-generic"
	}
	return s
}

// Node renders the spec as a Node object, status included.
func (s NodeSpec) Node() *corev1.Node {
	s = s.withDefaults()
	labels := map[string]string{
		"type":                   "kwok", // managed by kwok
		"kubernetes.io/hostname": s.Name,
		"kubernetes.io/os":       "linux",
		"kubernetes.io/arch":     "amd64",
		LabelNFDOSID:             s.OSID,
		LabelNFDOSVersion:        s.OSVersion,
		LabelNFDKernel:           s.Kernel,
	}
	if s.Pool != "" {
		labels[LabelPool] = s.Pool
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("96"),
		corev1.ResourceMemory: resource.MustParse("1Ti"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	if s.GPUs > 0 && s.DevicePluginOnly {
		labels[LabelDevicePluginOnly] = "true"
	}
	if s.GPUs > 0 {
		labels[LabelNFDNvidiaPCI] = "true"
		labels["feature.node.kubernetes.io/pci-0302_10de.present"] = "true"
		capacity[ResourceGPU] = *resource.NewQuantity(int64(s.GPUs), resource.DecimalSI)
	}
	for k, v := range s.Labels {
		labels[k] = v
	}
	for k, v := range s.Capacity {
		capacity[k] = v
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        s.Name,
			Labels:      labels,
			Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0"},
		},
		Spec: corev1.NodeSpec{Taints: s.Taints, Unschedulable: s.Unschedulable},
		Status: corev1.NodeStatus{
			Capacity:    capacity,
			Allocatable: capacity.DeepCopy(),
			NodeInfo: corev1.NodeSystemInfo{
				Architecture:            "amd64",
				OperatingSystem:         "linux",
				OSImage:                 osImage(s.OSID, s.OSVersion),
				KernelVersion:           s.Kernel,
				ContainerRuntimeVersion: s.Runtime,
				KubeletVersion:          "v1.37.2",
				BootID:                  uuid.NewString(),
				MachineID:               uuid.NewString(),
				SystemUUID:              uuid.NewString(),
			},
		},
	}
}

func osImage(id, version string) string {
	switch id {
	case "ubuntu":
		return "Ubuntu " + version + " LTS"
	case "rhel":
		return "Red Hat Enterprise Linux " + version
	default:
		return id + " " + version
	}
}

// AddNodes creates the nodes, with the simulated DRA driver's
// ResourceSlice for each one with GPUs (the simulated device plugin for
// each device-plugin node), and waits until kwok has made every one Ready.
func (c *Cluster) AddNodes(ctx context.Context, specs ...NodeSpec) error {
	for _, s := range specs {
		if s.GPUs > 0 {
			if err := c.startSimGPUPlugins(ctx); err != nil {
				return fmt.Errorf("starting the simulated GPU plugins: %w", err)
			}
		}
		node, err := c.Client.CoreV1().Nodes().Create(ctx, s.Node(), metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("creating node %s: %w", s.Name, err)
		}
		if err := c.publishGPUSlice(ctx, s, node.UID); err != nil {
			return err
		}
	}
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.Name
	}
	return c.WaitNodesReady(ctx, names...)
}

// WaitNodesReady waits until every named node reports Ready=True.
func (c *Cluster) WaitNodesReady(ctx context.Context, names ...string) error {
	pending := map[string]bool{}
	for _, n := range names {
		pending[n] = true
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // transient; keep polling
		}
		for i := range nodes.Items {
			if NodeReady(&nodes.Items[i]) {
				delete(pending, nodes.Items[i].Name)
			}
		}
		return len(pending) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %d node(s) to become Ready (still waiting: %v): %w", len(pending), keys(pending), err)
	}
	return nil
}

// NodeReady reports whether the node's Ready condition is True.
func NodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// SetNodeCondition injects a node condition (fault injection). Setting the
// Ready condition freezes the node's simulated status so that kwok does not
// overwrite it; ClearNodeCondition(Ready) unfreezes it.
func (c *Cluster) SetNodeCondition(ctx context.Context, node string, cond corev1.NodeCondition) error {
	if cond.Type == corev1.NodeReady {
		if err := c.setLabel(ctx, node, LabelFrozen, "true"); err != nil {
			return err
		}
	}
	now := metav1.Now()
	if cond.LastHeartbeatTime.IsZero() {
		cond.LastHeartbeatTime = now
	}
	if cond.LastTransitionTime.IsZero() {
		cond.LastTransitionTime = now
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{cond}}})
	if err != nil {
		return err
	}
	if _, err := c.Client.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("setting condition %s on node %s: %w", cond.Type, node, err)
	}
	return nil
}

// ClearNodeCondition removes an injected condition. For Ready, the node is
// unfrozen and kwok marks it Ready again.
func (c *Cluster) ClearNodeCondition(ctx context.Context, node string, condType corev1.NodeConditionType) error {
	if condType == corev1.NodeReady {
		return c.setLabel(ctx, node, LabelFrozen, "")
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []map[string]any{{"type": condType, "$patch": "delete"}}}})
	if err != nil {
		return err
	}
	if _, err := c.Client.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("clearing condition %s on node %s: %w", condType, node, err)
	}
	return nil
}

// StopKubelet stops the node's simulated kubelet: no more lease renewals or
// status updates, so the real node lifecycle controller marks it NotReady;
// its pods are no longer managed (deleted pods stay Terminating).
func (c *Cluster) StopKubelet(ctx context.Context, node string) error {
	return c.setLabel(ctx, node, LabelKubelet, "stopped")
}

// StartKubelet resumes a stopped kubelet.
func (c *Cluster) StartKubelet(ctx context.Context, node string) error {
	return c.setLabel(ctx, node, LabelKubelet, "")
}

// Reboot simulates a reboot: the node gets a new boot ID and reports
// NotReady for downtime, then Ready again. It blocks for downtime.
func (c *Cluster) Reboot(ctx context.Context, node string, downtime time.Duration) error {
	bootID := uuid.NewString()
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"nodeInfo": map[string]string{"bootID": bootID}}})
	if err := c.SetNodeCondition(ctx, node, corev1.NodeCondition{
		Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "KubeletNotReady", Message: "node is rebooting",
	}); err != nil {
		return err
	}
	if _, err := c.Client.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("setting new boot ID on node %s: %w", node, err)
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(downtime):
	}
	return c.ClearNodeCondition(ctx, node, corev1.NodeReady)
}

// setLabel sets (or with value "" removes) a label on a node.
func (c *Cluster) setLabel(ctx context.Context, node, key, value string) error {
	var v any = value
	if value == "" {
		v = nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{key: v}}})
	if err != nil {
		return err
	}
	if _, err := c.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("labelling node %s %s=%q: %w", node, key, value, err)
	}
	return nil
}

// poolSuffix names the k-th pool: a letter for the first 26, then its number.
func poolSuffix(k int) string {
	if k < 26 {
		return string(rune('a' + k))
	}
	return strconv.Itoa(k)
}
