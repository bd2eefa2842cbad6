package chaos

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
)

// TestLeaderFailover runs two operator replicas with leader election and
// kills the leader in the middle of a rollout: the standby takes over (the
// takeover time is reported) and the independent checker sees no double
// scheduling.
func TestLeaderFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the local cluster (run without -short)")
	}
	ctx := context.Background()
	bin := buildOperator(t)
	const objects = 12
	env, kubeconfig := startEnv(t, devcluster.Options{}, objects+2, 2)
	workload(t, env.Cluster, objects*2)
	setLimits(t, env.Kube)
	chk := newChecker(env.Cluster, env.Kube, "", maxParallel, maxUnavail)
	checkCtx, stopChecker := context.WithCancel(ctx)
	go chk.run(checkCtx)

	lease := []string{"--leader-elect", "--leader-elect-lease-duration=4s", "--leader-elect-renew-deadline=3s", "--leader-elect-retry-period=500ms"}
	replicas := []*operatorProcess{
		{bin: bin, kubeconfig: kubeconfig, dir: t.TempDir(), name: "replica-a", extraArgs: lease},
		{bin: bin, kubeconfig: kubeconfig, dir: t.TempDir(), name: "replica-b", extraArgs: lease},
	}
	for _, r := range replicas {
		r.start(t)
		t.Cleanup(r.kill)
	}
	var leader, standby *operatorProcess
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		for i, r := range replicas {
			if r.isLeader() {
				leader, standby = r, replicas[1-i]
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		for _, r := range replicas {
			data, _ := os.ReadFile(r.logPath)
			t.Logf("%s log:\n%s", r.name, lastLines(string(data), 15))
		}
		t.Fatal("no replica became leader")
	}
	for i := range objects {
		nm := &maintenancev1.NodeMaintenance{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("le-%03d", i)},
			Spec:       maintenancev1.NodeMaintenanceSpec{RequestorID: requestor, NodeName: fmt.Sprintf("gpu-%03d", i), DrainSpec: &maintenancev1.DrainSpec{}},
		}
		if err := env.Kube.Create(ctx, nm); err != nil {
			t.Fatal(err)
		}
	}
	// requestorPass deletes the Ready NodeMaintenance objects, as their
	// requestor would, and returns how many are left (-1: the list failed,
	// transiently; the callers poll again).
	requestorPass := func() int {
		var list maintenancev1.NodeMaintenanceList
		if err := env.Kube.List(ctx, &list, client.InNamespace("default")); err != nil {
			return -1
		}
		for i := range list.Items {
			nm := &list.Items[i]
			if c := meta.FindStatusCondition(nm.Status.Conditions, "Ready"); c != nil && c.Status == metav1.ConditionTrue &&
				nm.DeletionTimestamp == nil && chk.sawReady(nm.Namespace+"/"+nm.Name) {
				_ = env.Kube.Delete(ctx, nm)
			}
		}
		return len(list.Items)
	}
	// Let the rollout get going, then kill the leader.
	_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		left := requestorPass()
		return left >= 0 && left <= objects-3, nil
	})
	leader.kill()
	killedAt := time.Now()
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return standby.isLeader(), nil
	})
	takeover := time.Since(killedAt)
	if err != nil {
		t.Fatalf("standby never took over")
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		left := requestorPass()
		return left == 0, nil
	})
	stopChecker()
	if err != nil {
		t.Fatalf("rollout did not finish after the failover: %d/%d Ready seen", chk.readyCount(), objects)
	}
	chk.final(ctx, t, objects)
	t.Logf("leader killed with SIGKILL; standby took over after %s (lease 4s); %d objects done; max in progress %d (limit %d)",
		takeover.Round(10*time.Millisecond), objects, chk.maxInProgress, maxParallel)
	for _, v := range chk.violations() {
		t.Error(v)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
