package operator

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestStripNodeDropsImagesAndManagedFields(t *testing.T) {
	node := func(images []corev1.ContainerImage, managed []metav1.ManagedFieldsEntry) *corev1.Node {
		return &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: "gpu-1", Labels: map[string]string{"nvidia.com/gpu.present": "true"}, ManagedFields: managed},
			Spec:       corev1.NodeSpec{Unschedulable: true},
			Status: corev1.NodeStatus{
				Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
				NodeInfo:   corev1.NodeSystemInfo{BootID: "b", ContainerRuntimeVersion: "containerd://2.1"},
				Images:     images,
			},
		}
	}
	got, err := stripNode(node([]corev1.ContainerImage{{Names: []string{"nvcr.io/nvidia/driver:570"}, SizeBytes: 1 << 30}},
		[]metav1.ManagedFieldsEntry{{Manager: "kubelet"}}))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(node(nil, nil), got); diff != "" {
		t.Errorf("stripped node (-want +got):\n%s", diff)
	}
	if other, _ := stripNode("not a node"); other != "not a node" {
		t.Errorf("non-nodes must pass through")
	}
}

// TestStripResourceSlice: the cached slice keeps each device's name,
// taints and the attributes that identify a GPU (qualified or not), and
// nothing else of its devices.
func TestStripResourceSlice(t *testing.T) {
	taint := resourcev1.DeviceTaint{Key: "gpu.nvidia.com/xid", Value: "48", Effect: resourcev1.DeviceTaintEffectNoSchedule}
	s := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-000-gpu.nvidia.com", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet-plugin"}}},
		Spec: resourcev1.ResourceSliceSpec{Driver: "gpu.nvidia.com", NodeName: ptr.To("gpu-000"), Pool: resourcev1.ResourcePool{Name: "gpu-000", ResourceSliceCount: 1},
			Devices: []resourcev1.Device{{
				Name: "gpu-0",
				Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
					"uuid":                         {StringValue: ptr.To("GPU-1")},
					"gpu.nvidia.com/pciBusID":      {StringValue: ptr.To("0000:0f:00.0")},
					"index":                        {IntValue: ptr.To[int64](0)},
					"productName":                  {StringValue: ptr.To("NVIDIA H100 80GB HBM3")},
					"gpu.nvidia.com/driverVersion": {VersionValue: ptr.To("580.65.06")},
					"architecture":                 {StringValue: ptr.To("Hopper")},
				},
				Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{"memory": {Value: resource.MustParse("80Gi")}},
				Taints:   []resourcev1.DeviceTaint{taint},
			}, {Name: "gpu-1"}},
		},
	}
	got, err := stripResourceSlice(s)
	if err != nil {
		t.Fatal(err)
	}
	want := []resourcev1.Device{{
		Name: "gpu-0",
		Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			"uuid":                    {StringValue: ptr.To("GPU-1")},
			"gpu.nvidia.com/pciBusID": {StringValue: ptr.To("0000:0f:00.0")},
			"index":                   {IntValue: ptr.To[int64](0)},
		},
		Taints: []resourcev1.DeviceTaint{taint},
	}, {Name: "gpu-1"}}
	gs := got.(*resourcev1.ResourceSlice)
	if diff := cmp.Diff(want, gs.Spec.Devices); diff != "" {
		t.Errorf("devices (-want +got):\n%s", diff)
	}
	if gs.ManagedFields != nil || gs.Spec.Driver != "gpu.nvidia.com" || *gs.Spec.NodeName != "gpu-000" || gs.Spec.Pool.Name != "gpu-000" {
		t.Errorf("slice after the transform: %+v", gs)
	}
	// Another kind passes through stripDefault with only its managed fields dropped.
	other := &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu.nvidia.com", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "x"}}}}
	if o, err := stripDefault(other); err != nil || o.(*resourcev1.DeviceClass).ManagedFields != nil || o.(*resourcev1.DeviceClass).Name != "gpu.nvidia.com" {
		t.Errorf("a DeviceClass through the default transform: %+v, %v", o, err)
	}
}
