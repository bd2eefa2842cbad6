package gpustack

import (
	"path"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
)

// Host paths of the GPU stack (spec.hostPaths and toolkit.installDir), as
// NVIDIA's GPU Operator uses them: the hostPath volumes of the components'
// pods are named as in its manifests, and the renderer points each at the
// policy's path (pure).
const (
	defaultRootFS            = "/"
	defaultDriverInstallDir  = "/run/nvidia/driver"
	defaultKubeletRootDir    = "/var/lib/kubelet"
	defaultToolkitInstallDir = "/usr/local/nvidia"

	volumeHostRoot         = "host-root"          // the host's root, at /host
	volumeHostDevChar      = "host-dev-char"      // <rootFS>/dev/char, at /host-dev-char
	volumeDriverInstallDir = "driver-install-dir" // the driver's root
	volumeToolkitInstall   = "toolkit-install-dir"
	volumeDevicePlugins    = "device-plugin"     // the kubelet's device-plugins directory
	volumePodResources     = "pod-gpu-resources" // the kubelet's pod-resources directory
)

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// applyHostPaths points a pod's host path volumes at the policy's paths:
//   - hostPaths.rootFS: the host-root volume, and host-dev-char at
//     <rootFS>/dev/char; every container of a pod with a host-root volume
//     gets HOST_ROOT=<rootFS> when it is not "/" (gpu-operator's
//     transformForHostRoot);
//   - hostPaths.driverInstallDir: the driver-install-dir volume; the
//     containers that read the driver's root (NVIDIA_DRIVER_ROOT in the
//     asset: toolkit, device plugin) get its host path there, and a
//     driver-validation init container mounts it at the same path with
//     DRIVER_INSTALL_DIR and DRIVER_INSTALL_DIR_CTR_PATH when it is not the
//     default (gpu-operator's transformForDriverInstallDir);
//   - hostPaths.kubeletRootDir: the kubelet's pod-resources directory
//     (dcgm-exporter, as gpu-operator) and its device-plugins directory (the
//     device plugin; gpu-operator leaves that one at /var/lib/kubelet);
//   - toolkit.installDir: the toolkit-install-dir volume, where the toolkit
//     mounts and installs it (ROOT; gpu-operator's TransformToolkit).
//
// It runs before the component's own env is merged: an env variable the
// policy sets for the component wins.
func applyHostPaths(ps *corev1.PodSpec, spec *nvidiav1.ClusterPolicySpec) {
	hp := &spec.HostPaths
	rootFS := orDefault(hp.RootFS, defaultRootFS)
	installDir := orDefault(hp.DriverInstallDir, defaultDriverInstallDir)
	kubelet := orDefault(hp.KubeletRootDir, defaultKubeletRootDir)
	toolkitDir := toolkitInstallDir(spec)
	hostRoot := false
	for i := range ps.Volumes {
		v := &ps.Volumes[i]
		if v.HostPath == nil {
			continue
		}
		switch v.Name {
		case volumeHostRoot:
			v.HostPath.Path, hostRoot = rootFS, true
		case volumeHostDevChar:
			v.HostPath.Path = path.Join(rootFS, "dev/char")
		case volumeDriverInstallDir:
			v.HostPath.Path = installDir
		case volumeDevicePlugins:
			v.HostPath.Path = path.Join(kubelet, "device-plugins")
		case volumePodResources:
			v.HostPath.Path = path.Join(kubelet, "pod-resources")
		case volumeToolkitInstall:
			v.HostPath.Path = toolkitDir
		}
	}
	each := func(f func(c *corev1.Container)) {
		for i := range ps.InitContainers {
			f(&ps.InitContainers[i])
		}
		for i := range ps.Containers {
			f(&ps.Containers[i])
		}
	}
	each(func(c *corev1.Container) {
		if hostRoot && rootFS != defaultRootFS {
			c.Env = mergeEnv(c.Env, []corev1.EnvVar{{Name: "HOST_ROOT", Value: rootFS}})
		}
		if slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "NVIDIA_DRIVER_ROOT" }) {
			c.Env = mergeEnv(c.Env, []corev1.EnvVar{{Name: "NVIDIA_DRIVER_ROOT", Value: installDir}})
		}
		for j := range c.VolumeMounts {
			if c.VolumeMounts[j].Name == volumeToolkitInstall {
				c.VolumeMounts[j].MountPath = toolkitDir
				if slices.Equal(c.Args, []string{defaultToolkitInstallDir}) {
					c.Args = []string{toolkitDir} // the installer's destination
				}
			}
		}
		if c.Name == validationNames[Driver] && installDir != defaultDriverInstallDir {
			c.Env = mergeEnv(c.Env, []corev1.EnvVar{
				{Name: "DRIVER_INSTALL_DIR", Value: installDir},
				{Name: "DRIVER_INSTALL_DIR_CTR_PATH", Value: installDir},
			})
			for j := range c.VolumeMounts {
				if c.VolumeMounts[j].Name == volumeDriverInstallDir {
					c.VolumeMounts[j].MountPath = installDir
				}
			}
		}
	})
}

// toolkitInstallDir is where the toolkit installs on the host.
func toolkitInstallDir(spec *nvidiav1.ClusterPolicySpec) string {
	return orDefault(spec.Toolkit.InstallDir, defaultToolkitInstallDir)
}

// driverValidationMounts are the host paths a driver-validation init
// container reads besides /run/nvidia, as in NVIDIA's GPU Operator: the
// host's root (a driver installed on the host), the driver's root and the
// host's /dev/char (the validator creates the /dev/char symlinks of the
// NVIDIA devices there unless DISABLE_DEV_CHAR_SYMLINK_CREATION is set).
// applyHostPaths points them at the policy's paths.
func driverValidationMounts(ps *corev1.PodSpec, ctr *corev1.Container) {
	volumes := []corev1.Volume{
		{Name: volumeHostRoot, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: defaultRootFS}}},
		{Name: volumeDriverInstallDir, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
			Path: defaultDriverInstallDir, Type: ptr.To(corev1.HostPathDirectoryOrCreate)}}},
		{Name: volumeHostDevChar, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/dev/char"}}},
	}
	for _, v := range volumes {
		if !slices.ContainsFunc(ps.Volumes, func(x corev1.Volume) bool { return x.Name == v.Name }) {
			ps.Volumes = append(ps.Volumes, v)
		}
	}
	ctr.VolumeMounts = append(ctr.VolumeMounts,
		corev1.VolumeMount{Name: volumeHostRoot, MountPath: "/host", ReadOnly: true, MountPropagation: ptr.To(corev1.MountPropagationHostToContainer)},
		corev1.VolumeMount{Name: volumeDriverInstallDir, MountPath: defaultDriverInstallDir, MountPropagation: ptr.To(corev1.MountPropagationHostToContainer)},
		corev1.VolumeMount{Name: volumeHostDevChar, MountPath: "/host-dev-char"},
	)
}
