package gpucluster_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nvidiav1alpha1 "github.com/gpufleet/gpufleet/api/nvidia/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/gpucluster"
	"github.com/gpufleet/gpufleet/internal/gpustack"
)

// A GPUCluster whose stack the GPU Operator deployed in another namespace
// (status.namespace): gpufleet deploys nothing beside it and says why;
// once the annotation confirms that stack is gone, it deploys.
func TestGPUClusterDeploysNothingBesideAStackInAnotherNamespace(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	setAdminAccess(t, true)
	t.Cleanup(func() { setAdminAccess(t, false) })
	gc := createGPUCluster(t)
	gc.Status = nvidiav1alpha1.GPUClusterStatus{State: nvidiav1alpha1.GPUClusterReady, Namespace: "nvidia-gpu-operator"} // as the GPU Operator left it, in its own namespace
	if err := k8s.Status().Update(ctx, gc); err != nil {
		t.Fatal(err)
	}
	startOperator(t)
	waitState(t, nvidiav1alpha1.GPUClusterNotReady, gpucluster.ReasonStackInAnotherNamespace)
	time.Sleep(time.Second)
	var list appsv1.DaemonSetList
	if err := k8s.List(ctx, &list, client.InNamespace(ns)); err != nil || len(list.Items) != 0 {
		t.Fatalf("deployed beside the stack in namespace nvidia-gpu-operator: %d DaemonSets (%v)", len(list.Items), err)
	}
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:"nvidia-gpu-operator"}}}`, gpustack.AnnotationOtherNamespaceCleared)
	if err := k8s.Patch(ctx, gc, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
	devtest.WaitFor(t, "the stack deployed once the other one is confirmed gone", 60*time.Second, func(ctx context.Context) (bool, string) {
		ds := &appsv1.DaemonSet{}
		err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: gpucluster.KubeletPlugin}, ds)
		return err == nil, fmt.Sprint(err)
	}, func() { dump(t) })
}
