package gpustack

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
)

func TestPolicyCollector(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := nvidiav1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	active := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "cluster-policy"}, Status: nvidiav1.ClusterPolicyStatus{
		State:      nvidiav1.StateNotReady,
		Conditions: []metav1.Condition{{Type: nvidiav1.ConditionDegraded, Status: metav1.ConditionTrue, Reason: "NodesDegraded"}},
		Components: []nvidiav1.ComponentStatus{
			{Name: "driver", Enabled: true, NodesDesired: 4, NodesReady: 3},
			{Name: "dcgm", Enabled: false},
		},
	}}
	ignored := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "second"}, Status: nvidiav1.ClusterPolicyStatus{State: nvidiav1.StateIgnored}}
	fresh := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "fresh"}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects([]client.Object{active, ignored, fresh}...).Build()
	want := `
# HELP gpufleet_gpustack_component_nodes_desired GPU nodes that should run an enabled component of the active ClusterPolicy.
# TYPE gpufleet_gpustack_component_nodes_desired gauge
gpufleet_gpustack_component_nodes_desired{component="driver",policy="cluster-policy"} 4
# HELP gpufleet_gpustack_component_nodes_ready GPU nodes where an enabled component of the active ClusterPolicy runs Ready.
# TYPE gpufleet_gpustack_component_nodes_ready gauge
gpufleet_gpustack_component_nodes_ready{component="driver",policy="cluster-policy"} 3
# HELP gpufleet_gpustack_degraded 1 when a component pod has not been Ready for longer than the degraded threshold on some node (condition Degraded), else 0.
# TYPE gpufleet_gpustack_degraded gauge
gpufleet_gpustack_degraded{policy="cluster-policy"} 1
# HELP gpufleet_gpustack_ready 1 when every enabled component is Ready on every GPU node (ClusterPolicy state ready), else 0.
# TYPE gpufleet_gpustack_ready gauge
gpufleet_gpustack_ready{policy="cluster-policy"} 0
`
	col := &policyCollector{}
	col.Serve(c, nil)
	if err := testutil.CollectAndCompare(col, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	notElected := &policyCollector{}
	notElected.Serve(c, make(chan struct{}))
	if n := testutil.CollectAndCount(notElected); n != 0 {
		t.Errorf("%d series before the election", n)
	}
}
