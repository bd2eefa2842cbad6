package devcluster_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/go-logr/logr/funcr"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/agent"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
)

// gpuHostNode is the node of TestNodeAgentReportsSimulatedGPUFaults, added
// and removed by the test (the package's other tests count GPU nodes).
const gpuHostNode = "gpuhost-000"

// TestNodeAgentReportsSimulatedGPUFaults runs the node agent (as
// `gpufleet agent` does, under the agent's own RBAC from config/agent) for
// one simulated node, with the simulated GPU host as its source, and
// injects faults through the node's annotations:
//
//   - XID 48 on GPU 3: a GPUFault for GPU 3, class ResetGPU, and the node
//     condition GPUProblem=True, reason ResetGPU, within a bounded wait;
//   - XID 13 (an application's fault) on GPU 1: recorded, GPU 1 stays in
//     service, the condition is not written;
//   - a NodeRepair asking the agent for ResetGPU of GPU 3: the simulated
//     reset, then the agent's clearing: GPU 3 back in service, condition
//     False;
//   - an agent restart (a new manager, re-reading the whole kernel log):
//     GPU 3 stays in service;
//   - GPU 5 falls off the bus (missing from the exporter): class Reboot;
//   - a reboot (the simulated host's): every GPU back in service.
func TestNodeAgentReportsSimulatedGPUFaults(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	if err := devcluster.InstallCRDs(ctx, cluster.Config); err != nil {
		t.Fatal(err)
	}
	kube := gpuHostAdmin(t)
	if err := cluster.AddNodes(ctx, devcluster.NodeSpec{Name: gpuHostNode, Pool: "gpuhost", GPUs: 8}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = kube.DeleteAllOf(ctx, &repairv1.NodeRepair{})
		var faults repairv1.GPUFaultList
		_ = kube.List(ctx, &faults)
		for i := range faults.Items {
			if faults.Items[i].Spec.NodeName == gpuHostNode {
				_ = kube.Delete(ctx, &faults.Items[i])
			}
		}
		_ = cluster.Client.CoreV1().Nodes().Delete(ctx, gpuHostNode, metav1.DeleteOptions{})
	})
	devtest.InstallAgentRBAC(t, kube)
	// The API server's first write of a CRD it has just been given takes
	// seconds (it sets up the storage): done here, not in the timed part.
	warm := &repairv1.GPUFault{ObjectMeta: metav1.ObjectMeta{Name: "warm-up"}, Spec: repairv1.GPUFaultSpec{NodeName: "none", GPU: repairv1.GPURef{PCIBusID: "0000:01:00.0"}}}
	if err := kube.Create(ctx, warm); err != nil {
		t.Fatal(err)
	}
	if err := kube.Delete(ctx, warm); err != nil {
		t.Fatal(err)
	}
	cfg, err := cluster.ConfigFor("system:serviceaccount:gpufleet-system:gpufleet-agent", "system:serviceaccounts", "system:authenticated")
	if err != nil {
		t.Fatal(err)
	}
	sim := devcluster.SimExecutor{Cluster: cluster}
	stop := startGPUHostAgent(t, cfg, sim)

	// XID 48 on GPU 3.
	injected := time.Now()
	if err := cluster.InjectXID(ctx, gpuHostNode, 3, 48); err != nil {
		t.Fatal(err)
	}
	g3 := waitGPUFault(t, kube, 3, "GPU 3 out of service (ResetGPU)", func(f *repairv1.GPUFault) bool {
		return f.Status.Class == repairv1.GPUClassResetGPU
	})
	written := time.Now()
	cond := waitGPUProblem(t, corev1.ConditionTrue, "ResetGPU")
	t.Logf("XID 48 written to the kernel log → GPUFault written (seen by a 10ms poll): %s; → GPUProblem=True seen: %s",
		written.Sub(injected).Round(time.Millisecond), time.Since(injected).Round(time.Millisecond))
	gpu3 := devcluster.SimGPU(gpuHostNode, 3)
	if diff := g3.Spec.GPU; diff.UUID != gpu3.UUID || diff.PCIBusID != gpu3.PCIBusID || diff.Index == nil || *diff.Index != 3 {
		t.Errorf("GPU of the record %+v, want %+v", g3.Spec.GPU, gpu3)
	}
	if k := kernelLogEntries(g3); len(k) != 1 || k[0].Code != 48 || !k[0].Active || len(g3.Status.Occurrences) != 1 {
		t.Errorf("record of GPU 3: %+v", g3.Status)
	}
	if !strings.Contains(cond.Message, "GPU 3 ("+gpu3.UUID+", "+gpu3.PCIBusID+"): Xid 48") {
		t.Errorf("condition message %q", cond.Message)
	}

	// The simulated DRA driver taints GPU 3's device too: one more entry,
	// one more part of the condition's message.
	waitGPUFault(t, kube, 3, "GPU 3's device tainted by the DRA driver", func(f *repairv1.GPUFault) bool {
		return len(f.Status.Faults) == 2 && f.Status.Faults[1].Counter == devcluster.DRATaintXID
	})
	cond = waitGPUProblem(t, corev1.ConditionTrue, "ResetGPU")
	for !strings.Contains(cond.Message, "device taint") && t.Context().Err() == nil {
		time.Sleep(20 * time.Millisecond)
		cond = waitGPUProblem(t, corev1.ConditionTrue, "ResetGPU")
	}

	// XID 13 on GPU 1: recorded, in service, the condition untouched.
	injected = time.Now()
	if err := cluster.InjectXID(ctx, gpuHostNode, 1, 13); err != nil {
		t.Fatal(err)
	}
	g1 := waitGPUFault(t, kube, 1, "XID 13 recorded on GPU 1", func(f *repairv1.GPUFault) bool {
		k := kernelLogEntries(f)
		return len(k) == 1 && k[0].Code == 13
	})
	t.Logf("XID 13 written → GPUFault of GPU 1 seen: %s", time.Since(injected).Round(time.Millisecond))
	if g1.Status.Class != "" || kernelLogEntries(g1)[0].Class != repairv1.GPUClassApplication || len(g1.Status.Occurrences) != 0 {
		t.Errorf("record of GPU 1: %+v, want in service", g1.Status)
	}
	time.Sleep(500 * time.Millisecond)
	if again := gpuHostProblem(t); again == nil || *again != *cond {
		t.Errorf("the condition changed for an application XID: %+v, was %+v", again, cond)
	}

	// ResetGPU of GPU 3, run by the agent through the simulated host.
	nr := &repairv1.NodeRepair{ObjectMeta: metav1.ObjectMeta{Name: "gpuhost-reset"},
		Spec: repairv1.NodeRepairSpec{NodeName: gpuHostNode, Policy: "none", Actions: []repairv1.Action{repairv1.ActionResetGPU},
			GPUs:       []repairv1.GPURef{g3.Spec.GPU},
			Validation: &repairv1.GPUValidation{Level: repairv1.GPUValidationOff}, // the reset alone returns it
			Fault:      repairv1.Fault{Rule: "gpu-reset", ConditionType: repairv1.ConditionGPUProblem, Status: "True", Reason: "ResetGPU", Since: metav1.Now()}}}
	if err := kube.Create(ctx, nr); err != nil {
		t.Fatal(err)
	}
	nr.Status = repairv1.NodeRepairStatus{Phase: repairv1.PhaseRepairing, GPUMaintenanceName: heldForGPUReset(t, kube, nr.Spec.NodeName, nr.Name+"-gpu"),
		Pending: &repairv1.PendingAction{Action: repairv1.ActionResetGPU, RequestedAt: metav1.Now()}}
	if err := kube.Status().Update(ctx, nr); err != nil {
		t.Fatal(err)
	}
	waitGPUFault(t, kube, 3, "GPU 3 back in service after the reset", func(f *repairv1.GPUFault) bool { return f.InService() })
	waitGPUProblem(t, corev1.ConditionFalse, repairv1.ReasonGPUsHealthy)
	// The agent records the outcome after the GPUs are back in service.
	err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := kube.Get(ctx, client.ObjectKeyFromObject(nr), nr); err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		return nr.Status.Pending == nil, nil
	})
	if err != nil {
		t.Fatalf("the agent did not record the reset's outcome: %+v", nr.Status)
	}
	if last := nr.Status.Timeline[len(nr.Status.Timeline)-1]; last.Step != "ResetGPU" || last.Outcome != "Succeeded" {
		t.Errorf("the reset's outcome: %+v", last)
	}

	// An agent restart reads the whole kernel log again: GPU 3 stays in
	// service, XID 13 of GPU 1 is not counted again. A new XID (31, an
	// application's) on GPU 1 shows when the new agent has looked.
	stop()
	stop = startGPUHostAgent(t, cfg, sim)
	if err := cluster.InjectXID(ctx, gpuHostNode, 1, 31); err != nil {
		t.Fatal(err)
	}
	g1 = waitGPUFault(t, kube, 1, "XID 31 counted by the restarted agent", func(f *repairv1.GPUFault) bool {
		return len(kernelLogEntries(f)) == 2
	})
	if e := kernelLogEntries(g1)[0]; e.Code != 13 || e.Count != 1 || !g1.InService() {
		t.Errorf("after the agent restart GPU 1: %+v, want XID 13 counted once, in service", g1.Status)
	}
	if f := getGPUFault(t, kube, 3); !f.InService() || kernelLogEntries(f)[0].Count != 1 || len(f.Status.Occurrences) != 1 {
		t.Errorf("after the agent restart GPU 3: %+v, want in service, XID 48 counted once", f.Status)
	}
	if c := gpuHostProblem(t); c == nil || c.Status != corev1.ConditionFalse {
		t.Errorf("after the agent restart: condition %+v", c)
	}

	// GPU 5 falls off the bus.
	injected = time.Now()
	if err := cluster.SetGPUState(ctx, gpuHostNode, 5, func(s *devcluster.SimGPUState) { s.Missing = true }); err != nil {
		t.Fatal(err)
	}
	g5 := waitGPUFault(t, kube, 5, "GPU 5 missing (Reboot)", func(f *repairv1.GPUFault) bool { return f.Status.Class == repairv1.GPUClassReboot })
	t.Logf("GPU 5 missing written → its GPUFault (Reboot) seen: %s", time.Since(injected).Round(time.Millisecond))
	if g5.Spec.GPU.UUID != devcluster.SimGPU(gpuHostNode, 5).UUID {
		t.Errorf("the missing GPU's record names %+v", g5.Spec.GPU)
	}
	waitGPUProblem(t, corev1.ConditionTrue, "Reboot")

	// A reboot (new boot ID) brings it back: every GPU in service.
	if err := (devcluster.SimExecutor{Cluster: cluster, RebootDowntime: 100 * time.Millisecond}).Execute(ctx,
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: gpuHostNode}}, repairv1.ActionReboot, nil); err != nil {
		t.Fatal(err)
	}
	g5 = waitGPUFault(t, kube, 5, "GPU 5 back after the reboot", func(f *repairv1.GPUFault) bool { return f.InService() })
	waitGPUProblem(t, corev1.ConditionFalse, repairv1.ReasonGPUsHealthy)
	boot := gpuHostNodeBootID(t)
	for _, i := range []int{1, 3, 5} {
		if f := getGPUFault(t, kube, i); f.Status.BootID != boot || !f.InService() {
			t.Errorf("after the reboot GPU %d: boot %q (node %q), class %q", i, f.Status.BootID, boot, f.Status.Class)
		}
	}
	if len(g5.Status.Occurrences) != 1 || slices.ContainsFunc(g5.Status.Faults, func(e repairv1.GPUFaultEntry) bool { return e.Active }) {
		t.Errorf("GPU 5 after the reboot: %+v", g5.Status)
	}
	stop()
}

func gpuHostNodeBootID(t *testing.T) string {
	t.Helper()
	n, err := cluster.Client.CoreV1().Nodes().Get(t.Context(), gpuHostNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Status.NodeInfo.BootID
}

func gpuHostAdmin(t *testing.T) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := repairv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := maintenancev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cluster.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// heldForGPUReset creates, as the repair would, the Ready NodeMaintenance
// that drained the pods of the GPUs to reset on node (requestor
// repair.gpufleet.dev, no cordon), and returns its name: the agent resets
// a GPU only inside it. No maintenance controller runs here: the status is
// written as it would write it.
func heldForGPUReset(t *testing.T, kube client.Client, node, name string) string {
	t.Helper()
	nm := &maintenancev1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: maintenancev1.NodeMaintenanceSpec{NodeName: node, RequestorID: repairv1.RequestorID, Cordon: ptr.To(false)}}
	if err := kube.Create(t.Context(), nm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kube.Delete(context.Background(), nm) })
	nm.Status.Conditions = []metav1.Condition{{Type: maintenancev1.ConditionTypeReady, Status: metav1.ConditionTrue,
		Reason: string(maintenancev1.PhaseReady), LastTransitionTime: metav1.Now()}}
	if err := kube.Status().Update(t.Context(), nm); err != nil {
		t.Fatal(err)
	}
	return name
}

// startGPUHostAgent runs the agent for gpuHostNode until the returned
// stop (or the test's end); a manager error fails the test.
func startGPUHostAgent(t *testing.T, cfg *rest.Config, sim devcluster.SimExecutor) func() {
	t.Helper()
	// The agent's log goes to the test's; its start (watch caches filled,
	// workers running) says the agent is up.
	up := make(chan struct{})
	var once sync.Once
	logger := funcr.New(func(prefix, args string) {
		if strings.Contains(args, `"msg"="agent started"`) && strings.Contains(args, `"gpuMonitor"=true`) {
			once.Do(func() { close(up) })
		}
		t.Log(prefix, args)
	}, funcr.Options{})
	d, err := agent.New(cfg, agent.Options{NodeName: gpuHostNode, Executor: sim, GPUs: sim, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Start(ctx) }()
	select {
	case <-up:
	case <-time.After(30 * time.Second):
		t.Fatal("the agent's GPU monitor did not start within 30s")
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

func getGPUFault(t *testing.T, kube client.Client, gpu int) *repairv1.GPUFault {
	t.Helper()
	f := &repairv1.GPUFault{}
	name := agent.GPUFaultName(gpuHostNode, devcluster.SimGPU(gpuHostNode, gpu).PCIBusID)
	if err := kube.Get(t.Context(), types.NamespacedName{Name: name}, f); err != nil {
		t.Fatalf("GPUFault %s: %v", name, err)
	}
	return f
}

// waitGPUFault waits (at most 20 s) until GPU gpu's record satisfies ok.
func waitGPUFault(t *testing.T, kube client.Client, gpu int, what string, ok func(*repairv1.GPUFault) bool) *repairv1.GPUFault {
	t.Helper()
	name := agent.GPUFaultName(gpuHostNode, devcluster.SimGPU(gpuHostNode, gpu).PCIBusID)
	f := &repairv1.GPUFault{}
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := kube.Get(ctx, types.NamespacedName{Name: name}, f); err != nil {
			return false, nil //nolint:nilerr // not written yet
		}
		return ok(f), nil
	})
	if err != nil {
		n, _ := cluster.Client.CoreV1().Nodes().Get(t.Context(), gpuHostNode, metav1.GetOptions{})
		t.Fatalf("%s: not seen within 20s; GPUFault %s: %+v\nkernel log of boot %s:\n%s", what, name, f.Status,
			n.Annotations[devcluster.AnnotationKmsgBoot], n.Annotations[devcluster.AnnotationKmsg])
	}
	return f
}

func gpuHostProblem(t *testing.T) *corev1.NodeCondition {
	t.Helper()
	n, err := cluster.Client.CoreV1().Nodes().Get(t.Context(), gpuHostNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range n.Status.Conditions {
		if c.Type == repairv1.ConditionGPUProblem {
			return &c
		}
	}
	return nil
}

// waitGPUProblem waits (at most 20 s) for the node's GPUProblem condition.
func waitGPUProblem(t *testing.T, status corev1.ConditionStatus, reason string) *corev1.NodeCondition {
	t.Helper()
	var c *corev1.NodeCondition
	err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		c = gpuHostProblem(t)
		return c != nil && c.Status == status && c.Reason == reason, nil
	})
	if err != nil {
		t.Fatalf("GPUProblem=%s %s not seen within 20s: %+v", status, reason, c)
	}
	return c
}

// TestInProcessAgentReportsSimulatedGPUFaults: the in-process agents of
// the simulation (devcluster.AddInProcessAgent, as gpufleet dev and the operator's
// tests run them), under the operator's generated RBAC, report an XID of a
// node's GPU and clear it after a ResetGPU.
func TestInProcessAgentReportsSimulatedGPUFaults(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	const node = "gpuhost-001"
	if err := devcluster.InstallCRDs(ctx, cluster.Config); err != nil {
		t.Fatal(err)
	}
	kube := gpuHostAdmin(t)
	if err := cluster.AddNodes(ctx, devcluster.NodeSpec{Name: node, Pool: "gpuhost", GPUs: 4}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = kube.DeleteAllOf(ctx, &repairv1.NodeRepair{})
		_ = kube.DeleteAllOf(ctx, &repairv1.GPUFault{})
		_ = cluster.Client.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{})
	})
	cfg, err := cluster.OperatorConfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := repairv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"},
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
	if err != nil {
		t.Fatal(err)
	}
	sim := devcluster.SimExecutor{Cluster: cluster}
	if err := devcluster.AddInProcessAgent(mgr, sim, nil); err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})

	if err := cluster.InjectXID(ctx, node, 2, 95); err != nil {
		t.Fatal(err)
	}
	name := agent.GPUFaultName(node, devcluster.SimGPU(node, 2).PCIBusID)
	f := &repairv1.GPUFault{}
	poll := func(what string, ok func() bool) {
		t.Helper()
		err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			if err := kube.Get(ctx, types.NamespacedName{Name: name}, f); err != nil {
				return false, nil //nolint:nilerr // not written yet
			}
			return ok(), nil
		})
		if err != nil {
			t.Fatalf("%s: not seen within 30s: %+v", what, f.Status)
		}
	}
	poll("GPU 2 out of service (XID 95: ResetGPU)", func() bool { return f.Status.Class == repairv1.GPUClassResetGPU })
	nr := &repairv1.NodeRepair{ObjectMeta: metav1.ObjectMeta{Name: "gpuhost-inprocess-reset"},
		Spec: repairv1.NodeRepairSpec{NodeName: node, Policy: "none", Actions: []repairv1.Action{repairv1.ActionResetGPU},
			GPUs:       []repairv1.GPURef{f.Spec.GPU},
			Validation: &repairv1.GPUValidation{Level: repairv1.GPUValidationOff}, // the reset alone returns it
			Fault:      repairv1.Fault{Rule: "gpu-reset", ConditionType: repairv1.ConditionGPUProblem, Status: "True", Reason: "ResetGPU", Since: metav1.Now()}}}
	if err := kube.Create(ctx, nr); err != nil {
		t.Fatal(err)
	}
	nr.Status = repairv1.NodeRepairStatus{Phase: repairv1.PhaseRepairing, GPUMaintenanceName: heldForGPUReset(t, kube, nr.Spec.NodeName, nr.Name+"-gpu"),
		Pending: &repairv1.PendingAction{Action: repairv1.ActionResetGPU, RequestedAt: metav1.Now()}}
	if err := kube.Status().Update(ctx, nr); err != nil {
		t.Fatal(err)
	}
	poll("GPU 2 back in service after the reset", f.InService)
	// The condition follows the record (a write of its own).
	var last corev1.NodeCondition
	err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := cluster.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		for _, c := range n.Status.Conditions {
			if c.Type == repairv1.ConditionGPUProblem {
				last = c
				return c.Status == corev1.ConditionFalse && c.Reason == repairv1.ReasonGPUsHealthy, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("condition after the reset: %+v, want False/%s within 30s", last, repairv1.ReasonGPUsHealthy)
	}
}

// kernelLogEntries are a record's entries read from the kernel log (not
// from counters, nor from the DRA driver's device taints, which the
// simulated driver also sets for an XID).
func kernelLogEntries(f *repairv1.GPUFault) []repairv1.GPUFaultEntry {
	var out []repairv1.GPUFaultEntry
	for _, e := range f.Status.Faults {
		if e.Code != 0 && e.Counter == "" {
			out = append(out, e)
		}
	}
	return out
}
