package gpustack

import (
	"strings"

	corev1 "k8s.io/api/core/v1"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
)

// UnsupportedField is a field of a policy that turns on a feature gpufleet
// does not provide. The policy is accepted as written; the feature is not
// deployed, and the policy's UnsupportedFields condition names the field.
type UnsupportedField struct {
	// Path of the field in the object, e.g. "spec.vgpuManager.enabled".
	Path string
	// Feature it turns on, e.g. "NVIDIA vGPU host driver".
	Feature string
}

func (f UnsupportedField) String() string { return f.Path + " (" + f.Feature + ")" }

// UnsupportedFields lists, in a fixed order, the fields of spec that turn
// on a feature gpufleet does not provide (pure). A field counts only when
// it is on as the NVIDIA GPU Operator reads it: these features are off
// unless set to true, and the sandbox operands (VFIO manager, vGPU device
// manager, the sandbox and Kata device plugins, the confidential computing
// manager) run there only with sandboxWorkloads.enabled — the chart leaves
// them "enabled" with sandbox workloads off, which turns nothing on. The
// vGPU manager counts whenever it is enabled: the chart leaves it off, so
// enabling it is a request for vGPU.
func UnsupportedFields(spec *nvidiav1.ClusterPolicySpec) []UnsupportedField {
	var out []UnsupportedField
	add := func(on bool, path, feature string) {
		if on {
			out = append(out, UnsupportedField{Path: "spec." + path, Feature: feature})
		}
	}
	sandbox := isTrue(spec.SandboxWorkloads.Enabled)
	mode := spec.SandboxWorkloads.Mode
	if mode == "" {
		mode = "kubevirt" // the NVIDIA GPU Operator's default
	}
	d := &spec.Driver
	add(isTrue(d.UsePrecompiled), "driver.usePrecompiled", "precompiled driver modules")
	add(d.RDMA != nil && isTrue(d.RDMA.Enabled), "driver.rdma.enabled", "GPUDirect RDMA")
	out = append(out, driverUnsupported("driver.", d.LivenessProbe, "repoConfig.configMapName", repoConfigName(d.RepoConfig), nameOf(d.CertConfig), d.Manager)...)
	add(d.LicensingConfig != nil && (d.LicensingConfig.ConfigMapName != "" || d.LicensingConfig.SecretName != ""),
		"driver.licensingConfig", "vGPU guest driver licensing")
	add(d.VirtualTopology != nil && d.VirtualTopology.Config != "", "driver.virtualTopology.config", "vGPU virtual topology")
	add(spec.DevicePlugin.Config != nil && spec.DevicePlugin.Config.Name != "", "devicePlugin.config.name",
		"device plugin configurations from a ConfigMap, e.g. time-slicing")
	add(spec.MIGManager.GPUClientsConfig != nil && spec.MIGManager.GPUClientsConfig.Name != "", "migManager.gpuClientsConfig.name",
		"the GPU clients mig-manager restarts around a MIG change")
	add(isTrue(spec.PSA.Enabled), "psa.enabled", "Pod Security Admission labels")
	add(isTrue(spec.CDI.NRIPluginEnabled), "cdi.nriPluginEnabled", "CDI injection through an NRI plugin")
	add(spec.DCGMExporter.HPCJobMapping != nil && isTrue(spec.DCGMExporter.HPCJobMapping.Enabled),
		"dcgmExporter.hpcJobMapping.enabled", "HPC job mapping of GPU metrics")
	add(isTrue(spec.Operator.UseOpenShiftDriverToolkit), "operator.use_ocp_driver_toolkit", "the OpenShift Driver Toolkit")
	add(spec.GPUDirectStorage != nil && isTrue(spec.GPUDirectStorage.Enabled), "gds.enabled", "GPUDirect Storage")
	add(spec.GDRCopy != nil && isTrue(spec.GDRCopy.Enabled), "gdrcopy.enabled", "GDRCopy")
	add(sandbox, "sandboxWorkloads.enabled", "GPUs for virtual machines")
	add(isTrue(spec.VGPUManager.Enabled), "vgpuManager.enabled", "NVIDIA vGPU host driver")
	add(sandbox && isTrue(spec.VGPUDeviceManager.Enabled), "vgpuDeviceManager.enabled", "vGPU device manager")
	add(sandbox && isTrue(spec.VFIOManager.Enabled), "vfioManager.enabled", "VFIO-PCI manager")
	add(sandbox && mode == "kubevirt" && isTrue(spec.SandboxDevicePlugin.Enabled), "sandboxDevicePlugin.enabled", "KubeVirt GPU device plugin")
	add(sandbox && mode == "kata" && isTrue(spec.KataSandboxDevicePlugin.Enabled), "kataSandboxDevicePlugin.enabled", "Kata sandbox device plugin")
	add(isTrue(spec.KataManager.Enabled), "kataManager.enabled", "Kata manager")
	add(sandbox && mode == "kata" && isTrue(spec.CCManager.Enabled), "ccManager.enabled", "confidential computing manager")
	out = append(out, securityContextUnsupported(spec)...)
	add(spec.DCGMExporter.Service != nil && spec.DCGMExporter.Service.Type == corev1.ServiceTypeExternalName,
		"dcgmExporter.service.type", "an ExternalName Service for dcgm-exporter (an alias without the exporters as endpoints): it stays ClusterIP")
	add(isTrue(spec.PSP.Enabled), "psp.enabled", "PodSecurityPolicies (removed in Kubernetes 1.25)")
	add(len(spec.Operator.Labels) > 0, "operator.labels", "labels of the operator's own pods: set them in gpufleet's Helm chart (podLabels)")
	add(len(spec.Operator.Annotations) > 0, "operator.annotations", "annotations of the operator's own pods: set them in gpufleet's Helm chart (podAnnotations)")
	add(spec.Operator.InitContainer != nil && (spec.Operator.InitContainer.Image != "" || spec.Operator.InitContainer.Repository != "" || spec.Operator.InitContainer.Version != ""),
		"operator.initContainer", "the deprecated init container image: the validation init containers use the validator's image")
	add(spec.Operator.Metrics != nil && spec.Operator.Metrics.ServiceMonitor != nil && isTrue(spec.Operator.Metrics.ServiceMonitor.Enabled),
		"operator.metrics.serviceMonitor.enabled", "a ServiceMonitor for the operator's own metrics; gpufleet's Helm chart creates one with serviceMonitor.enabled")
	return out
}

// UnsupportedMessage is the UnsupportedFields condition's message for
// fields ("" when there are none).
func UnsupportedMessage(fields []UnsupportedField) string {
	if len(fields) == 0 {
		return ""
	}
	s := make([]string, len(fields))
	for i, f := range fields {
		s[i] = f.String()
	}
	return "not supported by gpufleet, accepted and not deployed: " + strings.Join(s, ", ")
}

func isTrue(b *bool) bool { return b != nil && *b }

// driverUnsupported lists the fields of a driver section (the policy's
// driver, prefix "driver.", or an NVIDIADriver's spec, prefix "") that the
// renderer leaves out on purpose: the liveness probe (driverProbes), the
// repository and certificate ConfigMaps (NVIDIA's GPU Operator mounts each
// key of them, which a renderer without a client cannot list), and
// k8s-driver-manager env that would turn on its eviction or drain
// (rendered as "false": managerForcedOff).
func driverUnsupported(prefix string, liveness *nvidiav1.ContainerProbeSpec, repoPath, repoConfig, certConfig string, m *nvidiav1.DriverManagerSpec) []UnsupportedField {
	var out []UnsupportedField
	add := func(on bool, path, feature string) {
		if on {
			out = append(out, UnsupportedField{Path: "spec." + prefix + path, Feature: feature})
		}
	}
	add(liveness != nil, "livenessProbe", "a driver liveness probe, whose failure would restart the driver outside maintenance")
	add(repoConfig != "", repoPath, "package repositories from a ConfigMap in the driver container")
	add(certConfig != "", "certConfig.name", "CA certificates from a ConfigMap in the driver container")
	for _, name := range ManagerEnvOverrides(m) {
		add(true, "manager.env["+name+"]", "eviction or drain by k8s-driver-manager, rendered as false: gpufleet drains through NodeMaintenance")
	}
	return out
}

func repoConfigName(r *nvidiav1.ConfigMapRef) string {
	if r == nil {
		return ""
	}
	return r.ConfigMapName
}

func nameOf(r *nvidiav1.NameRef) string {
	if r == nil {
		return ""
	}
	return r.Name
}
