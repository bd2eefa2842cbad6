package gpustack

import (
	"strings"

	corev1 "k8s.io/api/core/v1"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
)

// Node labels gpufleet reads and writes.
const (
	LabelGPUPresent = "nvidia.com/gpu.present"
	// LabelRuntime is the container runtime detected on the node (containerd,
	// docker, crio); the toolkit DaemonSet for that runtime selects it.
	LabelRuntime = "gpufleet.dev/container-runtime"

	labelOSID      = "feature.node.kubernetes.io/system-os_release.ID"
	labelOSVersion = "feature.node.kubernetes.io/system-os_release.VERSION_ID"
	valueTrue      = "true"
)

// NFD labels that reveal an NVIDIA PCI device (vendor 10de).
var nvidiaPCILabels = []string{
	"feature.node.kubernetes.io/pci-10de.present",
	"feature.node.kubernetes.io/pci-0300_10de.present",
	"feature.node.kubernetes.io/pci-0302_10de.present",
}

// HasNvidiaGPU reports whether Node Feature Discovery found an NVIDIA GPU.
func HasNvidiaGPU(labels map[string]string) bool {
	for _, l := range nvidiaPCILabels {
		if labels[l] == valueTrue {
			return true
		}
	}
	return false
}

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
// driver; such a component then does not hold back later ones). A deploy
// label is added only once the node's pods of every enabled component of
// earlier stages are Ready (ready reports that per component); once added
// it stays, so a restarting pod does not tear down the rest of the stack.
func NodeLabels(node *corev1.Node, spec *nvidiav1.ClusterPolicySpec, ready func(component string) bool) map[string]*string {
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
	if !HasNvidiaGPU(labels) || node.DeletionTimestamp != nil {
		remove(LabelGPUPresent)
		for _, c := range Components {
			remove(c.DeployLabel)
		}
		if _, ok := labels[LabelRuntime]; ok {
			changes[LabelRuntime] = nil
		}
		return changes
	}
	set(LabelGPUPresent)
	if rt := Runtime(node, spec.Operator.DefaultRuntime); labels[LabelRuntime] != rt {
		changes[LabelRuntime] = &rt
	}
	open := true // every earlier stage is Ready on this node
	for stage := 0; stage <= Components[len(Components)-1].Stage; stage++ {
		stageReady := true
		for _, c := range Components {
			if c.Stage != stage {
				continue
			}
			v, has := labels[c.DeployLabel]
			switch {
			case !c.Enabled(spec) || !c.RunsOn(labels):
				remove(c.DeployLabel)
			case has && v != valueTrue:
				// Opted out by an administrator: skipped, not waited for.
			case has || open:
				set(c.DeployLabel)
				stageReady = stageReady && ready(c.Key)
			default:
				stageReady = false
			}
		}
		open = open && stageReady
	}
	return changes
}
