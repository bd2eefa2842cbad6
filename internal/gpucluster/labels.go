package gpucluster

import (
	corev1 "k8s.io/api/core/v1"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	nvidiav1alpha1 "github.com/gpufleet/gpufleet/api/nvidia/v1alpha1"
)

// NodeLabels returns the label changes one node needs for the GPUCluster
// (nil value = remove): on a GPU node, nvidia.com/gpu.present and the
// deploy label of each enabled workload; elsewhere none of them. A label
// an administrator set to something other than "true" is never touched
// (nvidia.com/gpu.deploy.dra-driver=false keeps the DRA driver off that
// node).
func NodeLabels(node *corev1.Node, gc *nvidiav1alpha1.GPUCluster) map[string]*string {
	labels := node.Labels
	changes := map[string]*string{}
	set := func(k string) {
		if _, ok := labels[k]; !ok {
			v := "true"
			changes[k] = &v
		}
	}
	remove := func(k string) {
		if labels[k] == "true" {
			changes[k] = nil
		}
	}
	deploy := map[string]bool{DeployDRADriver: true, DeployDCGMExporter: ExporterEnabled(gc), DeployDCGM: DCGMEnabled(gc)}
	gpu := nvidiav1.HasNvidiaGPU(labels) && node.DeletionTimestamp == nil
	if gpu {
		set(nvidiav1.LabelGPUPresent)
	} else {
		remove(nvidiav1.LabelGPUPresent)
	}
	for k, on := range deploy {
		if gpu && on {
			set(k)
		} else {
			remove(k)
		}
	}
	return changes
}
