package gpustack

import (
	"fmt"
	"slices"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
)

// The driver pod: its k8s-driver-manager init container (driver.manager)
// and the driver container's settings beyond a component's common ones
// (probes, kernel module type and parameters, secret env), for the
// ClusterPolicy's driver and every NVIDIADriver's alike (pure).

// DriverManagerContainer is the driver pod's init container that prepares
// the node for a driver (re)install, as NVIDIA's GPU Operator names it.
const DriverManagerContainer = "k8s-driver-manager"

// The k8s-driver-manager switches gpufleet keeps off. The manager's own
// defaults are on (unset means true), so the renderer always writes them.
const (
	EnvGPUPodEviction = "ENABLE_GPU_POD_EVICTION"
	EnvAutoDrain      = "ENABLE_AUTO_DRAIN"
)

// managerForcedOff are the manager's env variables gpufleet always sets to
// "false", whatever driver.manager.env says: with either on, the manager
// would evict the GPU pods or drain the node on its own when a driver pod
// restarts, outside NodeMaintenance and so outside the cluster's
// maintenance limits (maxParallelOperations, maxUnavailable, windows).
// gpufleet's driver upgrades drain the node through a NodeMaintenance
// before they restart the driver (upgrade.go), as NVIDIA's GPU Operator's
// upgrade controller does when it manages upgrades (there, the node
// annotation nvidia.com/gpu-driver-upgrade-enabled=true makes the manager
// treat both as off). A driver restarted while GPU pods still hold the old
// kernel module then fails with "driver is in use", which the upgrade
// detects and resolves through a reboot inside its NodeMaintenance.
var managerForcedOff = []string{EnvGPUPodEviction, EnvAutoDrain}

// ManagerEnvOverrides lists the entries of a driver manager's env that try
// to turn on what gpufleet keeps off (managerForcedOff): set to anything
// but a false value (strconv.ParseBool; the manager's own parsing). They
// are rendered as "false" and reported in the UnsupportedFields condition.
func ManagerEnvOverrides(m *nvidiav1.DriverManagerSpec) []string {
	if m == nil {
		return nil
	}
	var out []string
	for _, e := range m.Env {
		if !slices.Contains(managerForcedOff, e.Name) || slices.Contains(out, e.Name) {
			continue
		}
		if on, err := strconv.ParseBool(e.Value); err != nil || on {
			out = append(out, e.Name)
		}
	}
	slices.Sort(out)
	return out
}

// managerEnv is the manager's env: the asset's defaults, driver.manager.env
// over them (by name), then managerForcedOff set to "false".
func managerEnv(base []corev1.EnvVar, m *nvidiav1.DriverManagerSpec) []corev1.EnvVar {
	var user []corev1.EnvVar
	if m != nil {
		for _, e := range m.Env {
			user = append(user, corev1.EnvVar{Name: e.Name, Value: e.Value})
		}
	}
	env := mergeEnv(base, user)
	for _, name := range managerForcedOff {
		env = mergeEnv(env, []corev1.EnvVar{{Name: name, Value: "false"}})
	}
	return env
}

// managerImage is driver.manager's image, with NVIDIA's GPU Operator's
// defaults (the k8s-driver-manager of its v24.9 release, as the other
// default images) for what the policy leaves empty.
func managerImage(m *nvidiav1.DriverManagerSpec) (string, error) {
	spec := &nvidiav1.ComponentSpec{}
	if m != nil {
		spec.Repository, spec.Image, spec.Version = m.Repository, m.Image, m.Version
	}
	return imageRef(DriverManagerContainer, spec)
}

// driverPod applies the driver section d to a driver DaemonSet (after
// customise): the k8s-driver-manager init container, the driver
// container's probes, kernel module type and parameters, and secret env.
func driverPod(ds *appsv1.DaemonSet, d *nvidiav1.DriverSpec) error {
	ps := &ds.Spec.Template.Spec
	ctr := &ps.Containers[0]
	if i := slices.IndexFunc(ps.InitContainers, func(c corev1.Container) bool { return c.Name == DriverManagerContainer }); i >= 0 {
		mgr := &ps.InitContainers[i]
		image, err := managerImage(d.Manager)
		if err != nil {
			return fmt.Errorf("driver.manager: %w", err)
		}
		mgr.Image = image
		mgr.ImagePullPolicy = corev1.PullIfNotPresent
		if d.Manager != nil && d.Manager.ImagePullPolicy != "" {
			mgr.ImagePullPolicy = d.Manager.ImagePullPolicy
		}
		mgr.Env = managerEnv(mgr.Env, d.Manager)
		if d.Resources != nil { // as NVIDIA's GPU Operator: the driver's resources
			mgr.Resources = *d.Resources.DeepCopy()
		}
		if d.Manager != nil {
			addPullSecrets(ps, d.Manager.ImagePullSecrets)
		}
	}
	driverProbes(ctr, d)
	ctr.Env = mergeEnv(ctr.Env, kernelModuleTypeEnv(d))
	kernelModuleConfig(ps, ctr, d.KernelModuleConfig)
	if d.SecretEnv != "" {
		ctr.EnvFrom = append(ctr.EnvFrom, corev1.EnvFromSource{SecretRef: &corev1.SecretEnvSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: d.SecretEnv}}})
	}
	return nil
}

// kernelModuleTypeEnv tells the driver container which kernel modules to
// build (KERNEL_MODULE_TYPE: auto, open or proprietary), and sets
// OPEN_KERNEL_MODULES_ENABLED for open modules as NVIDIA's GPU Operator
// does for older driver images. The deprecated useOpenKernelModules: true
// counts as kernelModuleType open when kernelModuleType is not set.
func kernelModuleTypeEnv(d *nvidiav1.DriverSpec) []corev1.EnvVar {
	t := d.KernelModuleType
	if t == "" && isTrue(d.UseOpenKernelModules) {
		t = "open"
	}
	if t == "" {
		return nil
	}
	env := []corev1.EnvVar{{Name: "KERNEL_MODULE_TYPE", Value: t}}
	if t == "open" {
		env = append(env, corev1.EnvVar{Name: "OPEN_KERNEL_MODULES_ENABLED", Value: "true"})
	}
	return env
}

// kernelModuleFiles are the files of kernel module parameters the driver
// container reads from /drivers (the NVIDIA driver container's
// _get_module_params), one per module.
var kernelModuleFiles = []string{"nvidia.conf", "nvidia-modeset.conf", "nvidia-peermem.conf", "nvidia-uvm.conf"}

// kernelModuleConfig mounts driver.kernelModuleConfig's ConfigMap where
// the driver container reads kernel module parameters: each file at
// /drivers/<file> by subPath, as NVIDIA's GPU Operator mounts them
// (/drivers also holds the driver's installer, so the ConfigMap cannot
// be mounted over the directory). gpu-operator reads the ConfigMap to
// mount exactly its keys; the renderer has no client, so it mounts the
// files the driver reads: a key the ConfigMap lacks is an empty directory
// there, which the driver skips (it reads regular files only). The
// ConfigMap is not optional: a missing one keeps the driver pod from
// starting, with the kubelet's FailedMount event naming it.
func kernelModuleConfig(ps *corev1.PodSpec, ctr *corev1.Container, ref *nvidiav1.NameRef) {
	if ref == nil || ref.Name == "" {
		return
	}
	const volume = "kernel-module-config"
	ps.Volumes = append(ps.Volumes, corev1.Volume{Name: volume, VolumeSource: corev1.VolumeSource{
		ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: ref.Name}}}})
	for _, f := range kernelModuleFiles {
		ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: volume, MountPath: "/drivers/" + f, SubPath: f, ReadOnly: true})
	}
}

// driverProbes applies driver.startupProbe's and driver.readinessProbe's
// settings to the driver container (a setting left 0 keeps the probe's).
// The startup probe is the asset's (its check and defaults, as NVIDIA's
// GPU Operator's). The asset has no readiness probe, as gpu-operator's has
// none: driver.readinessProbe adds one that runs nvidia-smi (the driver
// answers), with the defaults of readinessDefaults. A failing readiness
// probe only marks the driver pod not Ready (the policy reports the node
// Degraded); it never restarts the driver. driver.livenessProbe is not
// rendered: a failing liveness probe restarts the driver container, which
// unloads or fails to load the kernel module under running workloads,
// outside any NodeMaintenance (UnsupportedFields reports it).
func driverProbes(ctr *corev1.Container, d *nvidiav1.DriverSpec) {
	if ctr.StartupProbe != nil && d.StartupProbe != nil {
		tuneProbe(ctr.StartupProbe, d.StartupProbe)
	}
	if d.ReadinessProbe != nil {
		if ctr.ReadinessProbe == nil {
			ctr.ReadinessProbe = readinessDefaults()
		}
		tuneProbe(ctr.ReadinessProbe, d.ReadinessProbe)
	}
}

// readinessDefaults is the driver's readiness probe before
// driver.readinessProbe's settings: every field spelled out (drift
// detection compares against what the API server stores), a timeout long
// enough for nvidia-smi on a node with many GPUs (as the startup probe's).
func readinessDefaults() *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", "nvidia-smi"}}},
		PeriodSeconds: 10, TimeoutSeconds: 60, SuccessThreshold: 1, FailureThreshold: 3,
	}
}

// tuneProbe sets the probe's numbers that spec sets (non-zero).
func tuneProbe(probe *corev1.Probe, spec *nvidiav1.ContainerProbeSpec) {
	set := func(dst *int32, v int32) {
		if v != 0 {
			*dst = v
		}
	}
	set(&probe.InitialDelaySeconds, spec.InitialDelaySeconds)
	set(&probe.TimeoutSeconds, spec.TimeoutSeconds)
	set(&probe.PeriodSeconds, spec.PeriodSeconds)
	set(&probe.SuccessThreshold, spec.SuccessThreshold)
	set(&probe.FailureThreshold, spec.FailureThreshold)
}

// addPullSecrets adds image pull secrets to the pod, each once.
func addPullSecrets(ps *corev1.PodSpec, secrets []string) {
	for _, s := range secrets {
		ref := corev1.LocalObjectReference{Name: s}
		if s != "" && !slices.Contains(ps.ImagePullSecrets, ref) {
			ps.ImagePullSecrets = append(ps.ImagePullSecrets, ref)
		}
	}
}
