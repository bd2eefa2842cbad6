package liveowner

import (
	"path"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// RunsGPUFleetOperator reports whether a pod spec runs gpufleet's
// operator: a container starting the `operator` subcommand of the
// gpufleet binary, whatever the Deployment, the release or the namespace
// is called (the chart's, kustomize's and install.yaml's all do).
func RunsGPUFleetOperator(spec *corev1.PodSpec) bool {
	return slices.ContainsFunc(spec.Containers, func(c corev1.Container) bool {
		argv := append(slices.Clone(c.Command), c.Args...)
		return len(argv) >= 2 && path.Base(argv[0]) == "gpufleet" && argv[1] == "operator"
	})
}
