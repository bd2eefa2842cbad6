package gpustack_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/kubectl/pkg/util/podutils"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/gpustack"
)

// With spec.domains.upgradeByDomain a driver change requests maintenance
// for every node of a domain at once, beyond maxParallelUpgrades (1 here),
// while a node in no domain still goes alone and a domain waits while the
// limit is reached: at no moment are two nodes upgrading unless they are
// all of one domain.
func TestDriverUpgradeByDomainRequestsWholeDomains(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	domains := map[string][]string{"rack-0": {"gpu-001", "gpu-002", "gpu-005"}, "rack-1": {"gpu-003", "gpu-004"}}
	domainOf := map[string]string{}
	for d, nodes := range domains {
		for _, n := range nodes {
			domainOf[n] = d
			labelNode(t, n, devcluster.LabelGPUClique, d)
		}
	}
	t.Cleanup(func() {
		for n := range domainOf {
			labelNode(t, n, devcluster.LabelGPUClique, "")
		}
		labelNode(t, "unhealthy-gpu-007", nvidiav1.LabelUpgradeState, "")
	})
	setMaintenanceConfig(t, maintenancev1.MaintenanceOperatorConfigSpec{MaxParallelOperations: ptr.To(intstr.FromInt32(3)),
		Domains: &maintenancev1.MaintenanceDomains{NodeLabel: devcluster.LabelGPUClique, UpgradeByDomain: true}})

	startOperator(t, operatorCfg)
	policy := v16Policy(t)
	if err := k8s.Create(ctx, policy); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), policy) })
	healthy := []string{"gpu-000", "gpu-001", "gpu-002", "gpu-003", "gpu-004", "gpu-005", "gpu-006"}
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 90*time.Second, true, func(context.Context) (bool, error) {
		return component(getPolicy(t, "cluster-policy"), gpustack.Driver).NodesReady == int32(len(healthy)), nil
	}); err != nil {
		t.Fatalf("drivers not Ready: %+v", getPolicy(t, "cluster-policy").Status)
	}

	var (
		mu        sync.Mutex
		sawWhole  = map[string]bool{}
		maxAtOnce int
	)
	stop := devtest.CheckWhile(t, func(ctx context.Context) string {
		var nms maintenancev1.NodeMaintenanceList
		if err := k8s.List(ctx, &nms, client.InNamespace(ns)); err != nil {
			return ""
		}
		var upgrading []string
		for _, m := range nms.Items {
			if m.Spec.RequestorID == gpustack.UpgradeRequestor && m.DeletionTimestamp == nil {
				upgrading = append(upgrading, m.Spec.NodeName)
			}
		}
		sort.Strings(upgrading)
		mu.Lock()
		defer mu.Unlock()
		maxAtOnce = max(maxAtOnce, len(upgrading))
		if len(upgrading) < 2 {
			return ""
		}
		d := domainOf[upgrading[0]]
		for _, n := range upgrading {
			if domainOf[n] == "" || domainOf[n] != d {
				return fmt.Sprintf("%v upgrading at once (maxParallelUpgrades 1): only the nodes of one domain may", upgrading)
			}
		}
		if slices.Equal(upgrading, domains[d]) {
			sawWhole[d] = true
		}
		return ""
	})
	updatePolicy(t, func(p *nvidiav1.ClusterPolicy) {
		p.Spec.Driver.Version = "550.54.15"
		p.Spec.Driver.UpgradePolicy = &nvidiav1.DriverUpgradePolicySpec{MaxParallelUpgrades: ptr.To[int32](1)}
	})
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, n := range healthy {
			pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=driver", FieldSelector: "spec.nodeName=" + n})
			if err != nil || len(pods.Items) != 1 || !strings.Contains(pods.Items[0].Spec.Containers[0].Image, ":550.54.15-") || !podutils.IsPodReady(&pods.Items[0]) {
				return false, nil //nolint:nilerr // not yet
			}
		}
		var nms maintenancev1.NodeMaintenanceList
		if err := k8s.List(ctx, &nms, client.InNamespace(ns)); err != nil || len(nms.Items) != 0 {
			return false, nil //nolint:nilerr // not yet (the broken node fails after the upgrade timeout)
		}
		return true, nil
	})
	stop()
	if err != nil {
		var nms maintenancev1.NodeMaintenanceList
		_ = k8s.List(context.Background(), &nms, client.InNamespace(ns))
		t.Fatalf("rollout did not finish: %v; maintenance left: %d", err, len(nms.Items))
	}
	mu.Lock()
	defer mu.Unlock()
	for d, nodes := range domains {
		if !sawWhole[d] {
			t.Errorf("domain %s (%v) never seen upgrading whole at once (at most %d nodes at once)", d, nodes, maxAtOnce)
		}
	}
}

// labelNode sets (value "": removes) one label of a node, if the node is
// there (an earlier test may have deleted it).
func labelNode(t *testing.T, node, key, value string) {
	t.Helper()
	v := "null"
	if value != "" {
		v = fmt.Sprintf("%q", value)
	}
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:%s}}}`, key, v)
	_, err := cluster.Client.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("labelling node %s: %v", node, err)
	}
}

// setMaintenanceConfig sets the spec of the maintenance config "default"
// for the test, then puts back what was there (or deletes it).
func setMaintenanceConfig(t *testing.T, spec maintenancev1.MaintenanceOperatorConfigSpec) {
	t.Helper()
	key := types.NamespacedName{Namespace: ns, Name: maintenancev1.DefaultConfigName}
	cfg := &maintenancev1.MaintenanceOperatorConfig{}
	err := k8s.Get(t.Context(), key, cfg)
	if apierrors.IsNotFound(err) {
		cfg = &maintenancev1.MaintenanceOperatorConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: key.Name}, Spec: spec}
		if err := k8s.Create(t.Context(), cfg); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), cfg) })
	} else {
		if err != nil {
			t.Fatal(err)
		}
		before := cfg.Spec
		update := func(ctx context.Context, s maintenancev1.MaintenanceOperatorConfigSpec) error {
			return retry.RetryOnConflict(retry.DefaultRetry, func() error {
				c := &maintenancev1.MaintenanceOperatorConfig{}
				if err := k8s.Get(ctx, key, c); err != nil {
					return err
				}
				c.Spec = s
				return k8s.Update(ctx, c)
			})
		}
		if err := update(t.Context(), spec); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = update(context.Background(), before) })
	}
	got := &maintenancev1.MaintenanceOperatorConfig{}
	if err := k8s.Get(t.Context(), key, got); err != nil {
		t.Fatal(err)
	}
	if d := got.Spec.Domains; d == nil || d.UpgradeByDomain != spec.Domains.UpgradeByDomain {
		t.Fatalf("the API server kept spec.domains %+v of %+v: is the MaintenanceOperatorConfig CRD current (make generate)?", d, spec.Domains)
	}
}
