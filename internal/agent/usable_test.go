package agent

import (
	"encoding/json"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/testobj"
)

// TestUnusable: what the schema refuses, written anyway, is refused by the
// agent with the reason: an unknown action, an index outside the ladder, a
// GPU action without GPUs or PCI address, a PCI address that is not one.
func TestUnusable(t *testing.T) {
	gpu := func(bus string) []repairv1.GPURef { return []repairv1.GPURef{{PCIBusID: bus}} }
	for name, tc := range map[string]struct {
		mut  func(*repairv1.NodeRepair)
		want string
	}{
		"a kubelet restart":            {},
		"nothing pending":              {mut: func(nr *repairv1.NodeRepair) { nr.Status.Pending = nil }},
		"an unknown action":            {mut: func(nr *repairv1.NodeRepair) { nr.Status.Pending.Action = "RunScript" }, want: "not an action"},
		"a negative index":             {mut: func(nr *repairv1.NodeRepair) { nr.Status.NextAction = -1 }, want: "status.nextAction -1"},
		"an index past the ladder":     {mut: func(nr *repairv1.NodeRepair) { nr.Status.NextAction = 3 }, want: "status.nextAction 3"},
		"the index after the last one": {mut: func(nr *repairv1.NodeRepair) { nr.Status.NextAction = 2 }},
		"a reset without GPUs": {mut: func(nr *repairv1.NodeRepair) { nr.Status.Pending.Action = repairv1.ActionResetGPU },
			want: "names no GPU"},
		"a reset of a GPU without address": {mut: func(nr *repairv1.NodeRepair) {
			nr.Status.Pending.Action, nr.Spec.GPUs = repairv1.ActionResetGPU, gpu("")
		}, want: "has no PCI bus ID"},
		"a PCI address that is an option": {mut: func(nr *repairv1.NodeRepair) {
			nr.Status.Pending.Action, nr.Spec.GPUs = repairv1.ActionValidateGPU, gpu("-r --reset-all")
		}, want: "is not a PCI address"},
		"a reset of a GPU with its address": {mut: func(nr *repairv1.NodeRepair) {
			nr.Status.Pending.Action, nr.Spec.GPUs = repairv1.ActionResetGPU, gpu("0000:3b:00.0")
		}},
		"NVML's 8-digit domain": {mut: func(nr *repairv1.NodeRepair) {
			nr.Status.Pending.Action, nr.Spec.GPUs = repairv1.ActionResetGPU, gpu("00000000:3B:00.0")
		}},
		"a node repair listing a GPU missing from the node": {mut: func(nr *repairv1.NodeRepair) { nr.Spec.GPUs = gpu("") }},
	} {
		t.Run(name, func(t *testing.T) {
			nr := testRepair("gpu-1", repairv1.ActionRestartKubelet)
			if tc.mut != nil {
				tc.mut(nr)
			}
			got := Unusable(nr)
			if (got == "") != (tc.want == "") || !strings.Contains(got, tc.want) || (got != "" && !strings.HasPrefix(got, "refused: ")) {
				t.Errorf("Unusable = %q, want %q", got, tc.want)
			}
		})
	}
}

// FuzzAgentDecodesAnything: whatever JSON a NodeRepair, its node's
// NodeMaintenance and GPUFault hold — values the schema refuses included,
// as an older schema or a forged write leaves them — the agent's reconcile
// of it neither panics nor runs an action Unusable refuses, and a
// disruptive action runs only as Authorize allows.
func FuzzAgentDecodesAnything(f *testing.F) {
	f.Add([]byte(`{"spec":{"nodeName":"gpu-1","actions":["RestartKubelet"]},"status":{"pending":{"action":"RestartKubelet"}}}`), []byte(`{}`), []byte(`{}`))
	f.Add([]byte(`{"spec":{"nodeName":"gpu-1","actions":["ResetGPU","Reboot"],"gpus":[{"pciBusID":"0000:3b:00.0"}]},"status":{"nextAction":-1,"pending":{"action":"ResetGPU"},"gpuMaintenanceName":"m"}}`),
		[]byte(`{"metadata":{"name":"m","namespace":"gpufleet-system"},"spec":{"nodeName":"gpu-1","requestorID":"repair.gpufleet.dev","cordon":false},"status":{"conditions":[{"type":"Ready","status":"True","reason":"Ready"}]}}`),
		[]byte(`{"spec":{"nodeName":"gpu-1","gpu":{"pciBusID":"0000:3b:00.0"}},"status":{"class":"ResetGPU"}}`))
	f.Add([]byte(`{"spec":{"nodeName":"gpu-1","actions":["ValidateGPU"],"gpus":[{"pciBusID":"-i 0"}],"validation":{"level":"Diagnostic","timeoutSeconds":-5}},"status":{"nextAction":9,"pending":{"action":"ValidateGPU"},"bootIDBefore":"x","timeline":[{"step":"ValidateGPU","outcome":"Started"}]}}`),
		[]byte(`{"metadata":{"name":"x"}}`), []byte(`{"metadata":{"name":"gpu-1-x"},"status":{"faults":[{"xid":79}]}}`))
	f.Fuzz(func(t *testing.T, repairJSON, nmJSON, faultJSON []byte) {
		nr := &repairv1.NodeRepair{}
		if json.Unmarshal(repairJSON, nr) != nil {
			return
		}
		nr.Name, nr.ResourceVersion, nr.Spec.NodeName = repairName, "", "gpu-1"
		nm := &maintenancev1.NodeMaintenance{}
		if json.Unmarshal(nmJSON, nm) != nil || nm.Name == "" {
			nm = nil
		}
		gf := &repairv1.GPUFault{}
		if json.Unmarshal(faultJSON, gf) != nil || gf.Name == "" {
			gf = nil
		}
		ran := &recordingExecutor{}
		objs := []client.Object{nr, testobj.Node("gpu-1", testobj.Unschedulable())}
		if nm != nil {
			nm.ResourceVersion = ""
			objs = append(objs, nm)
		}
		if gf != nil {
			gf.ResourceVersion = ""
			objs = append(objs, gf)
		}
		a := newTestAgent(t, "gpu-1", ran, nil, objs...)
		a.ValidationRetry = -1
		before := nr.DeepCopy()
		_ = a.Reconcile(t.Context(), repairName) // errors are retried; a panic fails
		if Unusable(before) != "" && len(ran.calls) > 0 {
			t.Fatalf("ran %v for a repair the agent cannot use: %s", ran.calls, Unusable(before))
		}
		if p := before.Status.Pending; p != nil && Disruptive(p.Action) && len(ran.calls) > 0 {
			var nms []maintenancev1.NodeMaintenance
			if nm != nil {
				nms = append(nms, *nm)
			}
			if v, why := Authorize(before, testobj.Node("gpu-1", testobj.Unschedulable()), "", nms); v != Run {
				t.Fatalf("ran %v although Authorize says %s", ran.calls, why)
			}
		}
	})
}

// TestAgentRecordsWhatItCannotUse: a pending validation with a negative
// status.nextAction (the slice of the remaining ladder once panicked the
// agent, which then crash-looped) is refused and recorded; nothing runs,
// and the index is left as it was.
func TestAgentRecordsWhatItCannotUse(t *testing.T) {
	nr := testRepair("gpu-1", repairv1.ActionValidateGPU)
	nr.Spec.GPUs = []repairv1.GPURef{{PCIBusID: "0000:3b:00.0"}}
	nr.Status.NextAction = -1
	exec := &recordingExecutor{}
	a := newTestAgent(t, "gpu-1", exec, nil, nr, testobj.Node("gpu-1"))
	if err := reconcileRepair(t, a, repairName); err != nil {
		t.Fatal(err)
	}
	got := getRepair(t, a)
	last := got.LastEntry()
	if len(exec.calls) != 0 || got.Status.Pending != nil || last == nil || last.Outcome != repairv1.OutcomeRefused ||
		!strings.Contains(last.Message, "status.nextAction -1") || got.Status.NextAction != -1 {
		t.Errorf("calls %v, pending %+v, last %+v, next %d", exec.calls, got.Status.Pending, last, got.Status.NextAction)
	}
}
