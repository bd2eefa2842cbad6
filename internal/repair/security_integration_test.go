package repair_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
)

// TestARequestedRebootNeedsItsOwnRequestorsHold: anyone who may create a
// NodeRepair could name, as the NodeMaintenance that holds the node for a
// requested reboot, another requestor's Ready object (here the network
// operator's). The repair refuses: it ends RecoveryFailed, saying whose
// object it is, and the node is not rebooted.
func TestARequestedRebootNeedsItsOwnRequestorsHold(t *testing.T) {
	startOperator(t)
	const node = "a-2"
	boot := bootID(t, node)
	nm := &maintenancev1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "network-maintenance-a-2"},
		Spec: maintenancev1.NodeMaintenanceSpec{RequestorID: "network.operator.nvidia.com", NodeName: node}}
	if err := env.Kube.Create(t.Context(), nm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Kube.Delete(context.Background(), nm) })
	devtest.WaitFor(t, "the network operator's NodeMaintenance Ready", 30*time.Second, func(ctx context.Context) (bool, string) {
		got := &maintenancev1.NodeMaintenance{}
		if err := env.Kube.Get(ctx, client.ObjectKeyFromObject(nm), got); err != nil {
			return false, err.Error()
		}
		return got.IsReady(), fmt.Sprint(got.Phase())
	})
	r := &repairv1.NodeRepair{ObjectMeta: metav1.ObjectMeta{Name: "borrowed-hold-a-2"},
		Spec: repairv1.NodeRepairSpec{NodeName: node, Requestor: "driver-upgrade.gpufleet.nvidia.com", Maintenance: nm.Name,
			Actions: []repairv1.Action{repairv1.ActionReboot},
			Fault:   repairv1.Fault{Rule: "driver-module-in-use", ConditionType: "DriverUpgrade", Status: "True", Since: metav1.Now()}}}
	if err := env.Kube.Create(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Kube.Delete(context.Background(), r) })
	failed := repairOf(t, node, repairv1.PhaseRecoveryFailed, 30*time.Second)
	if !strings.Contains(failed.Status.Message, "is requestor network.operator.nvidia.com's, not driver-upgrade.gpufleet.nvidia.com's") {
		t.Errorf("message %q, want whose object it is", failed.Status.Message)
	}
	time.Sleep(2 * time.Second)
	if got := bootID(t, node); got != boot {
		t.Errorf("node %s rebooted inside another requestor's NodeMaintenance", node)
	}
}

// TestTheSchemaBoundsWhatTheAgentReads: the API server refuses a
// status.nextAction outside the ladder's range and a PCI bus ID that is not
// an address (nvidia-smi -i gets it), in a NodeRepair and in a GPUFault;
// it accepts the forms NVIDIA's tools print, and no address (a GPU missing
// from its node).
func TestTheSchemaBoundsWhatTheAgentReads(t *testing.T) {
	devtest.NeedCluster(t)
	repairWith := func(bus string) *repairv1.NodeRepair {
		return &repairv1.NodeRepair{ObjectMeta: metav1.ObjectMeta{GenerateName: "bounds-"},
			Spec: repairv1.NodeRepairSpec{NodeName: "a-0", Policy: "p", Actions: []repairv1.Action{repairv1.ActionResetGPU},
				GPUs:  []repairv1.GPURef{{PCIBusID: bus}},
				Fault: repairv1.Fault{Rule: "r", ConditionType: "X", Status: "True", Since: metav1.Now()}}}
	}
	for bus, ok := range map[string]bool{"0000:3b:00.0": true, "00000000:3B:00.0": true, "": true,
		"-i 0 --gpu-reset": false, "0000:3b:00.0;reboot": false, "3b:00": false} {
		err := env.Kube.Create(t.Context(), repairWith(bus), client.DryRunAll)
		if (err == nil) != ok {
			t.Errorf("NodeRepair with PCI bus ID %q: %v, want accepted %t", bus, err, ok)
		}
		gf := &repairv1.GPUFault{ObjectMeta: metav1.ObjectMeta{Name: "bounds-gpu"}, Spec: repairv1.GPUFaultSpec{NodeName: "a-0", GPU: repairv1.GPURef{PCIBusID: bus}}}
		if err := env.Kube.Create(t.Context(), gf, client.DryRunAll); (err == nil) != ok {
			t.Errorf("GPUFault with PCI bus ID %q: %v, want accepted %t", bus, err, ok)
		}
	}
	nr := repairWith("0000:3b:00.0")
	if err := env.Kube.Create(t.Context(), nr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Kube.Delete(context.Background(), nr) })
	for next, ok := range map[int32]bool{0: true, 1: true, -1: false, 65: false} {
		nr.Status = repairv1.NodeRepairStatus{NextAction: next}
		err := env.Kube.Status().Update(t.Context(), nr, client.DryRunAll)
		if (err == nil) != ok {
			t.Errorf("status.nextAction %d: %v, want accepted %t", next, err, ok)
		}
	}
}
