package gpustack_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/kubectl/pkg/util/podutils"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/gpustack"
	"github.com/gpufleet/gpufleet/internal/operator"
)

// A driver upgrade whose new driver cannot load because the old kernel
// module is still in use (the driver manager cannot unload it while
// something on the host holds the GPUs; requirement G6,
// docs/requirements.md) finishes through the reboot path: the repair
// engine reboots the node inside the upgrade's NodeMaintenance (the node
// stays cordoned throughout), the new driver loads after the reboot, and
// only then is the node released. Other nodes upgrade without a reboot.
func TestDriverModuleInUseFinishesTheUpgradeThroughAReboot(t *testing.T) {
	devtest.NeedCluster(t)
	const target = "gpu-001"
	devtest.StartOperator(t, operatorCfg, operator.Options{Namespace: ns, Capabilities: []string{"gpustack", "maintenance", "repair"},
		GPUStackDegradedAfter: 3 * time.Second, DriverUpgradeTimeout: 15 * time.Second},
		func(mgr manager.Manager) error {
			return devcluster.AddInProcessAgent(mgr, devcluster.SimExecutor{Cluster: cluster, RebootDowntime: time.Second}, nil)
		})
	policy := v16Policy(t)
	if err := k8s.Create(t.Context(), policy); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), policy) })
	healthy := []string{"gpu-000", "gpu-001", "gpu-002", "gpu-003", "gpu-004", "gpu-005", "gpu-006"}
	if err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 90*time.Second, true, func(context.Context) (bool, error) {
		return component(getPolicy(t, "cluster-policy"), gpustack.Driver).NodesReady == int32(len(healthy)), nil
	}); err != nil {
		t.Fatalf("drivers not Ready: %+v", getPolicy(t, "cluster-policy").Status)
	}
	boots := map[string]string{}
	for _, n := range healthy {
		node, err := cluster.Client.CoreV1().Nodes().Get(t.Context(), n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		boots[n] = node.Status.NodeInfo.BootID
	}
	// Something on the target's host holds the GPUs: its next driver
	// cannot unload the module that the running one loaded.
	arm := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, devcluster.AnnotationModuleInUse, boots[target])
	if _, err := cluster.Client.CoreV1().Nodes().Patch(t.Context(), target, types.MergePatchType, arm, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:null}}}`, devcluster.AnnotationModuleInUse)
		_, _ = cluster.Client.CoreV1().Nodes().Patch(context.Background(), target, types.MergePatchType, patch, metav1.PatchOptions{})
		patch = fmt.Appendf(nil, `{"metadata":{"labels":{%q:null}}}`, nvidiav1.LabelUpgradeState)
		_, _ = cluster.Client.CoreV1().Nodes().Patch(context.Background(), "unhealthy-gpu-007", types.MergePatchType, patch, metav1.PatchOptions{})
	})

	// While it runs: the target is cordoned from before the reboot is asked
	// for until its upgrade is released, and is rebooted only while held.
	stop := devtest.CheckWhile(t, func(ctx context.Context) string {
		var list repairv1.NodeRepairList
		if err := k8s.List(ctx, &list, client.HasLabels{gpustack.LabelRebootOf}); err != nil || len(list.Items) == 0 ||
			list.Items[0].Status.Phase != repairv1.PhaseRepairing {
			return ""
		}
		if node, err := cluster.Client.CoreV1().Nodes().Get(ctx, target, metav1.GetOptions{}); err == nil && !node.Spec.Unschedulable {
			return "node " + target + " schedulable while its reboot is in progress"
		}
		return ""
	})
	updatePolicy(t, func(p *nvidiav1.ClusterPolicy) {
		p.Spec.Driver.Version = "550.54.15"
		p.Spec.Driver.UpgradePolicy = &nvidiav1.DriverUpgradePolicySpec{MaxParallelUpgrades: ptr.To[int32](0)} // no limit of its own
	})
	var nr repairv1.NodeRepair
	err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, n := range healthy {
			pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=driver", FieldSelector: "spec.nodeName=" + n})
			if err != nil || len(pods.Items) != 1 || !strings.Contains(pods.Items[0].Spec.Containers[0].Image, ":550.54.15-") || !podutils.IsPodReady(&pods.Items[0]) {
				return false, nil //nolint:nilerr // not yet
			}
		}
		var nms maintenancev1.NodeMaintenanceList
		if err := k8s.List(ctx, &nms, client.InNamespace(ns)); err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		if len(nms.Items) != 0 {
			return false, nil // (the broken node's upgrade fails after the timeout: nothing is left for the next test)
		}
		var list repairv1.NodeRepairList
		if err := k8s.List(ctx, &list, client.HasLabels{gpustack.LabelRebootOf}); err != nil || len(list.Items) != 1 {
			return false, nil //nolint:nilerr // keep polling
		}
		nr = list.Items[0]
		return nr.Status.Phase == repairv1.PhaseSucceeded, nil
	})
	stop()
	if err != nil {
		var list repairv1.NodeRepairList
		_ = k8s.List(context.Background(), &list)
		pods, _ := cluster.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=driver", FieldSelector: "spec.nodeName=" + target})
		var nms maintenancev1.NodeMaintenanceList
		_ = k8s.List(context.Background(), &nms, client.InNamespace(ns))
		node, _ := cluster.Client.CoreV1().Nodes().Get(context.Background(), target, metav1.GetOptions{})
		t.Fatalf("upgrade through a reboot did not finish: %v\nreboots %+v\ndriver pods on %s: %+v\nmaintenances %+v\nnode labels %v annotations %v",
			err, list.Items, target, pods.Items, nms.Items, node.Labels, node.Annotations)
	}
	if nr.Spec.NodeName != target || nr.Spec.Requestor != gpustack.UpgradeRequestor || !strings.HasPrefix(nr.Spec.Maintenance, "driver-upgrade-"+target) ||
		!strings.Contains(nr.Spec.Fault.Message, "Could not unload NVIDIA driver kernel modules, driver is in use") {
		t.Errorf("reboot asked for: %+v", nr.Spec)
	}
	for _, n := range healthy {
		node, err := cluster.Client.CoreV1().Nodes().Get(t.Context(), n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rebooted := node.Status.NodeInfo.BootID != boots[n]
		if rebooted != (n == target) {
			t.Errorf("node %s rebooted: %t", n, rebooted)
		}
		if node.Spec.Unschedulable || node.Labels[nvidiav1.LabelUpgradeState] != "" {
			t.Errorf("node %s after its upgrade: unschedulable %t, %s=%q", n, node.Spec.Unschedulable, nvidiav1.LabelUpgradeState, node.Labels[nvidiav1.LabelUpgradeState])
		}
	}
	want := map[string]string{
		gpustack.ReasonModuleInUse: "New driver on node " + target + " cannot load: nvidia-driver-ctr: Could not unload NVIDIA driver kernel modules, driver is in use; rebooting the node",
		gpustack.ReasonUpgradeDone: "Driver of node " + target + " upgraded (after a reboot freed the old kernel module)",
	}
	for reason, text := range want {
		evs, err := cluster.Client.EventsV1().Events("").List(t.Context(), metav1.ListOptions{FieldSelector: "reason=" + reason})
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, e := range evs.Items {
			found = found || strings.Contains(e.Note, text)
		}
		if !found {
			t.Errorf("no %s event saying %q", reason, text)
		}
	}
}
