package gpustack

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
)

// hostPathsOf is each DaemonSet's hostPath volumes of interest (name →
// path) and the env of interest of each of its containers.
func hostPathsOf(t *testing.T, p *nvidiav1.ClusterPolicy) (volumes map[string]map[string]string, env map[string]map[string]string) {
	t.Helper()
	interesting := map[string]bool{volumeHostRoot: true, volumeHostDevChar: true, volumeDriverInstallDir: true,
		volumeDevicePlugins: true, volumePodResources: true, volumeToolkitInstall: true}
	volumes, env = map[string]map[string]string{}, map[string]map[string]string{}
	for name, ds := range renderedDaemonSets(t, p, oneNodeKind) {
		ps := ds.Spec.Template.Spec
		volumes[name] = map[string]string{}
		for _, v := range ps.Volumes {
			if interesting[v.Name] {
				volumes[name][v.Name] = v.HostPath.Path
			}
		}
		for _, c := range append(append([]corev1.Container{}, ps.InitContainers...), ps.Containers...) {
			e := map[string]string{}
			for _, x := range c.Env {
				switch x.Name {
				case "HOST_ROOT", "NVIDIA_DRIVER_ROOT", "DRIVER_INSTALL_DIR", "DRIVER_INSTALL_DIR_CTR_PATH", "ROOT":
					e[x.Name] = x.Value
				}
			}
			for _, m := range c.VolumeMounts {
				if m.Name == volumeDriverInstallDir || m.Name == volumeToolkitInstall {
					e["mount:"+m.Name] = m.MountPath
				}
			}
			if len(e) > 0 {
				env[name+"/"+c.Name] = e
			}
		}
	}
	return volumes, env
}

func TestHostPaths(t *testing.T) {
	p := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "u"}}
	p.Spec.DCGMExporter.Enabled = ptr.To(true)
	gotVolumes, gotEnv := hostPathsOf(t, p)

	t.Run("defaults: gpu-operator's paths, no HOST_ROOT", func(t *testing.T) {
		want := map[string]map[string]string{
			"nvidia-driver-daemonset-ubuntu22.04": {volumeHostRoot: "/"},
			"nvidia-container-toolkit-daemonset-containerd": {volumeHostRoot: "/", volumeHostDevChar: "/dev/char",
				volumeDriverInstallDir: "/run/nvidia/driver", volumeToolkitInstall: "/usr/local/nvidia"},
			"nvidia-device-plugin-daemonset": {volumeHostRoot: "/", volumeHostDevChar: "/dev/char",
				volumeDriverInstallDir: "/run/nvidia/driver", volumeDevicePlugins: "/var/lib/kubelet/device-plugins"},
			"nvidia-operator-validator": {volumeHostRoot: "/", volumeHostDevChar: "/dev/char", volumeDriverInstallDir: "/run/nvidia/driver"},
			"nvidia-dcgm-exporter": {volumeHostRoot: "/", volumeHostDevChar: "/dev/char",
				volumeDriverInstallDir: "/run/nvidia/driver", volumePodResources: "/var/lib/kubelet/pod-resources"},
			"gpu-feature-discovery": {volumeHostRoot: "/", volumeHostDevChar: "/dev/char", volumeDriverInstallDir: "/run/nvidia/driver"},
		}
		if diff := cmp.Diff(want, gotVolumes); diff != "" {
			t.Errorf("host paths (-want +got):\n%s", diff)
		}
		for c, e := range gotEnv {
			if _, ok := e["HOST_ROOT"]; ok {
				t.Errorf("%s: HOST_ROOT set for the default root: %v", c, e)
			}
			if _, ok := e["DRIVER_INSTALL_DIR"]; ok {
				t.Errorf("%s: DRIVER_INSTALL_DIR set for the default install dir: %v", c, e)
			}
		}
	})

	p.Spec.HostPaths = nvidiav1.HostPathsSpec{RootFS: "/host-fs", DriverInstallDir: "/home/kubernetes/bin/nvidia", KubeletRootDir: "/var/lib/k0s/kubelet"}
	p.Spec.Toolkit.InstallDir = "/opt/nvidia/toolkit"
	gotVolumes, gotEnv = hostPathsOf(t, p)
	t.Run("the policy's paths", func(t *testing.T) {
		custom := map[string]string{volumeHostRoot: "/host-fs", volumeHostDevChar: "/host-fs/dev/char", volumeDriverInstallDir: "/home/kubernetes/bin/nvidia"}
		with := func(k, v string) map[string]string {
			out := map[string]string{k: v}
			for a, b := range custom {
				out[a] = b
			}
			return out
		}
		want := map[string]map[string]string{
			"nvidia-driver-daemonset-ubuntu22.04":           {volumeHostRoot: "/host-fs"},
			"nvidia-container-toolkit-daemonset-containerd": with(volumeToolkitInstall, "/opt/nvidia/toolkit"),
			"nvidia-device-plugin-daemonset":                with(volumeDevicePlugins, "/var/lib/k0s/kubelet/device-plugins"),
			"nvidia-operator-validator":                     custom,
			"nvidia-dcgm-exporter":                          with(volumePodResources, "/var/lib/k0s/kubelet/pod-resources"),
			"gpu-feature-discovery":                         custom,
		}
		if diff := cmp.Diff(want, gotVolumes); diff != "" {
			t.Errorf("host paths (-want +got):\n%s", diff)
		}
	})
	t.Run("containers: HOST_ROOT, the driver's root, the validation's install dir, the toolkit's", func(t *testing.T) {
		dir := "/home/kubernetes/bin/nvidia"
		validation := map[string]string{"HOST_ROOT": "/host-fs", "DRIVER_INSTALL_DIR": dir, "DRIVER_INSTALL_DIR_CTR_PATH": dir, "mount:" + volumeDriverInstallDir: dir}
		checks := map[string]map[string]string{
			"nvidia-driver-daemonset-ubuntu22.04/nvidia-driver-ctr":  {"HOST_ROOT": "/host-fs"},
			"nvidia-driver-daemonset-ubuntu22.04/k8s-driver-manager": {"HOST_ROOT": "/host-fs"},
			"nvidia-container-toolkit-daemonset-containerd/nvidia-container-toolkit-ctr": {"HOST_ROOT": "/host-fs", "NVIDIA_DRIVER_ROOT": dir,
				"ROOT": "/opt/nvidia/toolkit", "mount:" + volumeDriverInstallDir: "/driver-root", "mount:" + volumeToolkitInstall: "/opt/nvidia/toolkit"},
			"nvidia-container-toolkit-daemonset-containerd/driver-validation": validation,
			"nvidia-device-plugin-daemonset/nvidia-device-plugin": {"HOST_ROOT": "/host-fs", "NVIDIA_DRIVER_ROOT": dir,
				"mount:" + volumeDriverInstallDir: "/driver-root"},
			"nvidia-operator-validator/driver-validation": validation,
		}
		for c, want := range checks {
			if diff := cmp.Diff(want, gotEnv[c]); diff != "" {
				t.Errorf("%s (-want +got):\n%s", c, diff)
			}
		}
	})
	t.Run("the toolkit installs where it mounts", func(t *testing.T) {
		ctr := renderedDaemonSets(t, p, oneNodeKind)["nvidia-container-toolkit-daemonset-containerd"].Spec.Template.Spec.Containers[0]
		if diff := cmp.Diff([]string{"/opt/nvidia/toolkit"}, ctr.Args); diff != "" {
			t.Errorf("toolkit args (-want +got):\n%s", diff)
		}
	})
}

func TestCDIEnv(t *testing.T) {
	facts := Facts{Namespace: "ns", OSFlavours: []OSFlavour{{"ubuntu", "22.04"}}, Runtimes: []string{"containerd", "crio"}}
	names := []string{"CDI_ENABLED", "NVIDIA_CONTAINER_RUNTIME_MODE", "NVIDIA_CONTAINER_RUNTIME_MODES_CDI_DEFAULT_KIND", "CRIO_CONFIG_MODE",
		"DEVICE_LIST_STRATEGY", "CDI_ANNOTATION_PREFIX", "NVIDIA_CDI_HOOK_PATH", "CONTAINERD_RUNTIME_CLASS", "NVIDIA_RUNTIME_SET_AS_DEFAULT"}
	of := func(ctr corev1.Container) map[string]string {
		out := map[string]string{}
		for _, e := range ctr.Env {
			for _, n := range names {
				if e.Name == n {
					out[n] = e.Value
				}
			}
		}
		return out
	}
	toolkitCDI := map[string]string{"CDI_ENABLED": "true", "NVIDIA_CONTAINER_RUNTIME_MODE": "cdi",
		"NVIDIA_CONTAINER_RUNTIME_MODES_CDI_DEFAULT_KIND": "management.nvidia.com/gpu", "CRIO_CONFIG_MODE": "config"}
	with := func(m map[string]string, kv ...string) map[string]string {
		out := map[string]string{}
		for k, v := range m {
			out[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	pluginCDI := map[string]string{"CDI_ENABLED": "true", "DEVICE_LIST_STRATEGY": "cdi-annotations,cdi-cri", "CDI_ANNOTATION_PREFIX": "cdi.k8s.io/",
		"NVIDIA_CDI_HOOK_PATH": "/usr/local/nvidia/toolkit/nvidia-cdi-hook"}
	tests := map[string]struct {
		spec       func(*nvidiav1.ClusterPolicySpec)
		containerd map[string]string
		crio       map[string]string
		plugin     map[string]string
		migManager map[string]string
	}{
		"cdi unset: on, as gpu-operator's default": {spec: func(*nvidiav1.ClusterPolicySpec) {},
			containerd: with(toolkitCDI, "CONTAINERD_RUNTIME_CLASS", "nvidia"), crio: toolkitCDI, plugin: pluginCDI},
		"cdi.enabled, cdi.default (deprecated, no effect), another runtime class and toolkit dir": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.CDI.Enabled, s.CDI.Default = ptr.To(true), ptr.To(true)
				s.Operator.RuntimeClass, s.Toolkit.InstallDir = "nvidia-cdi", "/opt/nvidia"
				s.MIGManager.Enabled = ptr.To(true)
			},
			containerd: with(toolkitCDI, "CONTAINERD_RUNTIME_CLASS", "nvidia-cdi"), crio: toolkitCDI,
			plugin:     with(pluginCDI, "NVIDIA_CDI_HOOK_PATH", "/opt/nvidia/toolkit/nvidia-cdi-hook"),
			migManager: map[string]string{"CDI_ENABLED": "true", "NVIDIA_CDI_HOOK_PATH": "/opt/nvidia/toolkit/nvidia-cdi-hook"},
		},
		"cdi off: legacy mode; cri-o through the OCI hook": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.CDI.Enabled = ptr.To(false)
				s.MIGManager.Enabled = ptr.To(true)
			},
			containerd: map[string]string{"CONTAINERD_RUNTIME_CLASS": "nvidia"}, crio: map[string]string{"CRIO_CONFIG_MODE": "hook"},
			plugin: map[string]string{}, migManager: map[string]string{},
		},
		"the policy's env wins": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.DevicePlugin.Env = []corev1.EnvVar{{Name: "DEVICE_LIST_STRATEGY", Value: "envvar"}}
				s.Toolkit.Env = []corev1.EnvVar{{Name: "CONTAINERD_RUNTIME_CLASS", Value: "mine"}, {Name: "CRIO_CONFIG_MODE", Value: "hook"},
					{Name: "NVIDIA_RUNTIME_SET_AS_DEFAULT", Value: "false"}}
			},
			containerd: with(toolkitCDI, "CONTAINERD_RUNTIME_CLASS", "mine", "CRIO_CONFIG_MODE", "hook", "NVIDIA_RUNTIME_SET_AS_DEFAULT", "false"),
			crio:       with(toolkitCDI, "CONTAINERD_RUNTIME_CLASS", "mine", "CRIO_CONFIG_MODE", "hook", "NVIDIA_RUNTIME_SET_AS_DEFAULT", "false"),
			plugin:     with(pluginCDI, "DEVICE_LIST_STRATEGY", "envvar"),
		},
		"toolkit disabled: no hook path of it": {
			spec:       func(s *nvidiav1.ClusterPolicySpec) { s.Toolkit.Enabled = ptr.To(false) },
			containerd: nil, crio: nil,
			plugin: map[string]string{"CDI_ENABLED": "true", "DEVICE_LIST_STRATEGY": "cdi-annotations,cdi-cri", "CDI_ANNOTATION_PREFIX": "cdi.k8s.io/"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "u"}}
			tc.spec(&p.Spec)
			dss := renderedDaemonSets(t, p, facts)
			got := map[string]map[string]string{}
			for name, ds := range map[string]string{"containerd": "nvidia-container-toolkit-daemonset-containerd",
				"crio": "nvidia-container-toolkit-daemonset-crio", "plugin": "nvidia-device-plugin-daemonset", "mig": "nvidia-mig-manager"} {
				if d := dss[ds]; d != nil {
					got[name] = of(d.Spec.Template.Spec.Containers[0])
				}
			}
			want := map[string]map[string]string{}
			for name, m := range map[string]map[string]string{"containerd": tc.containerd, "crio": tc.crio, "plugin": tc.plugin, "mig": tc.migManager} {
				if m != nil {
					want[name] = m
				}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("CDI env (-want +got):\n%s", diff)
			}
		})
	}
}

// validator.driver/toolkit/plugin env reach the validations of that name
// in every pod, validator.cuda's the validator's container (validator.env
// wins there); every validation takes the validator's resources, and its
// pod the validator's pull secrets.
func TestValidatorSettings(t *testing.T) {
	p := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "u"}}
	v := &p.Spec.Validator
	v.Driver = &nvidiav1.EnvSpec{Env: []nvidiav1.EnvVar{{Name: "DISABLE_DEV_CHAR_SYMLINK_CREATION", Value: "true"}}}
	v.Toolkit = &nvidiav1.EnvSpec{Env: []nvidiav1.EnvVar{{Name: "T", Value: "toolkit"}}}
	v.Plugin = &nvidiav1.EnvSpec{Env: []nvidiav1.EnvVar{{Name: "WITH_WORKLOAD", Value: "false"}}}
	v.CUDA = &nvidiav1.EnvSpec{Env: []nvidiav1.EnvVar{{Name: "WITH_WORKLOAD", Value: "false"}, {Name: "C", Value: "cuda"}}}
	v.Env = []corev1.EnvVar{{Name: "C", Value: "validator"}}
	v.ImagePullSecrets = []string{"validator-secret"}
	v.Resources = &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}}
	p.Spec.DevicePlugin.ImagePullSecrets = []string{"validator-secret"}
	want := map[string]map[string]string{
		"driver-validation":  {"DISABLE_DEV_CHAR_SYMLINK_CREATION": "true"},
		"toolkit-validation": {"T": "toolkit"},
		"plugin-validation":  {"WITH_WORKLOAD": "false"},
	}
	for name, ds := range renderedDaemonSets(t, p, oneNodeKind) {
		ps := ds.Spec.Template.Spec
		validations := 0
		for _, c := range ps.InitContainers {
			if !isValidation(c.Name) {
				continue
			}
			validations++
			env := envMap(c.Env)
			for k, v := range want[c.Name] {
				if env[k] != v {
					t.Errorf("%s/%s: %s=%q, want %q", name, c.Name, k, env[k], v)
				}
			}
			for other, e := range want {
				for k := range e {
					if _, ok := env[k]; ok && other != c.Name && want[c.Name][k] == "" {
						t.Errorf("%s/%s: has %s of %s", name, c.Name, k, other)
					}
				}
			}
			if c.Resources.Limits.Memory().String() != "64Mi" {
				t.Errorf("%s/%s: resources %+v, want the validator's", name, c.Name, c.Resources)
			}
		}
		if validations > 0 {
			n := 0
			for _, s := range ps.ImagePullSecrets {
				if s.Name == "validator-secret" {
					n++
				}
			}
			if n != 1 {
				t.Errorf("%s: pull secrets %v, want validator-secret once", name, ps.ImagePullSecrets)
			}
		}
		if name == "nvidia-operator-validator" {
			env := envMap(ps.Containers[0].Env)
			if env["WITH_WORKLOAD"] != "false" || env["C"] != "validator" {
				t.Errorf("validator container env %v: want validator.cuda's, validator.env over it", env)
			}
		}
	}
}

func TestHostNetwork(t *testing.T) {
	p := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "u"}}
	p.Spec.GFD.HostNetwork = ptr.To(true)
	p.Spec.DevicePlugin.HostNetwork = ptr.To(false)
	for name, ds := range renderedDaemonSets(t, p, oneNodeKind) {
		ps := ds.Spec.Template.Spec
		want := name == "gpu-feature-discovery"
		if ps.HostNetwork != want || (ps.DNSPolicy == corev1.DNSClusterFirstWithHostNet) != want {
			t.Errorf("%s: hostNetwork %v dnsPolicy %q, want hostNetwork %v", name, ps.HostNetwork, ps.DNSPolicy, want)
		}
	}
}
