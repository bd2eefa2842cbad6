package gpustack

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	nvidiav1alpha1 "github.com/gpufleet/gpufleet/api/nvidia/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/testobj"
)

// TestPolicyPassCopiesNoNode: a ClusterPolicy pass and an NVIDIADriver
// pass read the cached nodes without copying them. Each pass read every
// node of the cluster through a copying list: at 10,000 nodes that is
// every node copied at every pass, while the passes only read them (their
// writes are patches built apart).
func TestPolicyPassCopiesNoNode(t *testing.T) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, nvidiav1.AddToScheme, nvidiav1alpha1.AddToScheme,
		maintenancev1.AddToScheme, repairv1.AddToScheme, apiextensionsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	policy := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "cluster-policy"}}
	driver := &nvidiav1alpha1.NVIDIADriver{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	objs := []client.Object{policy, driver}
	for i := range 3 {
		n := gpuNode(nil, "containerd://1.7.24")
		n.Name = fmt.Sprintf("gpu-%d", i)
		objs = append(objs, n)
	}
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithStatusSubresource(&nvidiav1.ClusterPolicy{}, &nvidiav1alpha1.NVIDIADriver{}).Build()
	c := &testobj.ListCopies{Client: api}
	r := &Reconciler{Client: c, Live: api, Leases: api, Namespace: "gpu-operator", Assets: Assets,
		Clock: clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)), Recorder: events.NewFakeRecorder(100)}
	if _, err := r.Reconcile(t.Context(), reconcile.Request{NamespacedName: types.NamespacedName{Name: policy.Name}}); err != nil {
		t.Fatal(err)
	}
	if copying := c.Copying(); copying[fmt.Sprintf("%T", &corev1.NodeList{})] > 0 {
		t.Errorf("a ClusterPolicy pass listed the nodes with copies (lists with copies: %v)", copying)
	}
	d := &DriverStatusReconciler{Client: c, Namespace: "gpu-operator", Clock: r.Clock, Recorder: events.NewFakeRecorder(100)}
	if _, err := d.Reconcile(t.Context(), reconcile.Request{NamespacedName: types.NamespacedName{Name: driver.Name}}); err != nil {
		t.Fatal(err)
	}
	if copying := c.Copying(); copying[fmt.Sprintf("%T", &corev1.NodeList{})] > 0 {
		t.Errorf("an NVIDIADriver pass listed the nodes with copies (lists with copies: %v)", copying)
	}
}
