package gpucluster

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	nvidiav1alpha1 "github.com/gpufleet/gpufleet/api/nvidia/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/testobj"
)

// TestLabellingCopiesNoNode: labelling the GPU nodes reads every cached
// node without copying it (the labels go out as patches built apart).
func TestLabellingCopiesNoNode(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := nvidiav1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	var objs []client.Object
	for i := range 3 {
		objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("gpu-%d", i),
			Labels: map[string]string{"feature.node.kubernetes.io/pci-10de.present": "true"}}})
	}
	c := &testobj.ListCopies{Client: fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()}
	r := &Reconciler{Client: c}
	if err := r.labelNodes(t.Context(), &nvidiav1alpha1.GPUCluster{ObjectMeta: metav1.ObjectMeta{Name: "gpus"}}, &Observed{}); err != nil {
		t.Fatal(err)
	}
	if copying := c.Copying(); copying[fmt.Sprintf("%T", &corev1.NodeList{})] > 0 {
		t.Errorf("labelling listed the nodes with copies (lists with copies: %v)", copying)
	}
}
