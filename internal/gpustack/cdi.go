package gpustack

import (
	"path"
	"slices"

	corev1 "k8s.io/api/core/v1"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
)

// The Container Device Interface (spec.cdi) and the runtime class
// (spec.operator.runtimeClass) as the components' env, as NVIDIA's GPU
// Operator sets them (pure).

// defaultRuntimeClass is the NVIDIA runtime's handler name by default.
const defaultRuntimeClass = "nvidia"

// CDIEnabled reports whether CDI is how GPUs reach containers: on unless
// cdi.enabled is false (gpu-operator's default). cdi.default is deprecated
// in gpu-operator and has no effect there: with CDI enabled, CDI is the
// default mode; gpufleet reads it the same way.
func CDIEnabled(spec *nvidiav1.ClusterPolicySpec) bool {
	return spec.CDI.Enabled == nil || *spec.CDI.Enabled
}

// cdiEnv is the env CDI needs in a component's main container:
//   - container toolkit: CDI_ENABLED, the runtime in CDI mode
//     (NVIDIA_CONTAINER_RUNTIME_MODE=cdi), management containers' devices
//     from the management.nvidia.com/gpu CDI kind, cri-o configured with
//     runtime handlers (CRIO_CONFIG_MODE=config);
//   - device plugin: CDI_ENABLED, devices handed to the runtime as CDI
//     names (DEVICE_LIST_STRATEGY=cdi-annotations,cdi-cri,
//     CDI_ANNOTATION_PREFIX) and the toolkit's nvidia-cdi-hook for the
//     specs it writes;
//   - mig-manager: CDI_ENABLED and the nvidia-cdi-hook.
//
// One difference from gpu-operator: it also sets
// NVIDIA_RUNTIME_SET_AS_DEFAULT=false in the toolkit and gives its own
// pods the "nvidia" RuntimeClass, which it creates. gpufleet creates no
// RuntimeClass, so it leaves the toolkit's default (the NVIDIA runtime,
// in CDI mode, stays the node's default runtime): that is how the stack's
// own pods reach the GPUs. Workloads get theirs through CDI either way.
func cdiEnv(spec *nvidiav1.ClusterPolicySpec, key string) []corev1.EnvVar {
	if !CDIEnabled(spec) {
		return nil
	}
	hook := []corev1.EnvVar{}
	if tk, _ := componentByKey(ContainerToolkit); tk.Enabled(spec) {
		hook = append(hook, corev1.EnvVar{Name: "NVIDIA_CDI_HOOK_PATH", Value: path.Join(toolkitInstallDir(spec), "toolkit/nvidia-cdi-hook")})
	}
	switch key {
	case ContainerToolkit:
		return []corev1.EnvVar{
			{Name: "CDI_ENABLED", Value: valueTrue},
			{Name: "NVIDIA_CONTAINER_RUNTIME_MODE", Value: "cdi"},
			{Name: "NVIDIA_CONTAINER_RUNTIME_MODES_CDI_DEFAULT_KIND", Value: "management.nvidia.com/gpu"},
			{Name: "CRIO_CONFIG_MODE", Value: "config"},
		}
	case DevicePlugin:
		return append([]corev1.EnvVar{
			{Name: "CDI_ENABLED", Value: valueTrue},
			{Name: "DEVICE_LIST_STRATEGY", Value: "cdi-annotations,cdi-cri"},
			{Name: "CDI_ANNOTATION_PREFIX", Value: "cdi.k8s.io/"},
		}, hook...)
	case MIGManager:
		return append([]corev1.EnvVar{{Name: "CDI_ENABLED", Value: valueTrue}}, hook...)
	}
	return nil
}

// toolkitRuntimeEnv is the env of the toolkit for one container runtime:
// for containerd, the runtime class (handler) it configures
// (operator.runtimeClass, default "nvidia"); for cri-o without CDI, the
// OCI prestart hook instead of runtime handlers (gpu-operator's choice:
// handlers would make the NVIDIA runtime cri-o's default).
func toolkitRuntimeEnv(spec *nvidiav1.ClusterPolicySpec, runtime string) []corev1.EnvVar {
	switch {
	case runtime == "containerd":
		return []corev1.EnvVar{{Name: "CONTAINERD_RUNTIME_CLASS", Value: orDefault(spec.Operator.RuntimeClass, defaultRuntimeClass)}}
	case runtime == "crio" && !CDIEnabled(spec):
		return []corev1.EnvVar{{Name: "CRIO_CONFIG_MODE", Value: "hook"}}
	}
	return nil
}

// mergeEnvUnder merges defaults into env except the names the policy sets
// for the component (user), which keep the policy's value.
func mergeEnvUnder(env, defaults, user []corev1.EnvVar) []corev1.EnvVar {
	var keep []corev1.EnvVar
	for _, d := range defaults {
		if !slices.ContainsFunc(user, func(u corev1.EnvVar) bool { return u.Name == d.Name }) {
			keep = append(keep, d)
		}
	}
	return mergeEnv(env, keep)
}
