package maintenance

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

func TestObjectCollector(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := maintenancev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	start := metav1.NewTime(time.Unix(1_800_000_000, 0))
	nm := func(name, phase, message string, conds ...metav1.Condition) *maintenancev1.NodeMaintenance {
		o := &maintenancev1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: maintenancev1.NodeMaintenanceSpec{RequestorID: "example.com", NodeName: "node-" + name}}
		if phase != "" {
			o.Status.Conditions = append(o.Status.Conditions, metav1.Condition{Type: maintenancev1.ConditionTypeReady, Status: metav1.ConditionFalse, Reason: phase, Message: message})
		}
		o.Status.Conditions = append(o.Status.Conditions, conds...)
		if phase == string(maintenancev1.PhaseDraining) {
			o.Status.Drain = &maintenancev1.DrainStatus{StartTime: &start}
		}
		return o
	}
	blocked := metav1.Condition{Type: maintenancev1.ConditionTypeDrainBlocked, Status: metav1.ConditionTrue, Reason: "DrainTimeout"}
	pending := string(maintenancev1.PhasePending)
	objects := []client.Object{
		nm("new", "", ""),
		nm("slots", pending, "maxParallelOperations reached: 2/2 nodes in maintenance"),
		nm("zero", pending, "maxParallelOperations is 0: no new maintenance is scheduled"),
		nm("budget", pending, "maxUnavailable budget exhausted: 3/3 nodes unavailable"),
		nm("held", pending, "node gpu-1 is in maintenance for firmware.example.com"),
		nm("ranked", pending, "another request for node gpu-1 ranks higher (default/x)"),
		nm("gone", pending, "node gpu-9 does not exist"),
		nm("window", pending, "outside maintenance window; next opens 2026-12-05T02:00:00Z"),
		nm("exclusion", pending, `in maintenance exclusion "freeze" until 2027-01-02T00:00:00Z; next opens 2027-01-02T02:00:00Z`),
		nm("pool", pending, "pool a: maxUnavailable budget exhausted: 1/1 nodes unavailable"),
		nm("odd", pending, "something new"),
		nm("draining", string(maintenancev1.PhaseDraining), ""),
		nm("stuck", string(maintenancev1.PhaseDraining), "", blocked),
		nm("ready", string(maintenancev1.PhaseReady), ""),
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objects...).Build()
	want := `
# HELP gpufleet_maintenance_drain_blocked 1 for a NodeMaintenance whose drain does not finish: refused by the drain rules (condition DrainBlocked, reason DrainFailed) or past its timeout with pods still on the node (reason DrainBlocked).
# TYPE gpufleet_maintenance_drain_blocked gauge
gpufleet_maintenance_drain_blocked{name="stuck",namespace="default",node="node-stuck"} 1
# HELP gpufleet_maintenance_drain_start_time_seconds When the drain of a NodeMaintenance in phase Draining began (Unix time).
# TYPE gpufleet_maintenance_drain_start_time_seconds gauge
gpufleet_maintenance_drain_start_time_seconds{name="draining",namespace="default",node="node-draining"} 1.8e+09
gpufleet_maintenance_drain_start_time_seconds{name="stuck",namespace="default",node="node-stuck"} 1.8e+09
# HELP gpufleet_maintenance_objects NodeMaintenance objects by phase.
# TYPE gpufleet_maintenance_objects gauge
gpufleet_maintenance_objects{phase="Cordon"} 0
gpufleet_maintenance_objects{phase="Draining"} 2
gpufleet_maintenance_objects{phase="Pending"} 11
gpufleet_maintenance_objects{phase="Ready"} 1
gpufleet_maintenance_objects{phase="RequestorFailed"} 0
gpufleet_maintenance_objects{phase="Scheduled"} 0
gpufleet_maintenance_objects{phase="WaitForPodCompletion"} 0
# HELP gpufleet_maintenance_pending_objects Pending NodeMaintenance objects by why they wait (max_parallel, max_unavailable: the cluster's or a pool's limit; window: outside a maintenance window or in an exclusion; node_busy, node_missing, other; none: no reason written yet).
# TYPE gpufleet_maintenance_pending_objects gauge
gpufleet_maintenance_pending_objects{reason="max_parallel"} 2
gpufleet_maintenance_pending_objects{reason="max_unavailable"} 2
gpufleet_maintenance_pending_objects{reason="node_busy"} 2
gpufleet_maintenance_pending_objects{reason="node_missing"} 1
gpufleet_maintenance_pending_objects{reason="none"} 1
gpufleet_maintenance_pending_objects{reason="other"} 1
gpufleet_maintenance_pending_objects{reason="window"} 2
`
	col := &objectCollector{}
	col.Serve(c, nil)
	if err := testutil.CollectAndCompare(col, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	// Not the leader yet: nothing.
	notElected := &objectCollector{}
	notElected.Serve(c, make(chan struct{}))
	if n := testutil.CollectAndCount(notElected); n != 0 {
		t.Errorf("%d series before the election", n)
	}
}
