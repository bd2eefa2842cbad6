package repair_test

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	agentconfig "github.com/gpufleet/gpufleet/config/agent"
	"github.com/gpufleet/gpufleet/internal/agent"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
)

// TestAgentRunsItsNodesActionsUnderItsOwnRBAC installs the agent's RBAC from
// config/agent, runs the agent (as `gpufleet agent` does) for one
// node with that identity, and checks that it runs a pending action of its
// node — and leaves another node's alone.
func TestAgentRunsItsNodesActionsUnderItsOwnRBAC(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	devtest.InstallAgentRBAC(t, env.Kube)
	ds := &appsv1.DaemonSet{}
	if err := yaml.UnmarshalStrict(agentconfig.DaemonSet, ds); err != nil {
		t.Fatalf("config/agent/daemonset.yaml: %v", err)
	}
	if c := ds.Spec.Template.Spec.Containers[0]; !ds.Spec.Template.Spec.HostPID || len(c.Command) != 1 || c.Command[0] != "/gpufleet-agent" || c.Env[0].ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("agent DaemonSet: hostPID %t, command %v, env %v", ds.Spec.Template.Spec.HostPID, c.Command, c.Env)
	}
	startAgent(t, agent.Options{NodeName: "a-0", Executor: devcluster.SimExecutor{Cluster: env.Cluster}})

	mine := pendingRepair(t, "agent-a-0", "a-0")
	other := pendingRepair(t, "agent-b-0", "b-0")
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := env.Kube.Get(ctx, client.ObjectKeyFromObject(mine), mine); err != nil {
			return false, nil //nolint:nilerr // keep polling
		}
		return mine.Status.Pending == nil, nil
	})
	if err != nil {
		t.Fatalf("the agent did not run its node's action: %+v", mine.Status)
	}
	if got := timelineSteps(mine); got != "RestartNTP:Started RestartNTP:Succeeded" || mine.Status.NextAction != 1 {
		t.Errorf("timeline %q next %d", got, mine.Status.NextAction)
	}
	time.Sleep(time.Second)
	if err := env.Kube.Get(ctx, client.ObjectKeyFromObject(other), other); err != nil {
		t.Fatal(err)
	}
	if other.Status.Pending == nil {
		t.Errorf("the agent of a-0 ran an action of node b-0")
	}
}

// startAgent runs the node agent as `gpufleet agent` does, with the
// agent's own identity (its RBAC from config/agent), until the test ends.
func startAgent(t *testing.T, opts agent.Options) {
	t.Helper()
	cfg, err := env.ConfigFor("system:serviceaccount:"+ns+":gpufleet-agent", "system:serviceaccounts", "system:authenticated")
	if err != nil {
		t.Fatal(err)
	}
	d, err := agent.New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Start(mctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	})
}

func pendingRepair(t *testing.T, name, node string) *repairv1.NodeRepair {
	t.Helper()
	r := &repairv1.NodeRepair{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: repairv1.NodeRepairSpec{NodeName: node, Policy: "none", Actions: []repairv1.Action{repairv1.ActionRestartNTP},
			Fault: repairv1.Fault{Rule: "ntp-problem", ConditionType: "NTPProblem", Status: "True", Since: metav1.Now()}},
	}
	if err := env.Kube.Create(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Kube.Delete(context.Background(), r) })
	r.Status = repairv1.NodeRepairStatus{Phase: repairv1.PhaseRepairing,
		Pending: &repairv1.PendingAction{Action: repairv1.ActionRestartNTP, RequestedAt: metav1.Now()}}
	if err := env.Kube.Status().Update(t.Context(), r); err != nil {
		t.Fatal(err)
	}
	return r
}
