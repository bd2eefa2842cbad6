package gpustack

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	nvidiav1alpha1 "github.com/gpufleet/gpufleet/api/nvidia/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
)

var oneFlavour = Facts{Namespace: "gpu-operator", OSFlavours: []OSFlavour{{"ubuntu", "22.04"}}, Runtimes: []string{"containerd"}}

// renderedImages are the main images of the rendered DaemonSets by component.
func renderedImages(objs []client.Object) map[string]string {
	out := map[string]string{}
	for _, o := range objs {
		if ds, ok := o.(*appsv1.DaemonSet); ok {
			out[ds.Labels[LabelComponent]] = ds.Spec.Template.Spec.Containers[0].Image
		}
	}
	return out
}

// previousStack is the GPU Operator's converged stack for the policy's
// images (its DaemonSets).
func previousStack(t *testing.T, p *nvidiav1.ClusterPolicy, images map[string]string) []appsv1.DaemonSet {
	t.Helper()
	s := devcluster.GPUOperatorStack{Namespace: "gpu-operator", Images: images, ChartVersion: "v26.7.0",
		Owner: *metav1.NewControllerRef(p, nvidiav1.GroupVersion.WithKind("ClusterPolicy"))}
	var out []appsv1.DaemonSet
	for _, o := range s.Objects() {
		if ds, ok := o.(*appsv1.DaemonSet); ok {
			out = append(out, *ds)
		}
	}
	return out
}

func render(t *testing.T, p *nvidiav1.ClusterPolicy, f Facts) []client.Object {
	t.Helper()
	objs, err := Render(p, f, Assets)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func daemonSetNames(objs []client.Object) map[string]string {
	out := map[string]string{}
	for _, o := range objs {
		if ds, ok := o.(*appsv1.DaemonSet); ok {
			out[ds.Labels[LabelComponent]+"/"+ds.Labels[LabelFlavour]] = ds.Name
		}
	}
	return out
}

func TestAdoptTheGPUOperatorsStack(t *testing.T) {
	p := v16Policy(t)
	objs := render(t, p, oneFlavour)
	live := previousStack(t, p, renderedImages(objs))
	out, adoptions, blocked := Adopt(objs, live)
	if len(blocked) != 0 {
		t.Fatalf("blocked: %v", blocked)
	}
	want := map[string]string{
		"driver/ubuntu22.04":           "nvidia-driver-daemonset",
		"container-toolkit/containerd": "nvidia-container-toolkit-daemonset",
		"device-plugin/":               "nvidia-device-plugin-daemonset",
		"operator-validator/":          "nvidia-operator-validator",
		"dcgm-exporter/":               "nvidia-dcgm-exporter",
		"gpu-feature-discovery/":       "gpu-feature-discovery",
	}
	got := daemonSetNames(out)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: rendered as %q, want the GPU Operator's %q", k, got[k], v)
		}
	}
	if len(out) != len(objs) {
		t.Errorf("Adopt changed the number of objects: %d, want %d", len(out), len(objs))
	}
	var from []string
	for _, a := range adoptions {
		if a.From != "gpu-operator" {
			t.Errorf("adoption %+v: From %q", a, a.From)
		}
		from = append(from, a.Live)
	}
	if len(adoptions) != len(daemonSetNames(objs)) {
		t.Errorf("adopted %v; want every rendered DaemonSet", from)
	}
	// Every adopted DaemonSet keeps the live selector, and its template
	// carries it.
	byName := map[string]appsv1.DaemonSet{}
	for _, l := range live {
		byName[l.Name] = l
	}
	for _, o := range out {
		ds, ok := o.(*appsv1.DaemonSet)
		if !ok {
			continue
		}
		l := byName[ds.Name]
		if !equality.Semantic.DeepEqual(ds.Spec.Selector, l.Spec.Selector) {
			t.Errorf("%s: selector %v, want the live %v", ds.Name, ds.Spec.Selector, l.Spec.Selector)
		}
		for k, v := range l.Spec.Selector.MatchLabels {
			if ds.Spec.Template.Labels[k] != v {
				t.Errorf("%s: template label %s=%q does not match the selector's %q", ds.Name, k, ds.Spec.Template.Labels[k], v)
			}
		}
		if ds.Annotations[AnnotationAdoptedFrom] != "gpu-operator" {
			t.Errorf("%s: annotations %v", ds.Name, ds.Annotations)
		}
	}
}

// takenOver applies takeOver and returns the DaemonSet as the API server
// would then hold it (labels and annotations merged as apply does).
func takenOver(want, have *appsv1.DaemonSet) *appsv1.DaemonSet {
	w := takeOver(want, have)
	out := w.DeepCopy()
	labels := maps.Clone(have.Labels)
	maps.Copy(labels, w.Labels)
	out.Labels = labels
	out.Annotations = mergedAnnotations(w, have)
	return out
}

func TestTakeOverKeepsARunningTemplateUntilThePolicyChanges(t *testing.T) {
	p := v16Policy(t)
	objs := render(t, p, oneFlavour)
	live := previousStack(t, p, renderedImages(objs))
	out, _, _ := Adopt(objs, live)
	byName := map[string]*appsv1.DaemonSet{}
	for i := range live {
		byName[live[i].Name] = &live[i]
	}
	adopted := map[string]*appsv1.DaemonSet{}
	for _, o := range out {
		ds, ok := o.(*appsv1.DaemonSet)
		if !ok {
			continue
		}
		have := byName[ds.Name]
		got := takenOver(ds, have)
		if diff := cmp.Diff(have.Spec.Template, got.Spec.Template); diff != "" {
			t.Errorf("%s: the pod template changes on adoption (its pods would restart):\n%s", ds.Name, diff)
		}
		if got.Annotations[AnnotationAcceptedTemplate] == "" || got.Annotations[AnnotationPreviousHash] != "" {
			t.Errorf("%s: annotations after adoption %v", ds.Name, got.Annotations)
		}
		if upToDate(takeOver(ds, have), have) {
			t.Errorf("%s: the GPU Operator's DaemonSet counts as up to date: it would never be adopted", ds.Name)
		}
		if !upToDate(takeOver(ds, got), got) {
			t.Errorf("%s: not up to date after adoption: every pass would write it", ds.Name)
		}
		adopted[ds.Labels[LabelComponent]] = got
	}
	if s := adopted[Driver].Spec.UpdateStrategy.Type; s != appsv1.OnDeleteDaemonSetStrategyType {
		t.Errorf("adopted driver DaemonSet's update strategy %s, want OnDelete", s)
	}

	// A new device plugin version: the template is the rendered one (a
	// roll the policy asks for), still with the live selector.
	p.Spec.DevicePlugin.Version = "v9.9.9"
	objs2, _, _ := Adopt(render(t, p, oneFlavour), adoptedList(adopted))
	for _, o := range objs2 {
		ds, ok := o.(*appsv1.DaemonSet)
		if !ok {
			continue
		}
		have := adopted[ds.Labels[LabelComponent]]
		if have == nil || have.Name != ds.Name {
			t.Fatalf("%s: not mapped onto the adopted DaemonSet once it is gpufleet's", ds.Name)
		}
		got := takenOver(ds, have)
		changed := !equality.Semantic.DeepEqual(have.Spec.Template, got.Spec.Template)
		if changed != (ds.Labels[LabelComponent] == DevicePlugin) {
			t.Errorf("%s: template changed %v; only the device plugin's should", ds.Name, changed)
		}
		if ds.Labels[LabelComponent] == DevicePlugin {
			if img := got.Spec.Template.Spec.Containers[0].Image; !strings.HasSuffix(img, ":v9.9.9") {
				t.Errorf("device plugin image %s", img)
			}
			if _, ok := got.Annotations[AnnotationAcceptedTemplate]; ok {
				t.Errorf("the accepted template annotation stays after the template was replaced")
			}
			if !equality.Semantic.DeepEqual(got.Spec.Selector, have.Spec.Selector) {
				t.Errorf("selector changed: %v", got.Spec.Selector)
			}
		}
	}
}

func adoptedList(m map[string]*appsv1.DaemonSet) []appsv1.DaemonSet {
	var out []appsv1.DaemonSet
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, *m[k])
	}
	return out
}

func TestTakeOverADifferentImageReplacesTheTemplate(t *testing.T) {
	p := v16Policy(t)
	objs := render(t, p, oneFlavour)
	images := renderedImages(objs)
	images[Driver] = "nvcr.io/nvidia/driver:550.0-ubuntu22.04" // the GPU Operator ran an older driver
	live := previousStack(t, p, images)
	out, _, _ := Adopt(objs, live)
	for _, o := range out {
		ds, ok := o.(*appsv1.DaemonSet)
		if !ok || ds.Labels[LabelComponent] != Driver {
			continue
		}
		have := &live[slices.IndexFunc(live, func(l appsv1.DaemonSet) bool { return l.Name == ds.Name })]
		got := takenOver(ds, have)
		if got.Spec.Template.Spec.Containers[0].Image != images[Driver] && got.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
			t.Fatalf("the driver's new template must come with OnDelete (replaced through NodeMaintenance only): %s", got.Spec.UpdateStrategy.Type)
		}
		if got.Spec.Template.Spec.Containers[0].Image == images[Driver] {
			t.Errorf("the old driver's template was kept although the policy asks for another version")
		}
		return
	}
	t.Fatal("no driver DaemonSet rendered")
}

func TestAdoptEdgeCases(t *testing.T) {
	p := v16Policy(t)
	twoOS := Facts{Namespace: "gpu-operator", OSFlavours: []OSFlavour{{"ubuntu", "22.04"}, {"ubuntu", "20.04"}}, Runtimes: []string{"containerd"}}
	cases := map[string]struct {
		facts       Facts
		live        func([]appsv1.DaemonSet) []appsv1.DaemonSet
		wantBlocked []string // components
		wantNames   map[string]string
		wantMissing []string // component/flavour not rendered
	}{
		"empty cluster: gpufleet's names": {
			facts:     oneFlavour,
			live:      func([]appsv1.DaemonSet) []appsv1.DaemonSet { return nil },
			wantNames: map[string]string{"driver/ubuntu22.04": "nvidia-driver-daemonset-ubuntu22.04", "container-toolkit/containerd": "nvidia-container-toolkit-daemonset-containerd"},
		},
		"two OS flavours and one GPU Operator driver: blocked, never a second driver": {
			facts:       twoOS,
			live:        func(l []appsv1.DaemonSet) []appsv1.DaemonSet { return l },
			wantBlocked: []string{Driver},
			wantMissing: []string{"driver/ubuntu22.04", "driver/ubuntu20.04"},
			wantNames:   map[string]string{"device-plugin/": "nvidia-device-plugin-daemonset"},
		},
		"precompiled drivers (one per kernel): blocked": {
			facts: oneFlavour,
			live: func(l []appsv1.DaemonSet) []appsv1.DaemonSet {
				var out []appsv1.DaemonSet
				for _, ds := range l {
					if ds.Name == "nvidia-driver-daemonset" {
						for _, k := range []string{"5.15.0-69-generic-ubuntu22.04", "5.15.0-70-generic-ubuntu22.04"} {
							c := ds.DeepCopy()
							c.Name = "nvidia-driver-daemonset-" + k
							out = append(out, *c)
						}
						continue
					}
					out = append(out, ds)
				}
				return out
			},
			wantBlocked: []string{Driver},
			wantMissing: []string{"driver/ubuntu22.04"},
		},
		"a deleted DaemonSet is not adopted": {
			facts: oneFlavour,
			live: func(l []appsv1.DaemonSet) []appsv1.DaemonSet {
				for i := range l {
					l[i].DeletionTimestamp = &metav1.Time{}
				}
				return l
			},
			wantNames: map[string]string{"driver/ubuntu22.04": "nvidia-driver-daemonset-ubuntu22.04"},
		},
		"another workload's DaemonSet is left alone": {
			facts: oneFlavour,
			live: func([]appsv1.DaemonSet) []appsv1.DaemonSet {
				return []appsv1.DaemonSet{{ObjectMeta: metav1.ObjectMeta{Name: "node-exporter", Labels: map[string]string{"app": "node-exporter"}}}}
			},
			wantNames: map[string]string{"device-plugin/": "nvidia-device-plugin-daemonset"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			objs := render(t, p, tc.facts)
			live := tc.live(previousStack(t, p, renderedImages(objs)))
			out, _, blocked := Adopt(objs, live)
			var gotBlocked []string
			for _, b := range blocked {
				gotBlocked = append(gotBlocked, b.Component)
				if !strings.Contains(b.String(), b.Live[0]) {
					t.Errorf("message does not name the DaemonSet: %s", b)
				}
			}
			if diff := cmp.Diff(tc.wantBlocked, gotBlocked); diff != "" {
				t.Errorf("blocked (-want +got):\n%s", diff)
			}
			names := daemonSetNames(out)
			for k, v := range tc.wantNames {
				if names[k] != v {
					t.Errorf("%s rendered as %q, want %q", k, names[k], v)
				}
			}
			for _, k := range tc.wantMissing {
				if n, ok := names[k]; ok {
					t.Errorf("%s rendered as %s although blocked", k, n)
				}
			}
		})
	}
}

func TestAdoptNVIDIADriverMode(t *testing.T) {
	policy := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "u"}}
	policy.Spec.Driver.UseNvidiaDriverCRD = ptr.To(true)
	d, h := nvDriver("default", true, nil), nvDriver("h100", false, map[string]string{"pool": "h100"})
	v := nvDriver("vgpu", false, map[string]string{"pool": "v"})
	v.Spec.DriverType = nvidiav1alpha1.DriverTypeVGPU
	facts := Facts{Namespace: "gpu-operator", OSFlavours: []OSFlavour{{"ubuntu", "22.04"}, {"rhel", "9.4"}}, Runtimes: []string{"containerd"},
		Drivers: []nvidiav1alpha1.NVIDIADriver{d, h, v}}
	objs := render(t, policy, facts)
	// The GPU Operator's: one per NVIDIADriver and OS, plus the vGPU one.
	theirs := func(driver, osID, osVersion, hash string) appsv1.DaemonSet {
		name := "nvidia-gpu-driver-" + osID + osVersion + "-" + hash
		return appsv1.DaemonSet{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "gpu-operator",
				Labels:          map[string]string{"app.kubernetes.io/component": "nvidia-driver", "app.kubernetes.io/managed-by": "gpu-operator"},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "nvidia.com/v1alpha1", Kind: "NVIDIADriver", Name: driver, UID: "d-" + types.UID(driver), Controller: ptr.To(true)}}},
			Spec: appsv1.DaemonSetSpec{
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name, "app.kubernetes.io/component": "nvidia-driver"}},
					Spec: corev1.PodSpec{NodeSelector: map[string]string{"nvidia.com/gpu.deploy.driver": "true", labelOSID: osID, labelOSVersion: osVersion},
						Containers: []corev1.Container{{Name: "nvidia-driver-ctr", Image: "nvcr.io/nvidia/driver:570.1-" + osID + osVersion}}}},
			},
		}
	}
	all := []appsv1.DaemonSet{
		theirs("default", "ubuntu", "22.04", "6b8f7d9c4"), theirs("default", "rhel", "9.4", "5c7d8e9f1"),
		theirs("h100", "ubuntu", "22.04", "7d9c4b8f6"), theirs("h100", "rhel", "9.4", "8e9f15c7d"),
		theirs("vgpu", "ubuntu", "22.04", "9f15c7d8e"),
	}
	t.Run("every NVIDIADriver and OS taken over", func(t *testing.T) {
		out, adoptions, blocked := Adopt(objs, all)
		if len(blocked) != 0 {
			t.Fatalf("blocked: %v", blocked)
		}
		got := map[string]string{}
		for _, a := range adoptions {
			if a.Component == Driver {
				got[a.Rendered] = a.Live
			}
		}
		want := map[string]string{
			"nvidia-driver-daemonset-default-ubuntu22.04": "nvidia-gpu-driver-ubuntu22.04-6b8f7d9c4",
			"nvidia-driver-daemonset-default-rhel9.4":     "nvidia-gpu-driver-rhel9.4-5c7d8e9f1",
			"nvidia-driver-daemonset-h100-ubuntu22.04":    "nvidia-gpu-driver-ubuntu22.04-7d9c4b8f6",
			"nvidia-driver-daemonset-h100-rhel9.4":        "nvidia-gpu-driver-rhel9.4-8e9f15c7d",
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("adoptions (-want +got):\n%s", diff)
		}
		for _, o := range out {
			if ds, ok := o.(*appsv1.DaemonSet); ok && ds.Labels[LabelComponent] == Driver && !strings.HasPrefix(ds.Name, "nvidia-gpu-driver-") {
				t.Errorf("a second driver DaemonSet %s beside the GPU Operator's", ds.Name)
			}
		}
	})
	t.Run("one of theirs matches none of ours: blocked", func(t *testing.T) {
		odd := theirs("h100", "ubuntu", "20.04", "1a2b3c4d5") // an OS gpufleet found no node of
		if _, _, blocked := Adopt(objs, append(slices.Clone(all), odd)); len(blocked) != 1 || blocked[0].Component != Driver {
			t.Errorf("blocked %v, want the driver", blocked)
		}
	})
	t.Run("precompiled (per kernel): blocked", func(t *testing.T) {
		pre := slices.Clone(all)
		pre[0] = *pre[0].DeepCopy()
		pre[0].Spec.Template.Spec.NodeSelector[labelKernel] = "5.15.0-69-generic"
		if _, _, blocked := Adopt(objs, pre); len(blocked) != 1 || blocked[0].Component != Driver {
			t.Errorf("blocked %v, want the driver", blocked)
		}
	})
}
