package gpustack

import (
	"strings"

	corev1 "k8s.io/api/core/v1"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
)

// Node labels gpufleet reads and writes.
// nvidiav1.LabelGPUPresent and the component deploy labels are the GPU
// stack's API (api/nvidia/v1/stack.go).
const (
	// LabelRuntime is the container runtime detected on the node (containerd,
	// docker, crio); the toolkit DaemonSet for that runtime selects it.
	LabelRuntime = "gpufleet.dev/container-runtime"

	labelOSID      = "feature.node.kubernetes.io/system-os_release.ID"
	labelOSVersion = "feature.node.kubernetes.io/system-os_release.VERSION_ID"
	valueTrue      = "true"
)

// OSFlavour is an OS as NFD reports it (os-release ID and VERSION_ID).
type OSFlavour struct{ ID, Version string }

// String is the driver image tag suffix, e.g. "ubuntu22.04".
func (f OSFlavour) String() string { return f.ID + f.Version }

// NodeOS returns the node's OS flavour; ok is false when NFD did not report it.
func NodeOS(labels map[string]string) (OSFlavour, bool) {
	f := OSFlavour{ID: labels[labelOSID], Version: labels[labelOSVersion]}
	return f, f.ID != "" && f.Version != ""
}

// Runtime detects the node's container runtime from the kubelet's report
// (status.nodeInfo.containerRuntimeVersion, e.g. "containerd://1.7.24");
// unknown runtimes fall back to def, then to containerd.
func Runtime(node *corev1.Node, def string) string {
	v := node.Status.NodeInfo.ContainerRuntimeVersion
	switch {
	case strings.HasPrefix(v, "containerd://"):
		return "containerd"
	case strings.HasPrefix(v, "docker://"):
		return "docker"
	case strings.HasPrefix(v, "cri-o://"):
		return "crio"
	case def != "":
		return def
	default:
		return "containerd"
	}
}

// NodeLabels returns the label changes one node needs (nil value = remove).
// It never overwrites a label an administrator set to something other than
// "true" (e.g. nvidia.com/gpu.deploy.driver=false opts the node out of the
// driver: the host provides it). Every enabled component that belongs on
// the node gets its deploy label at once: the order on the node is kept by
// the components' validation init containers (Component.After), so one
// node's broken driver holds back only that node's later components, and
// no label waits for a pass of the controller.
func NodeLabels(node *corev1.Node, spec *nvidiav1.ClusterPolicySpec) map[string]*string {
	labels := node.Labels
	changes := map[string]*string{}
	set := func(k string) {
		if _, ok := labels[k]; !ok {
			v := valueTrue
			changes[k] = &v
		}
	}
	remove := func(k string) {
		if labels[k] == valueTrue {
			changes[k] = nil
		}
	}
	if !nvidiav1.HasNvidiaGPU(labels) || node.DeletionTimestamp != nil {
		remove(nvidiav1.LabelGPUPresent)
		for _, c := range nvidiav1.Components {
			remove(c.DeployLabel)
		}
		if _, ok := labels[LabelRuntime]; ok {
			changes[LabelRuntime] = nil
		}
		return changes
	}
	set(nvidiav1.LabelGPUPresent)
	if rt := Runtime(node, spec.Operator.DefaultRuntime); labels[LabelRuntime] != rt {
		changes[LabelRuntime] = &rt
	}
	for _, c := range nvidiav1.Components {
		if c.Enabled(spec) && c.RunsOn(labels) {
			set(c.DeployLabel) // an administrator's other value is kept
		} else {
			remove(c.DeployLabel)
		}
	}
	if v := migConfigDefault(spec, labels); v != "" {
		changes[LabelMIGConfig] = &v
	}
	return changes
}

// LabelMIGConfig names the MIG configuration mig-manager applies to a node.
const LabelMIGConfig = "nvidia.com/mig.config"

// migConfigDisabled is mig-parted's configuration with MIG off on every GPU.
const migConfigDisabled = "all-disabled"

// migConfigDefault is the MIG configuration label a node gets from
// migManager.config.default ("" for none), as NVIDIA's GPU Operator labels
// nodes: only the default "all-disabled" (the chart's), only on a
// MIG-capable node where mig-manager runs, and only when the node has no
// MIG configuration yet. Any other default would repartition GPUs under
// running workloads; an administrator chooses those per node.
func migConfigDefault(spec *nvidiav1.ClusterPolicySpec, labels map[string]string) string {
	mig, _ := componentByKey(MIGManager)
	if !mig.Enabled(spec) || !mig.RunsOn(labels) || labels[LabelMIGConfig] != "" ||
		spec.MIGManager.Config == nil || spec.MIGManager.Config.Default != migConfigDisabled {
		return ""
	}
	return migConfigDisabled
}
