package gpucluster_test

import (
	"os"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	nvidiav1alpha1 "github.com/gpufleet/gpufleet/api/nvidia/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/gpucluster"
)

func load(t testing.TB, file string) *nvidiav1alpha1.GPUCluster {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	gc := &nvidiav1alpha1.GPUCluster{}
	if err := yaml.UnmarshalStrict(data, gc); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	gc.UID = "uid-1"
	return gc
}

func find[T client.Object](objs []client.Object, name string) T {
	var zero T
	for _, o := range objs {
		if t, ok := o.(T); ok && o.GetName() == name {
			return t
		}
	}
	return zero
}

func env(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return "<unset>"
}

func TestRenderChartDefault(t *testing.T) {
	gc := load(t, "testdata/gpucluster-chart-default.yaml")
	objs, err := gpucluster.Render(gc, "gpu-operator")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"ServiceAccount/nvidia-dra-driver-kubeletplugin", "ClusterRole/nvidia-dra-driver-kubeletplugin", "ClusterRoleBinding/nvidia-dra-driver-kubeletplugin",
		"DeviceClass/compute-domain-daemon.nvidia.com", "DeviceClass/compute-domain-default-channel.nvidia.com",
		"DeviceClass/gpu.nvidia.com", "DeviceClass/mig.nvidia.com", "DeviceClass/vfio.gpu.nvidia.com",
		"DaemonSet/nvidia-dra-driver-kubelet-plugin",
		"ServiceAccount/nvidia-dra-driver-controller", "ClusterRole/nvidia-dra-driver-controller", "ClusterRoleBinding/nvidia-dra-driver-controller",
		"Role/nvidia-dra-driver-controller", "RoleBinding/nvidia-dra-driver-controller", "Deployment/nvidia-dra-driver-controller",
		"ServiceAccount/nvidia-dcgm-exporter-dra", "ResourceClaimTemplate/nvidia-dcgm-exporter-admin", "DaemonSet/nvidia-dcgm-exporter-dra", "Service/nvidia-dcgm-exporter-dra",
	}
	if got := kinds(objs); !slices.Equal(got, want) {
		t.Errorf("objects:\n got %v\nwant %v", got, want)
	}
	ds := find[*appsv1.DaemonSet](objs, gpucluster.KubeletPlugin)
	ps := ds.Spec.Template.Spec
	if ds.Spec.Selector.MatchLabels["app"] != gpucluster.KubeletPlugin || ds.Spec.Template.Labels["app"] != gpucluster.KubeletPlugin {
		t.Errorf("selector %v, template labels %v: want app=%s (NVIDIA's)", ds.Spec.Selector, ds.Spec.Template.Labels, gpucluster.KubeletPlugin)
	}
	if ps.NodeSelector[gpucluster.DeployDRADriver] != "true" || ps.PriorityClassName != "system-node-critical" || len(ps.Tolerations) != 1 {
		t.Errorf("scheduling: %v %q %v", ps.NodeSelector, ps.PriorityClassName, ps.Tolerations)
	}
	if len(ps.Containers) != 2 || ps.Containers[0].Image != "nvcr.io/nvidia/dra-driver-nvidia-gpu:v0.5.0" || ps.Containers[1].Name != "compute-domains" {
		t.Errorf("containers: %+v", ps.Containers)
	}
	if len(ps.InitContainers) != 1 || ps.InitContainers[0].Name != "driver-validation" || env(ps.InitContainers[0], "DRIVER_INSTALL_DIR") != "/run/nvidia/driver" {
		t.Errorf("the kubelet plugin must wait for the host's driver: %+v", ps.InitContainers)
	}
	if p := ps.Containers[0].LivenessProbe; p == nil || p.GRPC == nil || p.GRPC.Port != 51516 || env(ps.Containers[1], "HEALTHCHECK_PORT") != "51515" {
		t.Errorf("health checks: %+v %v", p, ps.Containers[1].Env)
	}
	if ds.OwnerReferences[0].Kind != "GPUCluster" || !*ds.OwnerReferences[0].Controller {
		t.Errorf("owner: %+v", ds.OwnerReferences)
	}
	if dc := find[*resourcev1.DeviceClass](objs, "gpu.nvidia.com"); len(dc.OwnerReferences) != 0 {
		t.Errorf("a DeviceClass must outlive the GPUCluster (claims refer to it): %+v", dc.OwnerReferences)
	}
	exp := find[*appsv1.DaemonSet](objs, gpucluster.DCGMExporter)
	eps := exp.Spec.Template.Spec
	if eps.NodeSelector[gpucluster.DeployDCGMExporter] != "true" || len(eps.ResourceClaims) != 1 || *eps.ResourceClaims[0].ResourceClaimTemplateName != "nvidia-dcgm-exporter-admin" ||
		eps.Containers[0].Image != "nvcr.io/nvidia/k8s/dcgm-exporter:4.6.0-4.8.3-distroless" {
		t.Errorf("exporter: %+v", eps)
	}
	rct := find[*resourcev1.ResourceClaimTemplate](objs, "nvidia-dcgm-exporter-admin")
	if r := rct.Spec.Spec.Devices.Requests[0].Exactly; r == nil || !*r.AdminAccess || r.AllocationMode != resourcev1.DeviceAllocationModeAll || r.DeviceClassName != "gpu.nvidia.com" {
		t.Errorf("the exporter's claim: every GPU of the node with admin access: %+v", r)
	}
	if got := gpucluster.Ignored(gc); !slices.Equal(got, []string{"dcgmExporter.serviceMonitor"}) {
		t.Errorf("ignored: %v", got)
	}
}

func kinds(objs []client.Object) []string {
	var out []string
	for _, o := range objs {
		out = append(out, gpucluster.Kind(o)+"/"+o.GetName())
	}
	return out
}

func TestRenderOptions(t *testing.T) {
	gc := load(t, "testdata/gpucluster-common-options.yaml")
	objs, err := gpucluster.Render(gc, "gpu-operator")
	if err != nil {
		t.Fatal(err)
	}
	ds := find[*appsv1.DaemonSet](objs, gpucluster.KubeletPlugin)
	gpus, cds := ds.Spec.Template.Spec.Containers[0], ds.Spec.Template.Spec.Containers[1]
	for _, c := range []struct{ got, want string }{
		{gpus.Image, "registry.example.com/nvidia/dra-driver-nvidia-gpu:v0.5.0"},
		{string(gpus.ImagePullPolicy), "Always"},
		{env(gpus, "FEATURE_GATES"), "MPSSupport=true,NVMLDeviceHealthCheck=true"},
		{env(gpus, "LOG_VERBOSITY"), "6"},
		{env(gpus, "HEALTHCHECK_PORT"), "52000"},
		{env(cds, "HEALTHCHECK_PORT"), "<unset>"},
		{env(gpus, "KUBELET_PLUGINS_DIRECTORY_PATH"), "/var/lib/k0s/kubelet/plugins"},
		{gpus.Resources.Requests.Cpu().String(), "100m"},
		{ds.Spec.Template.Spec.ImagePullSecrets[0].Name, "regcred"},
		{ds.Labels["team"], "ml-platform"},
		{ds.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable.String(), "10%"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	if cds.LivenessProbe != nil {
		t.Errorf("healthcheck disabled, probe rendered: %+v", cds.LivenessProbe)
	}
	ctl := find[*appsv1.Deployment](objs, gpucluster.Controller)
	if c := ctl.Spec.Template.Spec.Containers[0]; env(c, "LOG_VERBOSITY") != "4" || c.Resources.Limits.Memory().String() != "256Mi" {
		t.Errorf("controller: %+v", c)
	}
	dcgm := find[*appsv1.DaemonSet](objs, gpucluster.DCGM)
	if dcgm == nil || !dcgm.Spec.Template.Spec.HostNetwork || !slices.Equal(dcgm.Spec.Template.Spec.Containers[0].Args, []string{"--log-level", "3"}) {
		t.Fatalf("dcgm: %+v", dcgm)
	}
	exp := find[*appsv1.DaemonSet](objs, gpucluster.DCGMExporter)
	ec := exp.Spec.Template.Spec.Containers[0]
	if env(ec, "DCGM_REMOTE_HOSTENGINE_INFO") != "nvidia-dcgm-dra:5555" || !exp.Spec.Template.Spec.HostPID ||
		env(ec, "DCGM_EXPORTER_COLLECTORS") == "<unset>" || exp.Spec.Template.Annotations["prometheus.io/scrape"] != "true" ||
		ec.Image != "nvcr.io/nvidia/k8s/dcgm-exporter:4.6.0-4.8.3-distroless" {
		t.Errorf("exporter: %+v %v", ec, exp.Spec.Template.Annotations)
	}
}

func TestRenderSwitches(t *testing.T) {
	for _, tc := range []struct {
		name      string
		edit      func(*nvidiav1alpha1.GPUCluster)
		has, hasN []string
		err       string
	}{
		{name: "compute domains off", edit: func(gc *nvidiav1alpha1.GPUCluster) { gc.Spec.DRADriver.ComputeDomains.Enabled = ptr.To(false) },
			hasN: []string{"Deployment/nvidia-dra-driver-controller", "DeviceClass/compute-domain-daemon.nvidia.com"}, has: []string{"DeviceClass/gpu.nvidia.com"}},
		{name: "compute domains unset (no API default: off)", edit: func(gc *nvidiav1alpha1.GPUCluster) { gc.Spec.DRADriver.ComputeDomains.Enabled = nil },
			hasN: []string{"Deployment/nvidia-dra-driver-controller"}},
		{name: "exporter off", edit: func(gc *nvidiav1alpha1.GPUCluster) { gc.Spec.DCGMExporter.Enabled = ptr.To(false) },
			hasN: []string{"DaemonSet/nvidia-dcgm-exporter-dra", "ResourceClaimTemplate/nvidia-dcgm-exporter-admin"}},
		{name: "exporter unset: on", edit: func(gc *nvidiav1alpha1.GPUCluster) { gc.Spec.DCGMExporter = nil },
			has: []string{"DaemonSet/nvidia-dcgm-exporter-dra"}},
		{name: "dcgm on", edit: func(gc *nvidiav1alpha1.GPUCluster) { gc.Spec.DCGM.Enabled = ptr.To(true) },
			has: []string{"DaemonSet/nvidia-dcgm-dra", "Service/nvidia-dcgm-dra", "ResourceClaimTemplate/nvidia-dcgm-admin"}},
		{name: "digest", edit: func(gc *nvidiav1alpha1.GPUCluster) { gc.Spec.DRADriver.Version = "sha256:abc" }},
		{name: "bad version", edit: func(gc *nvidiav1alpha1.GPUCluster) { gc.Spec.DRADriver.Version = "v1 /x" }, err: "draDriver"},
		{name: "bad exporter image", edit: func(gc *nvidiav1alpha1.GPUCluster) { gc.Spec.DCGMExporter.Image = "a:b" }, err: "dcgmExporter"},
		{name: "OnDelete", edit: func(gc *nvidiav1alpha1.GPUCluster) { gc.Spec.Daemonsets.UpdateStrategy = "OnDelete" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gc := load(t, "testdata/gpucluster-chart-default.yaml")
			tc.edit(gc)
			objs, err := gpucluster.Render(gc, "ns")
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := kinds(objs)
			for _, h := range tc.has {
				if !slices.Contains(got, h) {
					t.Errorf("missing %s: %v", h, got)
				}
			}
			for _, h := range tc.hasN {
				if slices.Contains(got, h) {
					t.Errorf("unexpected %s", h)
				}
			}
			if gc.Spec.DRADriver.Version == "sha256:abc" {
				if img := find[*appsv1.DaemonSet](objs, gpucluster.KubeletPlugin).Spec.Template.Spec.Containers[0].Image; img != "nvcr.io/nvidia/dra-driver-nvidia-gpu@sha256:abc" {
					t.Errorf("digest image %s", img)
				}
			}
			if gc.Spec.Daemonsets.UpdateStrategy == "OnDelete" {
				if s := find[*appsv1.DaemonSet](objs, gpucluster.KubeletPlugin).Spec.UpdateStrategy; s.Type != appsv1.OnDeleteDaemonSetStrategyType || s.RollingUpdate != nil {
					t.Errorf("strategy %+v", s)
				}
			}
		})
	}
}

// Rendering never panics and is deterministic, whatever the spec.
func FuzzRender(f *testing.F) {
	f.Add("nvcr.io/nvidia", "dra-driver-nvidia-gpu", "v0.5.0", true, false, "1", "gate")
	f.Add("", "", "", false, true, "", "")
	f.Fuzz(func(t *testing.T, repo, image, version string, cd, dcgm bool, maxUnavailable, gate string) {
		gc := &nvidiav1alpha1.GPUCluster{ObjectMeta: metav1.ObjectMeta{Name: "gpu-cluster", UID: "u"}}
		gc.Spec.DRADriver = nvidiav1alpha1.DRADriverSpec{Repository: repo, Image: image, Version: version,
			FeatureGates: map[string]bool{gate: true, "B": false}, ComputeDomains: nvidiav1alpha1.DRADriverComputeDomainsSpec{Enabled: &cd}}
		gc.Spec.DCGM = &nvidiav1.DCGMSpec{ComponentSpec: nvidiav1.ComponentSpec{Enabled: &dcgm, Version: version}}
		gc.Spec.Daemonsets.RollingUpdate = &nvidiav1.RollingUpdateSpec{MaxUnavailable: maxUnavailable}
		a, errA := gpucluster.Render(gc, "ns")
		b, errB := gpucluster.Render(gc, "ns")
		if (errA == nil) != (errB == nil) || len(a) != len(b) {
			t.Fatalf("not deterministic: %v %v", errA, errB)
		}
		for i := range a {
			if !gpucluster.UpToDate(a[i], b[i]) {
				t.Fatalf("%s differs between two renderings", a[i].GetName())
			}
		}
		if ds, ok := find[*appsv1.DaemonSet](a, gpucluster.KubeletPlugin), errA == nil; ok && gpucluster.TemplateHash(&ds.Spec.Template) != gpucluster.TemplateHash(&find[*appsv1.DaemonSet](b, gpucluster.KubeletPlugin).Spec.Template) {
			t.Fatal("template hash not deterministic")
		}
	})
}

// Taking over another operator's workload keeps its pod template (no pod
// restarts) while it runs the rendered images; the selector is always the
// live one. The same for the kubelet plugin's DaemonSet and the
// controller's Deployment.
func TestKeepsLiveTemplate(t *testing.T) {
	objs, err := gpucluster.Render(load(t, "testdata/gpucluster-chart-default.yaml"), "ns")
	if err != nil {
		t.Fatal(err)
	}
	theirs := func(o client.Object, image string) client.Object {
		o = o.DeepCopyObject().(client.Object)
		o.SetLabels(map[string]string{"app": o.GetName(), "app.kubernetes.io/managed-by": "gpu-operator"})
		var tpl *corev1.PodTemplateSpec
		switch w := o.(type) {
		case *appsv1.DaemonSet:
			tpl = &w.Spec.Template
		case *appsv1.Deployment:
			tpl = &w.Spec.Template
		}
		tpl.Labels = map[string]string{"app": o.GetName()}
		tpl.Spec.Containers[0].Args = append(tpl.Spec.Containers[0].Args, "--v=4") // not an image: kept
		if image != "" {
			tpl.Spec.Containers[0].Image = image
		}
		return o
	}
	for _, name := range []string{gpucluster.KubeletPlugin, gpucluster.Controller} {
		var want client.Object
		for _, o := range objs {
			if o.GetName() == name && (gpucluster.Kind(o) == "DaemonSet" || gpucluster.Kind(o) == "Deployment") {
				want = o
			}
		}
		if want == nil {
			t.Fatalf("%s not rendered", name)
		}
		if !gpucluster.KeepsLiveTemplate(want, theirs(want, "")) {
			t.Errorf("%s: the GPU Operator's template with the same images is not kept", name)
		}
		if gpucluster.KeepsLiveTemplate(want, theirs(want, "nvcr.io/nvidia/dra-driver-nvidia-gpu:v0.4.0")) {
			t.Errorf("%s: a template with another image is kept", name)
		}
		ours := want.DeepCopyObject().(client.Object)
		if gpucluster.KeepsLiveTemplate(want, ours) {
			t.Errorf("%s: gpufleet's own template without an accepted rendering counts as kept", name)
		}
	}
}
