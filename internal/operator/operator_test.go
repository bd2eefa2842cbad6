package operator

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

func capabilityNames(cs []Capability) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}

func TestSelectCapabilities(t *testing.T) {
	tests := map[string]struct {
		names   []string
		want    []string
		wantErr string
	}{
		"nil: all, in start order":   {names: nil, want: []string{"maintenance", "repair", "gpustack", "allocation"}},
		"empty: all, in start order": {names: []string{}, want: []string{"maintenance", "repair", "gpustack", "allocation"}},
		"one":                        {names: []string{"repair"}, want: []string{"repair"}},
		"in the order asked":         {names: []string{"gpustack", "maintenance"}, want: []string{"gpustack", "maintenance"}},
		"space around a name":        {names: []string{" maintenance ", "\trepair"}, want: []string{"maintenance", "repair"}},
		"unknown": {names: []string{"maintenance", "autoscaling"},
			wantErr: `unknown capability "autoscaling" (known: allocation, gpustack, maintenance, repair)`},
		"letter case matters": {names: []string{"Repair"},
			wantErr: `unknown capability "Repair" (known: allocation, gpustack, maintenance, repair)`},
		"an empty name (a trailing comma)": {names: []string{"repair", ""},
			wantErr: `unknown capability "" (known: allocation, gpustack, maintenance, repair)`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := selectCapabilities(tc.names)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				if got != nil {
					t.Errorf("capabilities %v returned with the error", capabilityNames(got))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, capabilityNames(got)); diff != "" {
				t.Errorf("capabilities (-want +got):\n%s", diff)
			}
			for _, c := range got {
				if c.AddToScheme == nil || c.Setup == nil {
					t.Errorf("capability %s without AddToScheme or Setup", c.Name)
				}
			}
		})
	}
}

func TestCapabilityNamesSorted(t *testing.T) {
	if diff := cmp.Diff([]string{"allocation", "gpustack", "maintenance", "repair"}, CapabilityNames()); diff != "" {
		t.Errorf("CapabilityNames (-want +got):\n%s", diff)
	}
}

// kindsOf lists the kinds a scheme knows in group, sorted.
func kindsOf(s *runtime.Scheme, gv schema.GroupVersion) []string {
	var out []string
	for gvk := range s.AllKnownTypes() {
		if gvk.GroupVersion() == gv {
			out = append(out, gvk.Kind)
		}
	}
	slices.Sort(out)
	return out
}

func TestSchemeHasEveryKind(t *testing.T) {
	s, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	// The kinds of gpufleet's three API groups, with the options kinds
	// every group version gets (GetOptions, ListOptions, ...).
	own := func(kinds ...string) []string {
		kinds = append(kinds, "CreateOptions", "DeleteOptions", "GetOptions", "ListOptions", "PatchOptions", "UpdateOptions", "WatchEvent")
		slices.Sort(kinds)
		return kinds
	}
	tests := map[string]struct {
		gv   schema.GroupVersion
		want []string
	}{
		"maintenance.nvidia.com": {maintenancev1.GroupVersion,
			own("MaintenanceOperatorConfig", "MaintenanceOperatorConfigList", "NodeMaintenance", "NodeMaintenanceList")},
		"nvidia.com":          {nvidiav1.GroupVersion, own("ClusterPolicy", "ClusterPolicyList")},
		"repair.gpufleet.dev": {repairv1.GroupVersion, own("GPUFault", "GPUFaultList", "NodeRepair", "NodeRepairList", "NodeRepairPolicy", "NodeRepairPolicyList")},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, kindsOf(s, tc.gv)); diff != "" {
				t.Errorf("kinds of %s (-want +got):\n%s", tc.gv, diff)
			}
		})
	}
	// The Kubernetes kinds the controllers read and write.
	for _, obj := range []runtime.Object{&corev1.Node{}, &corev1.Pod{}, &corev1.Event{}, &corev1.ConfigMap{},
		&policyv1.Eviction{}, &policyv1.PodDisruptionBudget{}, &appsv1.DaemonSet{}, &coordinationv1.Lease{},
		&resourcev1.ResourceSlice{}, &resourcev1.ResourceClaim{}, &resourcev1.DeviceTaintRule{}} {
		if gvks, _, err := s.ObjectKinds(obj); err != nil || len(gvks) == 0 {
			t.Errorf("%T is not in the scheme: %v", obj, err)
		}
	}
	// Every capability's own scheme is contained in the operator's.
	for _, c := range registry {
		own := runtime.NewScheme()
		if err := c.AddToScheme(own); err != nil {
			t.Fatal(err)
		}
		for gvk := range own.AllKnownTypes() {
			if !s.Recognizes(gvk) {
				t.Errorf("capability %s: %s missing from Scheme()", c.Name, gvk)
			}
		}
	}
}

// TestNewRefusesUnknownCapabilityFirst: the capability error comes before
// any manager is built (an unreachable API server would fail that step).
func TestNewRefusesUnknownCapabilityFirst(t *testing.T) {
	cfg := &rest.Config{Host: "http://127.0.0.1:1"}
	mgr, err := New(cfg, Options{MetricsAddr: "0", ProbeAddr: "0", Capabilities: []string{"repair", "autoscaling"}})
	if mgr != nil {
		t.Errorf("a manager was returned with an unknown capability")
	}
	if want := `unknown capability "autoscaling" (known: allocation, gpustack, maintenance, repair)`; err == nil || err.Error() != want {
		t.Errorf("error %v, want %q (and no attempt to build a manager)", err, want)
	}
}

// fullNode has every field a controller reads: labels, annotations,
// deletion, spec (cordon, taints), conditions, node info, capacity and
// allocatable, addresses, plus images and managed fields.
func fullNode() *corev1.Node {
	now := metav1.Unix(1_800_000_000, 0)
	res := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("96"), "nvidia.com/gpu": resource.MustParse("8")}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: "gpu-1", UID: "u-1", ResourceVersion: "42", Generation: 3,
			Labels:            map[string]string{"nvidia.com/gpu.present": "true", "gpufleet.dev/pool": "a"},
			Annotations:       map[string]string{"repair.gpufleet.dev/faults-since": "x"},
			DeletionTimestamp: &now, Finalizers: []string{"example.com/keep"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate,
				Subresource: "status", FieldsType: "FieldsV1"}},
		},
		Spec: corev1.NodeSpec{Unschedulable: true, ProviderID: "kwok://gpu-1",
			Taints: []corev1.Taint{{Key: "node.kubernetes.io/unschedulable", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{
			Capacity: res, Allocatable: res.DeepCopy(), Phase: corev1.NodeRunning,
			Conditions: []corev1.NodeCondition{
				{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "KubeletNotReady", LastTransitionTime: now},
				{Type: "ReadonlyFilesystem", Status: corev1.ConditionTrue, Message: "/ is read-only"},
			},
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}},
			NodeInfo: corev1.NodeSystemInfo{BootID: "boot-1", ContainerRuntimeVersion: "cri-o://1.31.2", KernelVersion: "5.15.0",
				OSImage: "Ubuntu 22.04 LTS", KubeletVersion: "v1.37.2"},
			Images: []corev1.ContainerImage{{Names: []string{"nvcr.io/nvidia/driver:570"}, SizeBytes: 1 << 30}},
		},
	}
}

func TestStripNodeKeepsWhatControllersRead(t *testing.T) {
	in := fullNode()
	got, err := stripNode(in)
	if err != nil {
		t.Fatal(err)
	}
	if got != any(in) {
		t.Errorf("stripNode returned a different object; it trims the decoded node in place")
	}
	want := fullNode()
	want.ManagedFields = nil
	want.Status.Images = nil
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("stripped node (-want +got):\n%s", diff)
	}
	// Anything else passes through unchanged, a tombstone included.
	tomb := toolscache.DeletedFinalStateUnknown{Key: "gpu-1", Obj: fullNode()}
	if out, err := stripNode(tomb); err != nil || !cmp.Equal(any(tomb), out) {
		t.Errorf("tombstone: %v, %v", out, err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}}}}
	if out, err := stripNode(pod); err != nil || len(out.(*corev1.Pod).ManagedFields) != 1 {
		t.Errorf("a pod is not stripNode's to trim: %v, %v", out, err)
	}
}

func TestOrDefault(t *testing.T) {
	for _, tc := range []struct{ v, def, want string }{{"", ":8080", ":8080"}, {"0", ":8080", "0"}, {":9090", ":8080", ":9090"}} {
		if got := orDefault(tc.v, tc.def); got != tc.want {
			t.Errorf("orDefault(%q, %q) = %q, want %q", tc.v, tc.def, got, tc.want)
		}
	}
}
