package gpustack

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
)

// policyFile reads a ClusterPolicy; a field the API types do not know
// fails the test (as kubectl's strict field validation would reject it).
func policyFile(t *testing.T, path string) *nvidiav1.ClusterPolicy {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p := &nvidiav1.ClusterPolicy{}
	if err := yaml.UnmarshalStrict(data, p); err != nil {
		t.Fatalf("%s does not fit the API types: %v", path, err)
	}
	return p
}

func chartDefaultPolicy(t *testing.T) *nvidiav1.ClusterPolicy {
	p := policyFile(t, "testdata/clusterpolicy-chart-default.yaml")
	p.UID = "uid-chart-default"
	return p
}

func commonOptionsPolicy(t *testing.T) *nvidiav1.ClusterPolicy {
	p := policyFile(t, "testdata/clusterpolicy-common-options.yaml")
	p.UID = "uid-common-options"
	return p
}

// Every policy of the test data and the examples fits the API types.
func TestPolicyFilesFitTheTypes(t *testing.T) {
	files, err := filepath.Glob("testdata/*clusterpolicy*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	examples, err := filepath.Glob("../../examples/clusterpolicy*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, examples...)
	if len(files) < 4 {
		t.Fatalf("found only %v", files)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) { policyFile(t, f) })
	}
}

func TestUnsupportedFields(t *testing.T) {
	on := ptr.To(true)
	tests := map[string]struct {
		spec func(*nvidiav1.ClusterPolicySpec)
		want []string
	}{
		"nothing set": {spec: func(*nvidiav1.ClusterPolicySpec) {}},
		"vGPU manager enabled": {
			spec: func(s *nvidiav1.ClusterPolicySpec) { s.VGPUManager.Enabled = on },
			want: []string{"spec.vgpuManager.enabled"},
		},
		"vGPU manager disabled": {
			spec: func(s *nvidiav1.ClusterPolicySpec) { s.VGPUManager.Enabled = ptr.To(false) },
		},
		"sandbox operands enabled without sandbox workloads turn nothing on (the chart's defaults)": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.VFIOManager.Enabled, s.VGPUDeviceManager.Enabled, s.SandboxDevicePlugin.Enabled = on, on, on
				s.KataSandboxDevicePlugin.Enabled, s.CCManager.Enabled = on, on
				s.SandboxWorkloads.Enabled = ptr.To(false)
			},
		},
		"sandbox workloads (kubevirt by default) with its operands": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.SandboxWorkloads.Enabled = on
				s.VFIOManager.Enabled, s.VGPUDeviceManager.Enabled, s.SandboxDevicePlugin.Enabled = on, on, on
				s.KataSandboxDevicePlugin.Enabled, s.CCManager.Enabled = on, on
			},
			want: []string{"spec.sandboxWorkloads.enabled", "spec.vgpuDeviceManager.enabled", "spec.vfioManager.enabled", "spec.sandboxDevicePlugin.enabled"},
		},
		"sandbox workloads in kata mode: kata device plugin and confidential computing": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.SandboxWorkloads.Enabled, s.SandboxWorkloads.Mode = on, "kata"
				s.SandboxDevicePlugin.Enabled, s.KataSandboxDevicePlugin.Enabled, s.CCManager.Enabled = on, on, on
			},
			want: []string{"spec.sandboxWorkloads.enabled", "spec.kataSandboxDevicePlugin.enabled", "spec.ccManager.enabled"},
		},
		"kata manager": {
			spec: func(s *nvidiav1.ClusterPolicySpec) { s.KataManager.Enabled = on },
			want: []string{"spec.kataManager.enabled"},
		},
		"GPUDirect Storage and GDRCopy": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.GPUDirectStorage = &nvidiav1.OperandSpec{Enabled: on}
				s.GDRCopy = &nvidiav1.OperandSpec{Enabled: on}
			},
			want: []string{"spec.gds.enabled", "spec.gdrcopy.enabled"},
		},
		"GDS present but off": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.GPUDirectStorage = &nvidiav1.OperandSpec{Enabled: ptr.To(false)}
			},
		},
		"driver options not provided": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.Driver.UseNvidiaDriverCRD, s.Driver.UsePrecompiled = on, on
				s.Driver.RDMA = &nvidiav1.GPUDirectRDMASpec{Enabled: on, UseHostMOFED: on}
			},
			want: []string{"spec.driver.usePrecompiled", "spec.driver.rdma.enabled"}, // useNvidiaDriverCRD is provided
		},
		"monitoring and admission options not provided": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.PSA.Enabled, s.CDI.NRIPluginEnabled = on, on
				s.DCGMExporter.ServiceMonitor = &nvidiav1.ServiceMonitorSpec{Enabled: on}
				s.DCGMExporter.HPCJobMapping = &nvidiav1.HPCJobMappingSpec{Enabled: on}
				s.Operator.UseOpenShiftDriverToolkit = on
			},
			// dcgmExporter.serviceMonitor is provided (servicemonitor.go).
			want: []string{"spec.psa.enabled", "spec.cdi.nriPluginEnabled",
				"spec.dcgmExporter.hpcJobMapping.enabled", "spec.operator.use_ocp_driver_toolkit"},
		},
		"driver options left out on purpose": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.Driver.LivenessProbe = &nvidiav1.ContainerProbeSpec{PeriodSeconds: 30}
				s.Driver.RepoConfig = &nvidiav1.ConfigMapRef{ConfigMapName: "repos"}
				s.Driver.CertConfig = &nvidiav1.NameRef{Name: "certs"}
				s.Driver.Manager = &nvidiav1.DriverManagerSpec{Env: []nvidiav1.EnvVar{
					{Name: EnvGPUPodEviction, Value: "true"}, {Name: EnvAutoDrain, Value: "1"}, {Name: "DRAIN_USE_FORCE", Value: "true"}}}
				s.Driver.LicensingConfig = &nvidiav1.LicensingConfigSpec{SecretName: "licence"}
				s.Driver.VirtualTopology = &nvidiav1.VirtualTopologySpec{Config: "topology"}
			},
			want: []string{"spec.driver.livenessProbe", "spec.driver.repoConfig.configMapName", "spec.driver.certConfig.name",
				"spec.driver.manager.env[ENABLE_AUTO_DRAIN]", "spec.driver.manager.env[ENABLE_GPU_POD_EVICTION]",
				"spec.driver.licensingConfig", "spec.driver.virtualTopology.config"},
		},
		"the chart's empty driver ConfigMap names and licensing turn nothing on": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.Driver.RepoConfig = &nvidiav1.ConfigMapRef{}
				s.Driver.CertConfig = &nvidiav1.NameRef{}
				s.Driver.LicensingConfig = &nvidiav1.LicensingConfigSpec{NLSEnabled: ptr.To(true)}
				s.Driver.VirtualTopology = &nvidiav1.VirtualTopologySpec{}
				s.Driver.Manager = &nvidiav1.DriverManagerSpec{Env: []nvidiav1.EnvVar{{Name: EnvGPUPodEviction, Value: "false"}}}
				s.DevicePlugin.Config = &nvidiav1.DevicePluginConfig{Default: "any"}
				s.MIGManager.GPUClientsConfig = &nvidiav1.NameRef{}
			},
		},
		"device plugin and mig-manager ConfigMaps": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.DevicePlugin.Config = &nvidiav1.DevicePluginConfig{Name: "time-slicing", Default: "any"}
				s.MIGManager.GPUClientsConfig = &nvidiav1.NameRef{Name: "gpu-clients"}
			},
			want: []string{"spec.devicePlugin.config.name", "spec.migManager.gpuClientsConfig.name"},
		},
		"features gpufleet provides are not reported": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.CDI.Enabled, s.MIGManager.Enabled, s.DCGM.Enabled, s.NodeStatusExporter.Enabled = on, on, on, on
				s.DCGMExporter.ServiceMonitor = &nvidiav1.ServiceMonitorSpec{Enabled: on}
				s.Driver.StartupProbe = &nvidiav1.ContainerProbeSpec{PeriodSeconds: 5}
				s.Driver.ReadinessProbe = &nvidiav1.ContainerProbeSpec{PeriodSeconds: 5}
				s.Driver.KernelModuleConfig = &nvidiav1.NameRef{Name: "params"}
				s.Driver.Manager = &nvidiav1.DriverManagerSpec{Env: []nvidiav1.EnvVar{{Name: "DRAIN_USE_FORCE", Value: "true"}}}
				s.HostPaths = nvidiav1.HostPathsSpec{RootFS: "/host-root", DriverInstallDir: "/opt/nvidia/driver", KubeletRootDir: "/var/lib/k0s/kubelet"}
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			spec := &nvidiav1.ClusterPolicySpec{}
			tc.spec(spec)
			var got []string
			for _, f := range UnsupportedFields(spec) {
				got = append(got, f.Path)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("unsupported fields (-want +got):\n%s", diff)
			}
		})
	}
}

// CommonOptionsUnsupported is the UnsupportedFields message of
// testdata/clusterpolicy-common-options.yaml (also checked against the API
// server by TestReconcileGPUOperatorPolicies).
const CommonOptionsUnsupported = "not supported by gpufleet, accepted and not deployed: " +
	"spec.driver.livenessProbe (a driver liveness probe, whose failure would restart the driver outside maintenance), " +
	"spec.driver.repoConfig.configMapName (package repositories from a ConfigMap in the driver container), " +
	"spec.driver.certConfig.name (CA certificates from a ConfigMap in the driver container), " +
	"spec.driver.manager.env[ENABLE_GPU_POD_EVICTION] (eviction or drain by k8s-driver-manager, rendered as false: gpufleet drains through NodeMaintenance), " +
	"spec.devicePlugin.config.name (device plugin configurations from a ConfigMap, e.g. time-slicing), " +
	"spec.migManager.gpuClientsConfig.name (the GPU clients mig-manager restarts around a MIG change), " +
	"spec.operator.metrics.serviceMonitor.enabled (a ServiceMonitor for the operator's own metrics; gpufleet's Helm chart creates one with serviceMonitor.enabled)"

func TestUnsupportedFieldsOfThePolicyFiles(t *testing.T) {
	tests := map[string]struct {
		policy  func(*testing.T) *nvidiav1.ClusterPolicy
		wantMsg string
	}{
		"v1.6":           {policy: v16Policy, wantMsg: ""},
		"chart defaults": {policy: chartDefaultPolicy, wantMsg: ""},
		"common options": {policy: commonOptionsPolicy, wantMsg: CommonOptionsUnsupported},
		"chart defaults with vGPU": {policy: func(t *testing.T) *nvidiav1.ClusterPolicy {
			p := chartDefaultPolicy(t)
			p.Spec.VGPUManager.Enabled = ptr.To(true)
			return p
		}, wantMsg: "not supported by gpufleet, accepted and not deployed: spec.vgpuManager.enabled (NVIDIA vGPU host driver)"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := tc.policy(t)
			if got := UnsupportedMessage(UnsupportedFields(&p.Spec)); got != tc.wantMsg {
				t.Errorf("message\n got %q\nwant %q", got, tc.wantMsg)
			}
		})
	}
}

func TestValidatorEnabled(t *testing.T) {
	off, on := ptr.To(false), ptr.To(true)
	v1x := func(enabled *bool, image string) *nvidiav1.ComponentSpec {
		return &nvidiav1.ComponentSpec{Enabled: enabled, Repository: "nvcr.io/nvidia/k8s", Image: image, Version: "vectoradd-cuda10.2"}
	}
	tests := map[string]struct {
		spec      nvidiav1.ClusterPolicySpec
		want      bool
		wantImage string
	}{
		"nothing set: on":         {want: true, wantImage: "nvcr.io/nvidia/cloud-native/gpu-operator-validator:v24.9.0"},
		"validator.enabled false": {spec: nvidiav1.ClusterPolicySpec{Validator: nvidiav1.ValidatorSpec{ComponentSpec: nvidiav1.ComponentSpec{Enabled: off}}}},
		"1.x: operator.validator.enabled false": {
			spec: nvidiav1.ClusterPolicySpec{Operator: nvidiav1.OperatorSpec{Validator: v1x(off, "cuda-sample")}},
		},
		"1.x: operator.validator with an image only: on, its image": {
			spec: nvidiav1.ClusterPolicySpec{Operator: nvidiav1.OperatorSpec{Validator: v1x(nil, "cuda-sample")}},
			want: true, wantImage: "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda10.2",
		},
		"1.x off while validator names an image: off": {
			spec: nvidiav1.ClusterPolicySpec{Operator: nvidiav1.OperatorSpec{Validator: v1x(off, "cuda-sample")},
				Validator: nvidiav1.ValidatorSpec{ComponentSpec: nvidiav1.ComponentSpec{Repository: "nvcr.io/nvidia", Image: "gpu-operator", Version: "v26.7.0"}}},
		},
		"validator.enabled set wins over the 1.x place": {
			spec: nvidiav1.ClusterPolicySpec{Operator: nvidiav1.OperatorSpec{Validator: v1x(off, "cuda-sample")},
				Validator: nvidiav1.ValidatorSpec{ComponentSpec: nvidiav1.ComponentSpec{Enabled: on}}},
			want: true, wantImage: "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda10.2",
		},
		"validator's image wins over the 1.x image": {
			spec: nvidiav1.ClusterPolicySpec{Operator: nvidiav1.OperatorSpec{Validator: v1x(on, "cuda-sample")},
				Validator: nvidiav1.ValidatorSpec{ComponentSpec: nvidiav1.ComponentSpec{Repository: "nvcr.io/nvidia", Image: "gpu-operator", Version: "v26.7.0"}}},
			want: true, wantImage: "nvcr.io/nvidia/gpu-operator:v26.7.0",
		},
	}
	facts := Facts{Namespace: "ns", OSFlavours: []OSFlavour{{"ubuntu", "22.04"}}, Runtimes: []string{"containerd"}}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			spec := tc.spec.DeepCopy()
			if got := ValidatorEnabled(spec); got != tc.want {
				t.Errorf("ValidatorEnabled = %v, want %v", got, tc.want)
			}
			// The renderer and the node labels give the same answer.
			p := &nvidiav1.ClusterPolicy{Spec: *spec}
			objs, err := Render(p, facts, Assets)
			if err != nil {
				t.Fatal(err)
			}
			rendered, image := false, ""
			for _, o := range objs {
				if o.GetLabels()[LabelComponent] == Validator {
					rendered = true
					if ds, ok := o.(*appsv1.DaemonSet); ok {
						image = ds.Spec.Template.Spec.Containers[0].Image
					}
				}
			}
			if rendered != tc.want || image != tc.wantImage {
				t.Errorf("rendered validator = %v with image %q, want %v with %q", rendered, image, tc.want, tc.wantImage)
			}
			n := gpuNode(nil, "containerd://1.7")
			n.Labels = applied(n, NodeLabels(n, spec))
			if _, labelled := n.Labels["nvidia.com/gpu.deploy."+Validator]; labelled != tc.want {
				t.Errorf("validator deploy label present = %v, want %v", labelled, tc.want)
			}
			// The spec is read, never written.
			if diff := cmp.Diff(&tc.spec, spec); diff != "" {
				t.Errorf("the spec changed (-before +after):\n%s", diff)
			}
		})
	}
}

func TestUnsupportedMessageNamesEachField(t *testing.T) {
	spec := &nvidiav1.ClusterPolicySpec{}
	spec.VGPUManager.Enabled = ptr.To(true)
	spec.KataManager.Enabled = ptr.To(true)
	msg := UnsupportedMessage(UnsupportedFields(spec))
	for _, want := range []string{"spec.vgpuManager.enabled (NVIDIA vGPU host driver)", "spec.kataManager.enabled (Kata manager)"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not name %q", msg, want)
		}
	}
}
