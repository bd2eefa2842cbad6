package gpustack

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	nvidiav1alpha1 "github.com/gpufleet/gpufleet/api/nvidia/v1alpha1"
)

func nvDriver(name string, def bool, sel map[string]string) nvidiav1alpha1.NVIDIADriver {
	return nvidiav1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: nvidiav1alpha1.NVIDIADriverSpec{Default: def, NodeSelector: sel, DriverType: nvidiav1alpha1.DriverTypeGPU, Image: "driver", Repository: "nvcr.io/nvidia", Version: "570.1"}}
}

func poolNode(name string, labels map[string]string) corev1.Node {
	l := map[string]string{"feature.node.kubernetes.io/pci-10de.present": "true", labelOSID: "ubuntu", labelOSVersion: "22.04"}
	for k, v := range labels {
		l[k] = v
	}
	return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}
}

func TestAssignDrivers(t *testing.T) {
	h100 := map[string]string{"pool": "h100"}
	a100 := map[string]string{"pool": "a100"}
	nodes := []corev1.Node{
		poolNode("h1", h100), poolNode("a1", a100), poolNode("x1", map[string]string{"pool": "x"}),
		{ObjectMeta: metav1.ObjectMeta{Name: "cpu", Labels: h100}}, // no GPU: never assigned
	}
	deleting := nvDriver("gone", false, a100)
	deleting.DeletionTimestamp = ptr.To(metav1.Now())
	tests := map[string]struct {
		drivers       []nvidiav1alpha1.NVIDIADriver
		wantNode      map[string]string
		wantConflicts map[string][]string
	}{
		"none":                                        {wantNode: map[string]string{}, wantConflicts: map[string][]string{}},
		"one per pool, no default":                    {drivers: []nvidiav1alpha1.NVIDIADriver{nvDriver("h", false, h100), nvDriver("a", false, a100)}, wantNode: map[string]string{"h1": "h", "a1": "a"}, wantConflicts: map[string][]string{}},
		"default takes the rest":                      {drivers: []nvidiav1alpha1.NVIDIADriver{nvDriver("h", false, h100), nvDriver("d", true, nil)}, wantNode: map[string]string{"h1": "h", "a1": "d", "x1": "d"}, wantConflicts: map[string][]string{}},
		"two select one pool":                         {drivers: []nvidiav1alpha1.NVIDIADriver{nvDriver("h", false, h100), nvDriver("h2", false, h100), nvDriver("d", true, nil)}, wantNode: map[string]string{"a1": "d", "x1": "d"}, wantConflicts: map[string][]string{"h1": {"h", "h2"}}},
		"two defaults":                                {drivers: []nvidiav1alpha1.NVIDIADriver{nvDriver("h", false, h100), nvDriver("d2", true, nil), nvDriver("d1", true, nil)}, wantNode: map[string]string{"h1": "h"}, wantConflicts: map[string][]string{"a1": {"d1", "d2"}, "x1": {"d1", "d2"}}},
		"a driver being deleted selects nothing":      {drivers: []nvidiav1alpha1.NVIDIADriver{deleting, nvDriver("a", false, a100)}, wantNode: map[string]string{"a1": "a"}, wantConflicts: map[string][]string{}},
		"empty selector, not default: every GPU node": {drivers: []nvidiav1alpha1.NVIDIADriver{nvDriver("all", false, nil)}, wantNode: map[string]string{"h1": "all", "a1": "all", "x1": "all"}, wantConflicts: map[string][]string{}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			a := AssignDrivers(tt.drivers, nodes)
			if diff := cmp.Diff(tt.wantNode, a.Node); diff != "" {
				t.Errorf("nodes (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantConflicts, a.Conflicts); diff != "" {
				t.Errorf("conflicts (-want +got):\n%s", diff)
			}
		})
	}
}

func FuzzAssignDrivers(f *testing.F) {
	f.Add(uint8(3), uint8(5), uint16(0x1234))
	f.Fuzz(func(t *testing.T, nd, nn uint8, bits uint16) {
		var drivers []nvidiav1alpha1.NVIDIADriver
		for i := range int(nd % 6) {
			sel := map[string]string{"pool": string(rune('a' + (int(bits)>>i)%3))}
			def := (bits>>(i+8))&1 == 1
			if def {
				sel = nil
			}
			drivers = append(drivers, nvDriver(string(rune('p'+i)), def, sel))
		}
		var nodes []corev1.Node
		for i := range int(nn % 10) {
			nodes = append(nodes, poolNode(string(rune('A'+i)), map[string]string{"pool": string(rune('a' + i%4))}))
		}
		a := AssignDrivers(drivers, nodes)
		for n, d := range a.Node {
			if _, both := a.Conflicts[n]; both {
				t.Fatalf("node %s both assigned to %s and in conflict", n, d)
			}
		}
		for n, ds := range a.Conflicts {
			if len(ds) < 2 {
				t.Fatalf("conflict of %s with %v", n, ds)
			}
		}
	})
}

func TestDriverLabel(t *testing.T) {
	a := DriverAssignment{Node: map[string]string{"n": "h"}}
	str := func(s string) *string { return &s }
	tests := map[string]struct {
		labels map[string]string
		crdOn  bool
		want   map[string]*string
	}{
		"set":                           {crdOn: true, want: map[string]*string{LabelNVIDIADriver: str("h")}},
		"already set":                   {labels: map[string]string{LabelNVIDIADriver: "h"}, crdOn: true},
		"moved to another driver":       {labels: map[string]string{LabelNVIDIADriver: "old"}, crdOn: true, want: map[string]*string{LabelNVIDIADriver: str("h")}},
		"CRD off: removed":              {labels: map[string]string{LabelNVIDIADriver: "h"}, want: map[string]*string{LabelNVIDIADriver: nil}},
		"CRD off, never set: no change": {},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: tt.labels}}
			if diff := cmp.Diff(tt.want, DriverLabel(n, tt.crdOn, a)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	conflicted := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "c", Labels: map[string]string{LabelNVIDIADriver: "h"}}}
	if got := DriverLabel(conflicted, true, a); len(got) != 1 || got[LabelNVIDIADriver] != nil {
		t.Errorf("a node in conflict keeps its driver label: %v", got)
	}
}

func TestDriverStatus(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC))
	d := nvDriver("h", false, map[string]string{"pool": "h100"})
	a := DriverAssignment{Node: map[string]string{"n1": "h", "n2": "h", "n3": "other"}, Conflicts: map[string][]string{"n9": {"h", "h2"}}}
	pod := func(node, image string, ready bool) corev1.Pod {
		st := corev1.ConditionFalse
		if ready {
			st = corev1.ConditionTrue
		}
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p-" + node, Labels: map[string]string{"app": "ds", LabelNVIDIADriver: "h"}},
			Spec:   corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Image: image}}},
			Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}}}
	}
	desired := map[string]string{"ds": "new"}

	st := DriverStatus(&d, true, a, []corev1.Pod{pod("n1", "new", true), pod("n2", "old", true)}, desired, "ns", now)
	if st.State != nvidiav1alpha1.StateNotReady || st.Nodes != 2 || st.NodesReady != 1 {
		t.Errorf("one node on the old driver: state %s, %d/%d ready", st.State, st.NodesReady, st.Nodes)
	}
	if c := meta.FindStatusCondition(st.Conditions, nvidiav1.ConditionReady); c == nil || !strings.Contains(c.Message, "n2") {
		t.Errorf("Ready condition does not name n2: %+v", c)
	}
	if c := meta.FindStatusCondition(st.Conditions, nvidiav1alpha1.ConditionConflict); c == nil || !strings.Contains(c.Message, "n9") {
		t.Errorf("Conflict condition does not name n9: %+v", c)
	}

	st = DriverStatus(&d, true, DriverAssignment{Node: a.Node}, []corev1.Pod{pod("n1", "new", true), pod("n2", "new", true)}, desired, "ns", now)
	if st.State != nvidiav1alpha1.StateReady || meta.FindStatusCondition(st.Conditions, nvidiav1alpha1.ConditionConflict) != nil {
		t.Errorf("all current and Ready, no conflict: %+v", st)
	}
	// Unchanged input, unchanged status (so nothing is written).
	d.Status = st
	later := metav1.NewTime(now.Add(time.Hour))
	if again := DriverStatus(&d, true, DriverAssignment{Node: a.Node}, []corev1.Pod{pod("n1", "new", true), pod("n2", "new", true)}, desired, "ns", later); !cmp.Equal(again, st) {
		t.Errorf("status changed with nothing else changed:\n%s", cmp.Diff(st, again))
	}

	off := DriverStatus(&d, false, a, nil, desired, "ns", now)
	if off.State != "disabled" || !strings.Contains(meta.FindStatusCondition(off.Conditions, nvidiav1.ConditionReady).Message, "useNvidiaDriverCRD") {
		t.Errorf("CRD off: %+v", off)
	}

	vgpu := nvDriver("v", true, nil)
	vgpu.Spec.DriverType = nvidiav1alpha1.DriverTypeVGPU
	vst := DriverStatus(&vgpu, true, DriverAssignment{Node: map[string]string{"n1": "v"}}, nil, desired, "ns", now)
	if c := meta.FindStatusCondition(vst.Conditions, nvidiav1.ConditionUnsupportedFields); c == nil || !strings.Contains(c.Message, "spec.driverType") {
		t.Errorf("vgpu driver: want UnsupportedFields naming spec.driverType, got %+v", vst.Conditions)
	}
}

// TestRenderNVIDIADrivers: with useNvidiaDriverCRD the policy's driver
// section gives way to one DaemonSet per NVIDIADriver and OS flavour, each
// with the driver's image, on the nodes labelled with its name; a vGPU
// driver is not rendered.
func TestRenderNVIDIADrivers(t *testing.T) {
	policy := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "u"}}
	policy.Spec.Driver.UseNvidiaDriverCRD = ptr.To(true)
	policy.Spec.Driver.Version = "999.0" // not used: the NVIDIADriver's version is
	h := nvDriver("h100", false, map[string]string{"pool": "h100"})
	h.Spec.Env = []nvidiav1.EnvVar{{Name: "X", Value: "1"}}
	h.Spec.Labels = map[string]string{"team": "ml", "app": "not-ours"}
	d := nvDriver("default", true, nil)
	d.Spec.Version = "550.1"
	v := nvDriver("vgpu", false, map[string]string{"pool": "v"})
	v.Spec.DriverType = nvidiav1alpha1.DriverTypeVGPU
	facts := Facts{Namespace: "ns", OSFlavours: []OSFlavour{{"ubuntu", "22.04"}, {"rhel", "9.4"}}, Runtimes: []string{"containerd"},
		Drivers: []nvidiav1alpha1.NVIDIADriver{d, h, v}}
	objs, err := Render(policy, facts, Assets)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, o := range objs {
		ds, ok := o.(*appsv1.DaemonSet)
		if !ok || ds.Labels[LabelComponent] != Driver {
			continue
		}
		tpl := ds.Spec.Template
		if tpl.Spec.NodeSelector[LabelNVIDIADriver] != ds.Labels[LabelNVIDIADriver] || tpl.Labels[LabelNVIDIADriver] != ds.Labels[LabelNVIDIADriver] {
			t.Errorf("%s: selector %v / pod labels %v do not name driver %s", ds.Name, tpl.Spec.NodeSelector, tpl.Labels, ds.Labels[LabelNVIDIADriver])
		}
		if tpl.Labels["app"] != ds.Name {
			t.Errorf("%s: a driver's labels replaced the app label: %v", ds.Name, tpl.Labels)
		}
		if ds.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
			t.Errorf("%s: update strategy %s, want OnDelete (upgrades go through NodeMaintenance)", ds.Name, ds.Spec.UpdateStrategy.Type)
		}
		got[ds.Name] = tpl.Spec.Containers[0].Image
		if ds.Labels[LabelNVIDIADriver] == "h100" {
			if tpl.Labels["team"] != "ml" || !hasEnv(tpl.Spec.Containers[0].Env, "X", "1") {
				t.Errorf("%s: driver labels/env not applied: %v %v", ds.Name, tpl.Labels, tpl.Spec.Containers[0].Env)
			}
		}
	}
	want := map[string]string{
		"nvidia-driver-daemonset-default-rhel9.4":     "nvcr.io/nvidia/driver:550.1-rhel9.4",
		"nvidia-driver-daemonset-default-ubuntu22.04": "nvcr.io/nvidia/driver:550.1-ubuntu22.04",
		"nvidia-driver-daemonset-h100-rhel9.4":        "nvcr.io/nvidia/driver:570.1-rhel9.4",
		"nvidia-driver-daemonset-h100-ubuntu22.04":    "nvcr.io/nvidia/driver:570.1-ubuntu22.04",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("driver DaemonSets (-want +got):\n%s", diff)
	}
}

func hasEnv(env []corev1.EnvVar, name, value string) bool {
	for _, e := range env {
		if e.Name == name && e.Value == value {
			return true
		}
	}
	return false
}
