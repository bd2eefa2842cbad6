package gpustack_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/gpustack"
)

// TestNoStackBesideAGPUOperatorWithoutLeaderElection: NVIDIA's GPU
// Operator run without --leader-elect writes no lease, and deploys all the
// same. gpufleet finds it by its Deployment (a ready replica): it deploys
// nothing and says why on the ClusterPolicy; once the Deployment is scaled
// to 0 it deploys, brought back by the Deployment's event.
func TestNoStackBesideAGPUOperatorWithoutLeaderElection(t *testing.T) {
	devtest.NeedCluster(t)
	cleanSlate(t)
	ctx := t.Context()
	const theirs = "gpu-operator-unfenced"
	if err := devcluster.EnsureNamespace(ctx, cluster.Client, theirs); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "gpu-operator"}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: theirs, Name: "gpu-operator", Labels: labels},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "gpu-operator", Image: "nvcr.io/nvidia/gpu-operator:v26.7.0",
					Command: []string{"gpu-operator"}, Args: []string{"--zap-time-encoding=epoch"}}}}}}}
	if err := k8s.Create(ctx, dep); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), dep) })
	devtest.WaitFor(t, "the GPU Operator's Deployment ready", 60*time.Second, func(ctx context.Context) (bool, string) {
		err := k8s.Get(ctx, client.ObjectKeyFromObject(dep), dep)
		return err == nil && dep.Status.ReadyReplicas == 1, fmt.Sprint(err, dep.Status)
	})

	startOperator(t, operatorCfg)
	p := createPolicy(t, "cluster-policy", nil)
	devtest.WaitFor(t, "PreviousOperatorRunning naming the Deployment", 30*time.Second, func(ctx context.Context) (bool, string) {
		c := meta.FindStatusCondition(getPolicy(t, p.Name).Status.Conditions, gpustack.ConditionPreviousOperator)
		return c != nil && c.Status == metav1.ConditionTrue &&
			strings.Contains(c.Message, "Deployment "+theirs+"/gpu-operator (1 ready) without leader election"), fmt.Sprint(c)
	})
	time.Sleep(2 * time.Second) // the operator's passes
	var dss appsv1.DaemonSetList
	if err := k8s.List(ctx, &dss, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(dss.Items) != 0 {
		t.Fatalf("gpufleet deployed %d DaemonSets beside a running GPU Operator", len(dss.Items))
	}

	scaled := time.Now()
	if err := k8s.Patch(ctx, dep, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":0}}`))); err != nil {
		t.Fatal(err)
	}
	devtest.WaitFor(t, "the stack deployed once the GPU Operator is scaled to 0", 30*time.Second, func(ctx context.Context) (bool, string) {
		var dss appsv1.DaemonSetList
		if err := k8s.List(ctx, &dss, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(getPolicy(t, p.Name).Status.Conditions, gpustack.ConditionPreviousOperator)
		return len(dss.Items) > 0 && (c == nil || c.Status != metav1.ConditionTrue), fmt.Sprint(len(dss.Items), c)
	})
	t.Logf("deploying %.1f s after the GPU Operator was scaled to 0", time.Since(scaled).Seconds())
}
