package gpustack

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
)

// A component's securityContext goes to its main container, over the
// asset's; what would break a privileged (or CAP_SYS_ADMIN) component is
// left out and reported.
func TestComponentSecurityContext(t *testing.T) {
	tests := map[string]struct {
		spec            func(*nvidiav1.ClusterPolicySpec)
		daemonSet       string
		want            *corev1.SecurityContext
		wantUnsupported []string
	}{
		"not set: the asset's": {
			spec:      func(*nvidiav1.ClusterPolicySpec) {},
			daemonSet: "nvidia-dcgm-exporter",
			want:      &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"SYS_ADMIN"}}},
		},
		"the 1.6 example's driver context (1.x chart)": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.Driver.SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true), SELinuxOptions: &corev1.SELinuxOptions{Level: "s0"}}
			},
			daemonSet: "nvidia-driver-daemonset-ubuntu22.04",
			want:      &corev1.SecurityContext{Privileged: ptr.To(true), SELinuxOptions: &corev1.SELinuxOptions{Level: "s0"}},
		},
		"fields over the asset's, capabilities added to the asset's": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.DCGMExporter.SecurityContext = &corev1.SecurityContext{
					RunAsUser: ptr.To(int64(0)), ReadOnlyRootFilesystem: ptr.To(true),
					Capabilities:   &corev1.Capabilities{Add: []corev1.Capability{"SYS_PTRACE", "SYS_ADMIN"}, Drop: []corev1.Capability{"ALL"}},
					SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				}
			},
			daemonSet: "nvidia-dcgm-exporter",
			want: &corev1.SecurityContext{RunAsUser: ptr.To(int64(0)), ReadOnlyRootFilesystem: ptr.To(true),
				Capabilities:   &corev1.Capabilities{Add: []corev1.Capability{"SYS_ADMIN", "SYS_PTRACE"}, Drop: []corev1.Capability{"ALL"}},
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
		},
		"a component without one in its asset": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.GFD.SecurityContext = &corev1.SecurityContext{RunAsNonRoot: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false)}
			},
			daemonSet: "gpu-feature-discovery",
			want:      &corev1.SecurityContext{RunAsNonRoot: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false)},
		},
		"a privileged component stays privileged, with escalation": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.DevicePlugin.SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(false), AllowPrivilegeEscalation: ptr.To(false), RunAsUser: ptr.To(int64(0))}
			},
			daemonSet:       "nvidia-device-plugin-daemonset",
			want:            &corev1.SecurityContext{Privileged: ptr.To(true), RunAsUser: ptr.To(int64(0))},
			wantUnsupported: []string{"spec.devicePlugin.securityContext.privileged", "spec.devicePlugin.securityContext.allowPrivilegeEscalation"},
		},
		"no escalation with CAP_SYS_ADMIN": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.DCGMExporter.SecurityContext = &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false)}
			},
			daemonSet:       "nvidia-dcgm-exporter",
			want:            &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"SYS_ADMIN"}}},
			wantUnsupported: []string{"spec.dcgmExporter.securityContext.allowPrivilegeEscalation"},
		},
		"the 1.x validator place": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.Operator.Validator = &nvidiav1.ComponentSpec{Image: "gpu-operator-validator",
					SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(false)}}
			},
			daemonSet:       "nvidia-operator-validator",
			want:            &corev1.SecurityContext{Privileged: ptr.To(true)},
			wantUnsupported: []string{"spec.operator.validator.securityContext.privileged"},
		},
		"a disabled component is not reported": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.MIGManager.SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(false)}
			},
			daemonSet: "nvidia-device-plugin-daemonset",
			want:      &corev1.SecurityContext{Privileged: ptr.To(true)},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "u"}}
			tc.spec(&p.Spec)
			dss := renderedDaemonSets(t, p, oneNodeKind)
			ds := dss[tc.daemonSet]
			if ds == nil {
				t.Fatalf("no DaemonSet %s", tc.daemonSet)
			}
			got := ds.Spec.Template.Spec.Containers[0].SecurityContext
			if got != nil && got.Capabilities != nil {
				slices.Sort(got.Capabilities.Add)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("main container's securityContext (-want +got):\n%s", diff)
			}
			var unsupported []string
			for _, f := range UnsupportedFields(&p.Spec) {
				unsupported = append(unsupported, f.Path)
			}
			if diff := cmp.Diff(tc.wantUnsupported, unsupported); diff != "" {
				t.Errorf("UnsupportedFields (-want +got):\n%s", diff)
			}
		})
	}
}

// sysAdminComponents says which assets add CAP_SYS_ADMIN to the main
// container: it must agree with the assets.
func TestSysAdminComponentsMatchTheAssets(t *testing.T) {
	for _, c := range nvidiav1.Components {
		objs, err := decodeAsset(Assets, c.Key+".yaml")
		if err != nil {
			t.Fatal(err)
		}
		sysAdmin := false
		for _, o := range objs {
			if d, ok := o.(*appsv1.DaemonSet); ok {
				sc := d.Spec.Template.Spec.Containers[0].SecurityContext
				sysAdmin = sc != nil && sc.Capabilities != nil && slices.Contains(sc.Capabilities.Add, "SYS_ADMIN")
			}
		}
		if sysAdmin != sysAdminComponents[c.Key] {
			t.Errorf("%s: the asset adds CAP_SYS_ADMIN: %v; sysAdminComponents says %v", c.Key, sysAdmin, sysAdminComponents[c.Key])
		}
	}
}
