package devcluster_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
)

// The cluster's defaults (devcluster.Options): kwok renews a node's lease
// every quarter of 8s; the node lifecycle controller marks a node whose
// lease is older than 10s Unknown, checking every second.
const (
	nodeLeaseDuration      = 8 * time.Second
	nodeMonitorGracePeriod = 10 * time.Second
)

func leaseRenewTime(t *testing.T, node string) time.Time {
	t.Helper()
	l, err := cluster.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(t.Context(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("lease of node %s: %v", node, err)
	}
	if l.Spec.RenewTime == nil {
		t.Fatalf("lease of node %s never renewed", node)
	}
	return l.Spec.RenewTime.Time
}

// TestInjectedNotReadyOutlivesTheGracePeriod: a node frozen by an injected
// Ready=False keeps its lease renewed, so the node lifecycle controller
// does not replace the injected condition with Unknown, however long it
// lasts (here more than the grace period), until it is cleared.
func TestInjectedNotReadyOutlivesTheGracePeriod(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	node := "gpu-004"
	t.Cleanup(func() { _ = cluster.ClearNodeCondition(context.Background(), node, corev1.NodeReady) })
	injected := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "KubeletNotReady", Message: "container runtime is down"}
	if err := cluster.SetNodeCondition(ctx, node, injected); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, node, corev1.NodeReady, corev1.ConditionFalse, 10*time.Second)
	renewed := leaseRenewTime(t, node)
	frozen := time.Now()
	for time.Since(frozen) < nodeMonitorGracePeriod+5*time.Second {
		n, err := cluster.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if c := findCondition(n, corev1.NodeReady); c == nil || c.Status != corev1.ConditionFalse || c.Reason != injected.Reason || c.Message != injected.Message {
			t.Fatalf("injected Ready=False replaced after %s: %+v", time.Since(frozen).Round(100*time.Millisecond), c)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if now := leaseRenewTime(t, node); !now.After(renewed) {
		t.Errorf("the frozen node's lease was not renewed for %s (renewed %s)", nodeMonitorGracePeriod+5*time.Second, now)
	}
	if err := cluster.ClearNodeCondition(ctx, node, corev1.NodeReady); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, node, corev1.NodeReady, corev1.ConditionTrue, 20*time.Second)
}

// TestStoppedKubeletLeavesPodsTerminating: a stopped kubelet stops renewing
// its lease, so the node is Unknown within the lease bound (lease duration
// plus the grace period, with some slack for a loaded machine); a pod
// deleted meanwhile stays Terminating; once the kubelet is back the node is
// Ready again.
func TestStoppedKubeletLeavesPodsTerminating(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	node, ns := "gpu-007", "default"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "on-stopped-kubelet", Namespace: ns},
		Spec: corev1.PodSpec{NodeName: node, TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{Name: "c", Image: "registry.example/c:1"}}},
	}
	if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = cluster.StartKubelet(ctx, node)
		_ = cluster.Client.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		t.Fatalf("pod never ran on %s: %v", node, err)
	}

	stopped := time.Now()
	if err := cluster.StopKubelet(ctx, node); err != nil {
		t.Fatal(err)
	}
	bound := nodeLeaseDuration + nodeMonitorGracePeriod + 10*time.Second
	got := waitCondition(t, node, corev1.NodeReady, corev1.ConditionUnknown, 2*bound)
	if took := time.Since(stopped); took > bound {
		t.Errorf("Ready=Unknown %s after the kubelet stopped, want within %s", took.Round(100*time.Millisecond), bound)
	}
	if got.Reason != "NodeStatusUnknown" {
		t.Errorf("reason %q, want NodeStatusUnknown (the node lifecycle controller's)", got.Reason)
	}
	renewed := leaseRenewTime(t, node)

	if err := cluster.Client.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(nodeLeaseDuration / 2) // more than the pod's grace period and one lease renewal
	p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the pod on the stopped kubelet's node went away: %v", err)
	}
	if p.DeletionTimestamp == nil {
		t.Errorf("deleted pod without a deletion timestamp")
	}
	if now := leaseRenewTime(t, node); !now.Equal(renewed) {
		t.Errorf("the stopped kubelet's lease was renewed (%s → %s)", renewed, now)
	}

	if err := cluster.StartKubelet(ctx, node); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, node, corev1.NodeReady, corev1.ConditionTrue, 30*time.Second)
}
