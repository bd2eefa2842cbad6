package devcluster_test

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
)

// TestSimulatedComputeDomain: the simulated ComputeDomain workload labels
// each of its nodes with the ComputeDomain's UID while a worker runs there
// (as NVIDIA's DRA driver does), removes the label of a node whose worker
// is evicted or deleted, and of all of them when the job ends; the
// ComputeDomain object is served by the CRD it installs.
func TestSimulatedComputeDomain(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	nodes := []string{"cdsim-000", "cdsim-001"}
	for _, n := range nodes {
		if err := cluster.AddNodes(ctx, devcluster.NodeSpec{Name: n, Pool: "cdsim", GPUs: 4}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cluster.Client.CoreV1().Nodes().Delete(context.Background(), n, metav1.DeleteOptions{}) })
	}
	uid, err := cluster.StartComputeDomain(ctx, "cdsim", "train", nodes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.EndComputeDomain(context.Background(), "cdsim", "train") })
	label := func(node string) string {
		n, err := cluster.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n.Labels[devcluster.LabelComputeDomain]
	}
	waitLabel := func(node, want string) {
		t.Helper()
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			return label(node) == want, nil
		})
		if err != nil {
			t.Fatalf("%s: label %s = %q, want %q", node, devcluster.LabelComputeDomain, label(node), want)
		}
	}
	for _, n := range nodes {
		waitLabel(n, string(uid))
	}
	// One worker is gone (a drain evicted it): its node is free.
	if err := cluster.Client.CoreV1().Pods("cdsim").Delete(ctx, "train-worker-0", *metav1.NewDeleteOptions(0)); err != nil {
		t.Fatal(err)
	}
	waitLabel(nodes[0], "")
	if got := label(nodes[1]); got != string(uid) {
		t.Errorf("the other node's label = %q, want %q", got, uid)
	}
	// The job ends.
	if err := cluster.EndComputeDomain(ctx, "cdsim", "train"); err != nil {
		t.Fatal(err)
	}
	waitLabel(nodes[1], "")
}
