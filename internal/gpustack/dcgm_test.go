package gpustack

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
)

// rendered is what the dcgm tests look at in a rendered policy.
type rendered struct {
	exporterEnv     map[string]string // dcgm-exporter's env of interest
	hostPID         bool
	annotations     map[string]string // dcgm-exporter's pod annotations
	serviceType     corev1.ServiceType
	trafficPolicy   string
	podReader       []string // dcgm-exporter's pod-reader RBAC objects
	dcgmPorts       []corev1.ContainerPort
	dcgmCommand     []string
	dcgmServiceSeen bool
}

func renderDCGM(t *testing.T, set func(*nvidiav1.ClusterPolicySpec)) rendered {
	t.Helper()
	p := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "u"}}
	set(&p.Spec)
	objs, err := Render(p, oneNodeKind, Assets)
	if err != nil {
		t.Fatal(err)
	}
	var out rendered
	for _, o := range objs {
		switch o := o.(type) {
		case *appsv1.DaemonSet:
			ps := o.Spec.Template.Spec
			switch o.Name {
			case "nvidia-dcgm-exporter":
				out.exporterEnv = map[string]string{}
				for _, e := range ps.Containers[0].Env {
					switch e.Name {
					case EnvDCGMExporterPodLabels, EnvDCGMExporterPodUID, EnvDCGMExporterPodLabelAllowlist, EnvDCGMRemoteHostEngine:
						out.exporterEnv[e.Name] = e.Value
					}
				}
				out.hostPID, out.annotations = ps.HostPID, o.Spec.Template.Annotations
			case "nvidia-dcgm":
				out.dcgmPorts, out.dcgmCommand = ps.Containers[0].Ports, ps.Containers[0].Command
			}
		case *corev1.Service:
			switch o.Name {
			case "nvidia-dcgm-exporter":
				out.serviceType = o.Spec.Type
				if o.Spec.InternalTrafficPolicy != nil {
					out.trafficPolicy = string(*o.Spec.InternalTrafficPolicy)
				}
			case dcgmService:
				out.dcgmServiceSeen = true
			}
		case *rbacv1.ClusterRole:
			if o.Name == dcgmExporterPodReader {
				out.podReader = append(out.podReader, "ClusterRole")
			}
		case *rbacv1.ClusterRoleBinding:
			if o.Name == dcgmExporterPodReader {
				out.podReader = append(out.podReader, "ClusterRoleBinding/"+o.Subjects[0].Namespace+"/"+o.Subjects[0].Name)
			}
		}
	}
	return out
}

// dcgmExporter's pod attribution, hostPID, annotations and Service as
// gpu-operator's TransformDCGMExporter / TransformDCGMExporterService.
func TestDCGMExporterSettings(t *testing.T) {
	local := corev1.ServiceInternalTrafficPolicyLocal
	tests := map[string]struct {
		spec            func(*nvidiav1.ClusterPolicySpec)
		wantEnv         map[string]string
		wantHostPID     bool
		wantAnnotations map[string]string
		wantType        corev1.ServiceType
		wantTraffic     string
		wantPodReader   []string
	}{
		"defaults: no pod metadata, no API access, ClusterIP": {
			spec:     func(*nvidiav1.ClusterPolicySpec) {},
			wantEnv:  map[string]string{},
			wantType: corev1.ServiceTypeClusterIP,
		},
		"pod labels with an allowlist": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.DCGMExporter.EnablePodLabels = ptr.To(true)
				s.DCGMExporter.PodLabelAllowlistRegex = []string{"^app$", "^team-.*"}
			},
			wantEnv:       map[string]string{EnvDCGMExporterPodLabels: "true", EnvDCGMExporterPodLabelAllowlist: "^app$,^team-.*"},
			wantType:      corev1.ServiceTypeClusterIP,
			wantPodReader: []string{"ClusterRole", "ClusterRoleBinding/ns/nvidia-dcgm-exporter"},
		},
		"pod UID": {
			spec:          func(s *nvidiav1.ClusterPolicySpec) { s.DCGMExporter.EnablePodUID = ptr.To(true) },
			wantEnv:       map[string]string{EnvDCGMExporterPodUID: "true"},
			wantType:      corev1.ServiceTypeClusterIP,
			wantPodReader: []string{"ClusterRole", "ClusterRoleBinding/ns/nvidia-dcgm-exporter"},
		},
		"pod labels turned off explicitly": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.DCGMExporter.EnablePodLabels, s.DCGMExporter.EnablePodUID = ptr.To(false), ptr.To(false)
			},
			wantEnv:  map[string]string{},
			wantType: corev1.ServiceTypeClusterIP,
		},
		"pod labels turned on through the env: the pod reader too": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.DCGMExporter.Env = []corev1.EnvVar{{Name: EnvDCGMExporterPodLabels, Value: "TRUE"}}
			},
			wantEnv:       map[string]string{EnvDCGMExporterPodLabels: "TRUE"},
			wantType:      corev1.ServiceTypeClusterIP,
			wantPodReader: []string{"ClusterRole", "ClusterRoleBinding/ns/nvidia-dcgm-exporter"},
		},
		"the component's env wins over the fields": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.DCGMExporter.EnablePodLabels = ptr.To(true)
				s.DCGMExporter.Env = []corev1.EnvVar{{Name: EnvDCGMExporterPodLabels, Value: "false"}}
			},
			wantEnv:       map[string]string{EnvDCGMExporterPodLabels: "false"},
			wantType:      corev1.ServiceTypeClusterIP,
			wantPodReader: []string{"ClusterRole", "ClusterRoleBinding/ns/nvidia-dcgm-exporter"},
		},
		"hostPID and pod annotations over daemonsets.annotations": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.DCGMExporter.HostPID = ptr.To(true)
				s.Daemonsets.Annotations = map[string]string{"a": "common", "b": "common"}
				s.DCGMExporter.Annotations = map[string]string{"b": "exporter", "prometheus.io/scrape": "true"}
			},
			wantEnv:         map[string]string{},
			wantHostPID:     true,
			wantAnnotations: map[string]string{"a": "common", "b": "exporter", "prometheus.io/scrape": "true"},
			wantType:        corev1.ServiceTypeClusterIP,
		},
		"service type and internal traffic policy": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.DCGMExporter.Service = &nvidiav1.DCGMExporterServiceSpec{Type: corev1.ServiceTypeNodePort, InternalTrafficPolicy: &local}
			},
			wantEnv:     map[string]string{},
			wantType:    corev1.ServiceTypeNodePort,
			wantTraffic: "Local",
		},
		"an ExternalName service stays ClusterIP (reported)": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.DCGMExporter.Service = &nvidiav1.DCGMExporterServiceSpec{Type: corev1.ServiceTypeExternalName}
			},
			wantEnv:  map[string]string{},
			wantType: corev1.ServiceTypeClusterIP,
		},
		"standalone DCGM: the exporter uses it through its Service": {
			spec:     func(s *nvidiav1.ClusterPolicySpec) { s.DCGM.Enabled = ptr.To(true) },
			wantEnv:  map[string]string{EnvDCGMRemoteHostEngine: "nvidia-dcgm:5555"},
			wantType: corev1.ServiceTypeClusterIP,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := renderDCGM(t, tc.spec)
			if diff := cmp.Diff(tc.wantEnv, got.exporterEnv); diff != "" {
				t.Errorf("env (-want +got):\n%s", diff)
			}
			if got.hostPID != tc.wantHostPID {
				t.Errorf("hostPID = %v, want %v", got.hostPID, tc.wantHostPID)
			}
			if diff := cmp.Diff(tc.wantAnnotations, got.annotations); diff != "" {
				t.Errorf("pod annotations (-want +got):\n%s", diff)
			}
			if got.serviceType != tc.wantType || got.trafficPolicy != tc.wantTraffic {
				t.Errorf("Service type %q internalTrafficPolicy %q, want %q %q", got.serviceType, got.trafficPolicy, tc.wantType, tc.wantTraffic)
			}
			if diff := cmp.Diff(tc.wantPodReader, got.podReader); diff != "" {
				t.Errorf("pod reader RBAC (-want +got):\n%s", diff)
			}
		})
	}
}

// dcgm.hostPort binds the engine's port on the host; with hostNetwork the
// engine listens on that port itself (a hostNetwork pod's hostPort must be
// its containerPort).
func TestDCGMHostPort(t *testing.T) {
	tests := map[string]struct {
		hostPort    int32
		hostNetwork bool
		wantPorts   []corev1.ContainerPort
		wantCommand []string
	}{
		"not set": {
			wantPorts:   []corev1.ContainerPort{{Name: "dcgm", ContainerPort: 5555}},
			wantCommand: []string{"nv-hostengine", "-n", "-b", "ALL"},
		},
		"set": {
			hostPort:    5556,
			wantPorts:   []corev1.ContainerPort{{Name: "dcgm", ContainerPort: 5555, HostPort: 5556}},
			wantCommand: []string{"nv-hostengine", "-n", "-b", "ALL"},
		},
		"set with hostNetwork": {
			hostPort: 5556, hostNetwork: true,
			wantPorts:   []corev1.ContainerPort{{Name: "dcgm", ContainerPort: 5556, HostPort: 5556}},
			wantCommand: []string{"nv-hostengine", "-n", "-b", "ALL", "--port", "5556"},
		},
		"the default port with hostNetwork": {
			hostPort: 5555, hostNetwork: true,
			wantPorts:   []corev1.ContainerPort{{Name: "dcgm", ContainerPort: 5555, HostPort: 5555}},
			wantCommand: []string{"nv-hostengine", "-n", "-b", "ALL"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := renderDCGM(t, func(s *nvidiav1.ClusterPolicySpec) {
				s.DCGM.Enabled, s.DCGM.HostPort, s.DCGM.HostNetwork = ptr.To(true), tc.hostPort, ptr.To(tc.hostNetwork)
			})
			if diff := cmp.Diff(tc.wantPorts, got.dcgmPorts); diff != "" {
				t.Errorf("ports (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantCommand, got.dcgmCommand); diff != "" {
				t.Errorf("command (-want +got):\n%s", diff)
			}
			if !got.dcgmServiceSeen {
				t.Error("no nvidia-dcgm Service rendered")
			}
		})
	}
}

// devicePlugin.mps.root: the device plugin's MPS root and shm volumes and
// MPS_ROOT, as gpu-operator's TransformDevicePlugin.
func TestDevicePluginMPSRoot(t *testing.T) {
	tests := map[string]struct {
		mps                    *nvidiav1.MPSSpec
		wantRoot, wantShm, env string
	}{
		"default":    {wantRoot: "/run/nvidia/mps", wantShm: "/run/nvidia/mps/shm", env: "/run/nvidia/mps"},
		"empty root": {mps: &nvidiav1.MPSSpec{}, wantRoot: "/run/nvidia/mps", wantShm: "/run/nvidia/mps/shm", env: "/run/nvidia/mps"},
		"custom":     {mps: &nvidiav1.MPSSpec{Root: "/var/lib/mps"}, wantRoot: "/var/lib/mps", wantShm: "/var/lib/mps/shm", env: "/var/lib/mps"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "u"}}
			p.Spec.DevicePlugin.MPS = tc.mps
			ds := renderedDaemonSets(t, p, oneNodeKind)["nvidia-device-plugin-daemonset"]
			if ds == nil {
				t.Fatal("no device plugin DaemonSet")
			}
			got := map[string]string{}
			for _, v := range ds.Spec.Template.Spec.Volumes {
				if v.Name == volumeMPSRoot || v.Name == volumeMPSShm {
					got[v.Name] = v.HostPath.Path
				}
			}
			ctr := ds.Spec.Template.Spec.Containers[0]
			for _, e := range ctr.Env {
				if e.Name == "MPS_ROOT" {
					got["MPS_ROOT"] = e.Value
				}
			}
			for _, m := range ctr.VolumeMounts {
				if m.Name == volumeMPSRoot || m.Name == volumeMPSShm {
					got["mount:"+m.Name] = m.MountPath
				}
			}
			want := map[string]string{volumeMPSRoot: tc.wantRoot, volumeMPSShm: tc.wantShm, "MPS_ROOT": tc.env,
				"mount:" + volumeMPSRoot: "/mps", "mount:" + volumeMPSShm: "/dev/shm"}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// The fields of this file that gpufleet reports instead of rendering.
func TestUnsupportedDCGMAndOperatorFields(t *testing.T) {
	tests := map[string]struct {
		spec func(*nvidiav1.ClusterPolicySpec)
		want []string
	}{
		"rendered fields are not reported": {spec: func(s *nvidiav1.ClusterPolicySpec) {
			s.DCGMExporter.HostPID, s.DCGMExporter.EnablePodLabels, s.DCGMExporter.EnablePodUID = ptr.To(true), ptr.To(true), ptr.To(true)
			s.DCGMExporter.Service = &nvidiav1.DCGMExporterServiceSpec{Type: corev1.ServiceTypeLoadBalancer}
			s.DCGM.HostPort = 5555
			s.DevicePlugin.MPS = &nvidiav1.MPSSpec{Root: "/x"}
			s.PSP.Enabled = ptr.To(false)
			s.Operator.InitContainer = &nvidiav1.ImageSpec{}
		}},
		"ExternalName service": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.DCGMExporter.Service = &nvidiav1.DCGMExporterServiceSpec{Type: corev1.ServiceTypeExternalName}
			},
			want: []string{"spec.dcgmExporter.service.type"},
		},
		"PodSecurityPolicies": {
			spec: func(s *nvidiav1.ClusterPolicySpec) { s.PSP.Enabled = ptr.To(true) },
			want: []string{"spec.psp.enabled"},
		},
		"the operator's own pod labels and annotations, the deprecated init container": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.Operator.Labels = map[string]string{"a": "b"}
				s.Operator.Annotations = map[string]string{"a": "b"}
				s.Operator.InitContainer = &nvidiav1.ImageSpec{Image: "cuda", Version: "12.4"}
			},
			want: []string{"spec.operator.labels", "spec.operator.annotations", "spec.operator.initContainer"},
		},
		"a ServiceMonitor for the operator's own metrics (off: not reported)": {
			spec: func(s *nvidiav1.ClusterPolicySpec) {
				s.Operator.Metrics = &nvidiav1.OperatorMetricsSpec{ServiceMonitor: &nvidiav1.ServiceMonitorSpec{Enabled: ptr.To(true)}}
				s.DCGMExporter.ServiceMonitor = &nvidiav1.ServiceMonitorSpec{Enabled: ptr.To(false)}
			},
			want: []string{"spec.operator.metrics.serviceMonitor.enabled"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var s nvidiav1.ClusterPolicySpec
			tc.spec(&s)
			var got []string
			for _, f := range UnsupportedFields(&s) {
				got = append(got, f.Path)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
