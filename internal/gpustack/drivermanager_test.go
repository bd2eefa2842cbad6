package gpustack

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	nvidiav1alpha1 "github.com/gpufleet/gpufleet/api/nvidia/v1alpha1"
)

// envMap is a container's env by name (value, or "<from>" for valueFrom).
func envMap(env []corev1.EnvVar) map[string]string {
	out := map[string]string{}
	for _, e := range env {
		out[e.Name] = e.Value
		if e.ValueFrom != nil {
			out[e.Name] = "<from>"
		}
	}
	return out
}

func TestManagerEnv(t *testing.T) {
	base := []corev1.EnvVar{
		{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
		{Name: EnvGPUPodEviction, Value: "false"},
		{Name: EnvAutoDrain, Value: "false"},
		{Name: "DRAIN_USE_FORCE", Value: "false"},
	}
	defaults := map[string]string{"NODE_NAME": "<from>", EnvGPUPodEviction: "false", EnvAutoDrain: "false", "DRAIN_USE_FORCE": "false"}
	with := func(kv ...string) map[string]string {
		out := map[string]string{}
		for k, v := range defaults {
			out[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	env := func(kv ...string) *nvidiav1.DriverManagerSpec {
		m := &nvidiav1.DriverManagerSpec{}
		for i := 0; i < len(kv); i += 2 {
			m.Env = append(m.Env, nvidiav1.EnvVar{Name: kv[i], Value: kv[i+1]})
		}
		return m
	}
	tests := map[string]struct {
		manager       *nvidiav1.DriverManagerSpec
		wantEnv       map[string]string
		wantOverrides []string
	}{
		"no manager section (1.x policy)": {wantEnv: defaults},
		"no env (chart default)":          {manager: env(), wantEnv: defaults},
		"the 24.9 chart's env: eviction on, drain off": {
			manager: env(EnvGPUPodEviction, "true", EnvAutoDrain, "false", "DRAIN_USE_FORCE", "false", "DRAIN_TIMEOUT_SECONDS", "0s"),
			wantEnv: with("DRAIN_TIMEOUT_SECONDS", "0s"), wantOverrides: []string{EnvGPUPodEviction},
		},
		"both on, in the spellings the manager parses as true": {
			manager: env(EnvAutoDrain, "1", EnvGPUPodEviction, "True"),
			wantEnv: defaults, wantOverrides: []string{EnvAutoDrain, EnvGPUPodEviction},
		},
		"a value the manager cannot parse is overridden and reported": {
			manager: env(EnvAutoDrain, "yes"),
			wantEnv: defaults, wantOverrides: []string{EnvAutoDrain},
		},
		"an empty value (the manager's default: on) is overridden and reported": {
			manager: env(EnvGPUPodEviction, ""),
			wantEnv: defaults, wantOverrides: []string{EnvGPUPodEviction},
		},
		"false in any spelling is no override": {
			manager: env(EnvGPUPodEviction, "0", EnvAutoDrain, "FALSE"),
			wantEnv: defaults,
		},
		"other settings are the policy's": {
			manager: env("DRAIN_USE_FORCE", "true", "NODE_LABEL_FOR_GPU_POD_EVICTION", "example.com/gpu-client", "NODE_NAME", "fixed"),
			wantEnv: with("DRAIN_USE_FORCE", "true", "NODE_LABEL_FOR_GPU_POD_EVICTION", "example.com/gpu-client", "NODE_NAME", "fixed"),
		},
		"a name given twice is reported once": {
			manager: env(EnvAutoDrain, "true", EnvAutoDrain, "true"),
			wantEnv: defaults, wantOverrides: []string{EnvAutoDrain},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := managerEnv(slices.Clone(base), tc.manager)
			if diff := cmp.Diff(tc.wantEnv, envMap(got)); diff != "" {
				t.Errorf("env (-want +got):\n%s", diff)
			}
			if len(got) != len(tc.wantEnv) {
				t.Errorf("env has %d entries for %d names (a name twice): %v", len(got), len(tc.wantEnv), got)
			}
			if diff := cmp.Diff(tc.wantOverrides, ManagerEnvOverrides(tc.manager)); diff != "" {
				t.Errorf("overrides (-want +got):\n%s", diff)
			}
		})
	}
}

// renderedDaemonSets renders p and returns its DaemonSets by name.
func renderedDaemonSets(t *testing.T, p *nvidiav1.ClusterPolicy, facts Facts) map[string]*appsv1.DaemonSet {
	t.Helper()
	objs, err := Render(p, facts, Assets)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*appsv1.DaemonSet{}
	for _, o := range objs {
		if ds, ok := o.(*appsv1.DaemonSet); ok {
			out[ds.Name] = ds
		}
	}
	return out
}

func container(cs []corev1.Container, name string) *corev1.Container {
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	return nil
}

var oneNodeKind = Facts{Namespace: "ns", OSFlavours: []OSFlavour{{"ubuntu", "22.04"}}, Runtimes: []string{"containerd"}}

// The ClusterPolicy's driver and each NVIDIADriver's get the manager as
// their first init container, with its image, pull policy and secrets,
// eviction and drain off, and the log's tail as the termination message
// of the manager and the driver container.
func TestDriverManagerRendered(t *testing.T) {
	manager := nvidiav1.DriverManagerSpec{
		ImageSpec: nvidiav1.ImageSpec{Repository: "registry.example.com/nvidia/cloud-native", Image: "k8s-driver-manager", Version: "v0.12.0",
			ImagePullPolicy: corev1.PullAlways, ImagePullSecrets: []string{"mgr-secret"}},
		Env: []nvidiav1.EnvVar{{Name: EnvGPUPodEviction, Value: "true"}, {Name: "DRAIN_USE_FORCE", Value: "true"}},
	}
	policy := func() *nvidiav1.ClusterPolicy {
		p := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "u"}}
		p.Spec.Driver.ImagePullSecrets = []string{"mgr-secret", "drv-secret"}
		return p
	}
	withManager := policy()
	withManager.Spec.Driver.Manager = manager.DeepCopy()
	viaCRD := policy()
	viaCRD.Spec.Driver.UseNvidiaDriverCRD = ptr.To(true)
	d := nvDriver("pool", true, nil)
	d.Spec.Manager = *manager.DeepCopy()
	d.Spec.ImagePullSecrets = []string{"mgr-secret", "drv-secret"}
	crdFacts := oneNodeKind
	crdFacts.Drivers = []nvidiav1alpha1.NVIDIADriver{d}
	custom := "registry.example.com/nvidia/cloud-native/k8s-driver-manager:v0.12.0"
	tests := map[string]struct {
		policy     *nvidiav1.ClusterPolicy
		facts      Facts
		ds         string
		wantImage  string
		wantPull   corev1.PullPolicy
		wantForce  string
		wantSecret []string
	}{
		"no manager section: NVIDIA's default manager": {policy: policy(), facts: oneNodeKind, ds: "nvidia-driver-daemonset-ubuntu22.04",
			wantImage: "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.7.0", wantPull: corev1.PullIfNotPresent, wantForce: "false",
			wantSecret: []string{"mgr-secret", "drv-secret"}},
		"driver.manager": {policy: withManager, facts: oneNodeKind, ds: "nvidia-driver-daemonset-ubuntu22.04",
			wantImage: custom, wantPull: corev1.PullAlways, wantForce: "true", wantSecret: []string{"mgr-secret", "drv-secret"}},
		"an NVIDIADriver's manager": {policy: viaCRD, facts: crdFacts, ds: "nvidia-driver-daemonset-pool-ubuntu22.04",
			wantImage: custom, wantPull: corev1.PullAlways, wantForce: "true", wantSecret: []string{"mgr-secret", "drv-secret"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ds := renderedDaemonSets(t, tc.policy, tc.facts)[tc.ds]
			if ds == nil {
				t.Fatalf("no DaemonSet %s", tc.ds)
			}
			ps := ds.Spec.Template.Spec
			if len(ps.InitContainers) == 0 || ps.InitContainers[0].Name != DriverManagerContainer {
				t.Fatalf("init containers %v, want %s first", ps.InitContainers, DriverManagerContainer)
			}
			mgr := ps.InitContainers[0]
			if mgr.Image != tc.wantImage || mgr.ImagePullPolicy != tc.wantPull {
				t.Errorf("manager image %s (%s), want %s (%s)", mgr.Image, mgr.ImagePullPolicy, tc.wantImage, tc.wantPull)
			}
			env := envMap(mgr.Env)
			if env[EnvGPUPodEviction] != "false" || env[EnvAutoDrain] != "false" || env["DRAIN_USE_FORCE"] != tc.wantForce {
				t.Errorf("manager env %v: want eviction and drain false, DRAIN_USE_FORCE %s", env, tc.wantForce)
			}
			var secrets []string
			for _, s := range ps.ImagePullSecrets {
				secrets = append(secrets, s.Name)
			}
			if diff := cmp.Diff(tc.wantSecret, secrets); diff != "" {
				t.Errorf("pull secrets, each once (-want +got):\n%s", diff)
			}
			drv := container(ps.Containers, "nvidia-driver-ctr")
			for _, c := range []*corev1.Container{&mgr, drv} {
				if c == nil || c.TerminationMessagePolicy != corev1.TerminationMessageFallbackToLogsOnError {
					t.Errorf("container %v: want terminationMessagePolicy FallbackToLogsOnError (the upgrade reads the module-in-use line)", c)
				}
			}
			if drv.Image == mgr.Image {
				t.Errorf("the manager's image replaced the driver's: %s", drv.Image)
			}
		})
	}
}

// The NVIDIADriver reports what the ClusterPolicy reports of its driver.
func TestNVIDIADriverUnsupportedDriverFields(t *testing.T) {
	d := nvDriver("pool", true, nil)
	d.Spec.LivenessProbe = &nvidiav1.ContainerProbeSpec{PeriodSeconds: 30}
	d.Spec.RepoConfig = &nvidiav1.NameRef{Name: "repos"}
	d.Spec.CertConfig = &nvidiav1.NameRef{Name: "certs"}
	d.Spec.Manager.Env = []nvidiav1.EnvVar{{Name: EnvAutoDrain, Value: "true"}}
	var got []string
	for _, f := range NVIDIADriverUnsupported(&d) {
		got = append(got, f.Path)
	}
	want := []string{"spec.livenessProbe", "spec.repoConfig.name", "spec.certConfig.name", "spec.manager.env[ENABLE_AUTO_DRAIN]"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("unsupported (-want +got):\n%s", diff)
	}
}

func TestDriverProbes(t *testing.T) {
	startup := func() *corev1.Probe {
		return &corev1.Probe{InitialDelaySeconds: 60, PeriodSeconds: 10, FailureThreshold: 120, TimeoutSeconds: 1, SuccessThreshold: 1}
	}
	tests := map[string]struct {
		driver        nvidiav1.DriverSpec
		wantStartup   *corev1.Probe
		wantReadiness *corev1.Probe
	}{
		"none set: the asset's startup probe, no readiness probe": {wantStartup: startup()},
		"startup settings": {
			driver:      nvidiav1.DriverSpec{StartupProbe: &nvidiav1.ContainerProbeSpec{TimeoutSeconds: 60, FailureThreshold: 30}},
			wantStartup: &corev1.Probe{InitialDelaySeconds: 60, PeriodSeconds: 10, FailureThreshold: 30, TimeoutSeconds: 60, SuccessThreshold: 1},
		},
		"readiness probe set empty: nvidia-smi with the defaults": {
			driver:        nvidiav1.DriverSpec{ReadinessProbe: &nvidiav1.ContainerProbeSpec{}},
			wantStartup:   startup(),
			wantReadiness: readinessDefaults(),
		},
		"readiness settings over the defaults": {
			driver:      nvidiav1.DriverSpec{ReadinessProbe: &nvidiav1.ContainerProbeSpec{InitialDelaySeconds: 10, PeriodSeconds: 30, SuccessThreshold: 2}},
			wantStartup: startup(),
			wantReadiness: func() *corev1.Probe {
				p := readinessDefaults()
				p.InitialDelaySeconds, p.PeriodSeconds, p.SuccessThreshold = 10, 30, 2
				return p
			}(),
		},
		"a liveness probe is never rendered": {
			driver:      nvidiav1.DriverSpec{LivenessProbe: &nvidiav1.ContainerProbeSpec{PeriodSeconds: 5}},
			wantStartup: startup(),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctr := &corev1.Container{StartupProbe: startup()}
			driverProbes(ctr, &tc.driver)
			ctr.StartupProbe.ProbeHandler = corev1.ProbeHandler{}
			if diff := cmp.Diff(tc.wantStartup, ctr.StartupProbe); diff != "" {
				t.Errorf("startup probe (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantReadiness, ctr.ReadinessProbe); diff != "" {
				t.Errorf("readiness probe (-want +got):\n%s", diff)
			}
			if ctr.LivenessProbe != nil {
				t.Errorf("liveness probe rendered: %+v", ctr.LivenessProbe)
			}
		})
	}
}

func TestKernelModuleTypeEnv(t *testing.T) {
	tests := map[string]struct {
		driver nvidiav1.DriverSpec
		want   map[string]string
	}{
		"unset":                      {want: map[string]string{}},
		"auto (the chart's default)": {driver: nvidiav1.DriverSpec{KernelModuleType: "auto"}, want: map[string]string{"KERNEL_MODULE_TYPE": "auto"}},
		"open":                       {driver: nvidiav1.DriverSpec{KernelModuleType: "open"}, want: map[string]string{"KERNEL_MODULE_TYPE": "open", "OPEN_KERNEL_MODULES_ENABLED": "true"}},
		"proprietary":                {driver: nvidiav1.DriverSpec{KernelModuleType: "proprietary"}, want: map[string]string{"KERNEL_MODULE_TYPE": "proprietary"}},
		"deprecated useOpenKernelModules alone": {driver: nvidiav1.DriverSpec{UseOpenKernelModules: ptr.To(true)},
			want: map[string]string{"KERNEL_MODULE_TYPE": "open", "OPEN_KERNEL_MODULES_ENABLED": "true"}},
		"kernelModuleType wins over useOpenKernelModules": {driver: nvidiav1.DriverSpec{UseOpenKernelModules: ptr.To(true), KernelModuleType: "proprietary"},
			want: map[string]string{"KERNEL_MODULE_TYPE": "proprietary"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, envMap(kernelModuleTypeEnv(&tc.driver))); diff != "" {
				t.Errorf("env (-want +got):\n%s", diff)
			}
		})
	}
}

// driver.kernelModuleConfig: the ConfigMap's files where the driver reads
// module parameters, by subPath (the installer in /drivers stays visible);
// driver.secretEnv: the Secret's entries as env; driver.resources: the
// manager's too.
func TestDriverContainerSettings(t *testing.T) {
	p := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "u"}}
	p.Spec.Driver.KernelModuleConfig = &nvidiav1.NameRef{Name: "module-params"}
	p.Spec.Driver.SecretEnv = "driver-secrets"
	p.Spec.Driver.Resources = &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}
	ps := renderedDaemonSets(t, p, oneNodeKind)["nvidia-driver-daemonset-ubuntu22.04"].Spec.Template.Spec
	drv := container(ps.Containers, "nvidia-driver-ctr")
	var mounts []string
	for _, m := range drv.VolumeMounts {
		if m.Name == "kernel-module-config" {
			if !m.ReadOnly || m.MountPath != "/drivers/"+m.SubPath {
				t.Errorf("mount %+v: want read-only at /drivers/<subPath>", m)
			}
			mounts = append(mounts, m.SubPath)
		}
	}
	if diff := cmp.Diff([]string{"nvidia.conf", "nvidia-modeset.conf", "nvidia-peermem.conf", "nvidia-uvm.conf"}, mounts); diff != "" {
		t.Errorf("module parameter files (-want +got):\n%s", diff)
	}
	i := slices.IndexFunc(ps.Volumes, func(v corev1.Volume) bool { return v.Name == "kernel-module-config" })
	if i < 0 || ps.Volumes[i].ConfigMap == nil || ps.Volumes[i].ConfigMap.Name != "module-params" || ps.Volumes[i].ConfigMap.Optional != nil {
		t.Errorf("volumes %+v: want the ConfigMap module-params, not optional", ps.Volumes)
	}
	if len(drv.EnvFrom) != 1 || drv.EnvFrom[0].SecretRef == nil || drv.EnvFrom[0].SecretRef.Name != "driver-secrets" {
		t.Errorf("envFrom %+v, want the Secret driver-secrets", drv.EnvFrom)
	}
	if mgr := container(ps.InitContainers, DriverManagerContainer); mgr.Resources.Requests.Cpu().String() != "100m" {
		t.Errorf("manager resources %+v, want the driver's", mgr.Resources)
	}
}
