package gpustack

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
)

// A component's securityContext (the NVIDIA GPU Operator 1.x field of
// every component; gpu-operator accepted it and never applied it, and
// removed it in v1.11) is applied to the component's main container, over
// the asset's (pure): each field the policy sets replaces the asset's,
// except two that would break the component or make the API server refuse
// its DaemonSet, which are left out and reported in the UnsupportedFields
// condition instead (securityContextUnsupported):
//   - privileged: false on a component that needs privileged mode
//     (Component.Privileged);
//   - allowPrivilegeEscalation: false where the container is privileged or
//     adds CAP_SYS_ADMIN (dcgm-exporter's asset does, for profiling metrics):
//     the API server refuses that combination.
//
// Capabilities the policy adds come on top of the asset's.

// sysAdminComponents are the components whose asset adds CAP_SYS_ADMIN to
// the main container (a test checks the assets agree).
var sysAdminComponents = map[string]bool{DCGMExporter: true}

// applySecurityContext overlays the policy's securityContext on ctr's.
func applySecurityContext(ctr *corev1.Container, c Component, user *corev1.SecurityContext) {
	if user == nil {
		return
	}
	sc := ctr.SecurityContext.DeepCopy()
	if sc == nil {
		sc = &corev1.SecurityContext{}
	}
	u := user.DeepCopy()
	set := func(dst **bool, v *bool) {
		if v != nil {
			*dst = v
		}
	}
	if u.Capabilities != nil {
		caps := sc.Capabilities
		if caps == nil {
			caps = &corev1.Capabilities{}
		}
		for _, a := range u.Capabilities.Add {
			if !slices.Contains(caps.Add, a) {
				caps.Add = append(caps.Add, a)
			}
		}
		caps.Drop = u.Capabilities.Drop
		sc.Capabilities = caps
	}
	set(&sc.Privileged, u.Privileged)
	set(&sc.RunAsNonRoot, u.RunAsNonRoot)
	set(&sc.ReadOnlyRootFilesystem, u.ReadOnlyRootFilesystem)
	set(&sc.AllowPrivilegeEscalation, u.AllowPrivilegeEscalation)
	if u.SELinuxOptions != nil {
		sc.SELinuxOptions = u.SELinuxOptions
	}
	if u.WindowsOptions != nil {
		sc.WindowsOptions = u.WindowsOptions
	}
	if u.RunAsUser != nil {
		sc.RunAsUser = u.RunAsUser
	}
	if u.RunAsGroup != nil {
		sc.RunAsGroup = u.RunAsGroup
	}
	if u.ProcMount != nil {
		sc.ProcMount = u.ProcMount
	}
	if u.SeccompProfile != nil {
		sc.SeccompProfile = u.SeccompProfile
	}
	if u.AppArmorProfile != nil {
		sc.AppArmorProfile = u.AppArmorProfile
	}
	if c.Privileged {
		sc.Privileged = ptr.To(true)
	}
	if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation && escalates(sc) {
		sc.AllowPrivilegeEscalation = nil
	}
	ctr.SecurityContext = sc
}

// escalates reports whether a container with sc needs privilege
// escalation (the API server refuses allowPrivilegeEscalation: false then).
func escalates(sc *corev1.SecurityContext) bool {
	return isTrue(sc.Privileged) || sc.Capabilities != nil && slices.Contains(sc.Capabilities.Add, "SYS_ADMIN")
}

// componentPaths are the places of each component's settings in the
// policy (for the UnsupportedFields condition).
var componentPaths = map[string]string{
	Driver: "driver", ContainerToolkit: "toolkit", DevicePlugin: "devicePlugin", Validator: "validator",
	DCGM: "dcgm", DCGMExporter: "dcgmExporter", GFD: "gfd", MIGManager: "migManager", NodeStatusExporter: "nodeStatusExporter",
}

// securityContextUnsupported lists the securityContext fields that
// applySecurityContext leaves out (see above), for enabled components.
func securityContextUnsupported(spec *nvidiav1.ClusterPolicySpec) []UnsupportedField {
	var out []UnsupportedField
	for _, c := range nvidiav1.Components {
		sc := c.Spec(spec).SecurityContext
		if sc == nil || !c.Enabled(spec) {
			continue
		}
		path := "spec." + componentPaths[c.Key]
		if c.Key == Validator && spec.Validator.SecurityContext == nil {
			path = "spec.operator.validator" // the 1.x place the validator's Spec read it from (api/nvidia/v1/stack.go)
		}
		if c.Privileged && sc.Privileged != nil && !*sc.Privileged {
			out = append(out, UnsupportedField{Path: path + ".securityContext.privileged",
				Feature: "an unprivileged " + c.Key + " container: it needs privileged mode, rendered privileged"})
		}
		needs := c.Privileged || sysAdminComponents[c.Key] || escalates(sc)
		if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation && needs {
			out = append(out, UnsupportedField{Path: path + ".securityContext.allowPrivilegeEscalation",
				Feature: "no privilege escalation for " + c.Key + ", which runs privileged or with CAP_SYS_ADMIN: rendered without it"})
		}
	}
	return out
}
