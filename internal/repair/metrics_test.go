package repair

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

func TestStateCollector(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := repairv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	node := func(name, pool, state string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{DefaultPoolLabel: pool}}}
		if state != "" {
			n.Labels[LabelState] = state
		}
		return n
	}
	policy := &repairv1.NodeRepairPolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Status: repairv1.NodeRepairPolicyStatus{SuspendedPools: []repairv1.SuspendedPool{{Pool: "b", Node: "b-1", Reason: "RecoveryFailed"}}}}
	gpu := func(name string, faults ...repairv1.GPUFaultEntry) *repairv1.GPUFault {
		return &repairv1.GPUFault{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: repairv1.GPUFaultStatus{Faults: faults}}
	}
	objects := []client.Object{node("a-0", "a", ""), node("a-1", "a", string(repairv1.PhaseRepairing)),
		node("b-1", "b", string(repairv1.PhaseRecoveryFailed)), policy, &repairv1.NodeRepairPolicy{ObjectMeta: metav1.ObjectMeta{Name: "other"}},
		gpu("a-0-gpu-1", repairv1.GPUFaultEntry{Code: 13, Count: 2}, repairv1.GPUFaultEntry{Code: 48, Class: repairv1.GPUClassResetGPU, Count: 1}),
		gpu("a-1-gpu-0", repairv1.GPUFaultEntry{Code: 13, Count: 3}, repairv1.GPUFaultEntry{Code: 0, Class: repairv1.GPUClassReplace, Count: 1}),
		gpu("b-1-gpu-0")}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objects...).Build()
	want := `
# HELP gpufleet_repair_gpu_fault_occurrences GPU faults seen by the node agents (sum of the GPUFault records' counts), by XID code (0: a health counter) and class.
# TYPE gpufleet_repair_gpu_fault_occurrences gauge
gpufleet_repair_gpu_fault_occurrences{class="",code="13"} 5
gpufleet_repair_gpu_fault_occurrences{class="Replace",code="0"} 1
gpufleet_repair_gpu_fault_occurrences{class="ResetGPU",code="48"} 1
# HELP gpufleet_repair_node_state 1 for a node in a repair state (label repair.gpufleet.dev/state: Repairing, RecoveryFailed), with its pool (label gpufleet.dev/pool).
# TYPE gpufleet_repair_node_state gauge
gpufleet_repair_node_state{node="a-1",pool="a",state="Repairing"} 1
gpufleet_repair_node_state{node="b-1",pool="b",state="RecoveryFailed"} 1
# HELP gpufleet_repair_suspended_pool 1 for a pool where a NodeRepairPolicy stopped repairing after a failed repair (status.suspendedPools), with the node whose repair failed.
# TYPE gpufleet_repair_suspended_pool gauge
gpufleet_repair_suspended_pool{node="b-1",policy="default",pool="b"} 1
`
	col := &stateCollector{}
	col.Serve(c, nil)
	if err := testutil.CollectAndCompare(col, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	notElected := &stateCollector{}
	notElected.Serve(c, make(chan struct{}))
	if n := testutil.CollectAndCount(notElected); n != 0 {
		t.Errorf("%d series before the election", n)
	}
}
