package gpustack_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
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
//
// Before that reboot the whole node is drained (the upgrade drained only
// its GPU pods): a pod without a GPU there is evicted before the reboot is
// asked for, never ended by it. And on a node that upgrades without a
// reboot, a pod whose ResourceClaim NVIDIA's DRA driver allocated is
// evicted before the driver restarts, as a device-plugin GPU pod is.
func TestDriverModuleInUseFinishesTheUpgradeThroughAReboot(t *testing.T) {
	devtest.NeedCluster(t)
	const target, draNode = "gpu-001", "gpu-002"
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

	bystanderPod(t, "bystander", target)
	draPod(t, "dra-trainer", draNode)

	// While it runs: the target is cordoned from before the reboot is asked
	// for until its upgrade is released, and is rebooted only while held;
	// no reboot while the bystander runs; no driver restart on the DRA
	// node while its DRA pod runs.
	stop := devtest.CheckWhile(t, func(ctx context.Context) string {
		if why := neverUnder(ctx, target, "bystander", draNode, "dra-trainer"); why != "" {
			return why
		}
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
	for _, pod := range []string{"bystander", "dra-trainer"} {
		if p, err := cluster.Client.CoreV1().Pods("default").Get(t.Context(), pod, metav1.GetOptions{}); err == nil && p.DeletionTimestamp == nil {
			t.Errorf("pod %s on %s still runs after the upgrade: it was never drained", pod, p.Spec.NodeName)
		}
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

// bystanderPod is a bare pod without a GPU, with a /dev/shm emptyDir, on
// node (deleted at the end).
func bystanderPod(t *testing.T, name, node string) {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.PodSpec{NodeName: node, Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{Name: "c", Image: "registry.example/app:1", VolumeMounts: []corev1.VolumeMount{{Name: "shm", MountPath: "/dev/shm"}}}},
			Volumes:    []corev1.Volume{{Name: "shm", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}}}
	if err := k8s.Create(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), p, client.GracePeriodSeconds(0)) })
}

// draPod is a bare pod on node whose ResourceClaim was allocated a GPU by
// NVIDIA's DRA driver (the claim's allocation written by the test, as the
// scheduler would), both deleted at the end.
func draPod(t *testing.T, name, node string) {
	t.Helper()
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name + "-gpu"},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: nvidiav1.DRADriver}}}}}}
	if err := k8s.Create(t.Context(), claim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), claim) })
	claim.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{{
		Request: "gpu", Driver: nvidiav1.DRADriver, Pool: node, Device: "gpu-0"}}}}
	if err := k8s.Status().Update(t.Context(), claim); err != nil {
		t.Fatal(err)
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.PodSpec{NodeName: node, Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim.Name)}},
			Containers: []corev1.Container{{Name: "c", Image: "registry.example/train:1",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}}}}
	if err := k8s.Create(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), p, client.GracePeriodSeconds(0)) })
}

// neverUnder says what an upgrade does to a running pod that it must not
// ("" when nothing): the reboot of rebooted asked for while bystander runs
// there, or the driver of draNode restarted while draPod runs there.
func neverUnder(ctx context.Context, rebooted, bystander, draNode, draPod string) string {
	running := func(name string) bool {
		p, err := cluster.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		return err == nil && p.DeletionTimestamp == nil
	}
	var list repairv1.NodeRepairList
	if err := k8s.List(ctx, &list, client.HasLabels{gpustack.LabelRebootOf}); err == nil {
		for _, nr := range list.Items {
			if nr.Spec.NodeName == rebooted && nr.Status.RebootRequestedAt != nil && running(bystander) {
				return "the reboot of " + rebooted + " was asked for while pod " + bystander + " ran there un-evicted"
			}
		}
	}
	nm := &maintenancev1.NodeMaintenance{}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "driver-upgrade-" + draNode}, nm); err == nil &&
		nm.Annotations["gpufleet.dev/driver-pod-restarted-at"] != "" && running(draPod) {
		return "the driver of " + draNode + " was restarted while pod " + draPod + " used a GPU there through DRA"
	}
	return ""
}
