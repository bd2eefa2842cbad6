package gpustack_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/gpustack"
)

// olderFields are the fields the "older" ClusterPolicy CRD of these tests
// lacks: two of the spec (one set by the policy) and one of the status
// that gpufleet writes.
var olderFields = []string{"spec.driver.kernelModuleType", "spec.driver.usePrecompiled", "status.components"}

// olderClusterPolicyCRD is gpufleet's ClusterPolicy CRD without the
// properties at paths (dotted, objects only): the schema of an older
// release, as the GPU Operator chart's upgrade hook would put it back.
func olderClusterPolicyCRD(t *testing.T, paths ...string) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	own, err := gpustack.OwnCRDs()
	if err != nil {
		t.Fatal(err)
	}
	crd := own[gpustack.ClusterPolicyCRD].DeepCopy()
	for i := range crd.Spec.Versions {
		for _, p := range paths {
			if !deleteProperty(crd.Spec.Versions[i].Schema.OpenAPIV3Schema, strings.Split(p, ".")) {
				t.Fatalf("gpufleet's ClusterPolicy CRD has no %s", p)
			}
		}
	}
	return crd
}

func deleteProperty(s *apiextensionsv1.JSONSchemaProps, path []string) bool {
	child, ok := s.Properties[path[0]]
	switch {
	case !ok:
		return false
	case len(path) == 1:
		delete(s.Properties, path[0])
		return true
	}
	found := deleteProperty(&child, path[1:])
	s.Properties[path[0]] = child
	return found
}

// replaceClusterPolicyCRD updates the served ClusterPolicy CRD to crd and
// waits until the API server uses its schema: a strictly validated policy
// with spec.driver.kernelModuleType is refused (older) or taken.
func replaceClusterPolicyCRD(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition, older bool) error {
	have := &apiextensionsv1.CustomResourceDefinition{}
	if err := k8s.Get(ctx, client.ObjectKey{Name: crd.Name}, have); err != nil {
		return err
	}
	crd = crd.DeepCopy()
	crd.ResourceVersion = have.ResourceVersion
	if err := k8s.Update(ctx, crd); err != nil {
		return fmt.Errorf("updating CRD %s: %w", crd.Name, err)
	}
	return waitSchema(ctx, older)
}

// waitSchema waits until the API server serves the older ClusterPolicy
// schema (older) or gpufleet's.
func waitSchema(ctx context.Context, older bool) error {
	probe := &nvidiav1.ClusterPolicy{ObjectMeta: metav1.ObjectMeta{Name: "schema-probe"}}
	probe.Spec.Driver.KernelModuleType = "open"
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := k8s.Create(ctx, probe.DeepCopy(), client.DryRunAll, client.FieldValidation(metav1.FieldValidationStrict))
		refused := err != nil && strings.Contains(err.Error(), "kernelModuleType")
		return refused == older && (older || err == nil), nil
	})
}

// An older ClusterPolicy schema put back under a deployed stack (as the
// GPU Operator chart's CRD upgrade hook does): the pass reports it in the
// SchemaCurrent condition with one Warning event, the stack goes on
// (not Degraded, a deleted DaemonSet re-created), nothing is written while
// nothing changes (the status fields the schema lacks are not written
// again and again), and once gpufleet's CRD is back the condition turns
// True without a Warning.
func TestReconcileReportsAnOlderSchemaAndGoesOn(t *testing.T) {
	d := newDirect(t)
	own, err := gpustack.OwnCRDs()
	if err != nil {
		t.Fatal(err)
	}
	r := d.reconciler()
	r.Schemas = &gpustack.ServedSchemas{Ours: own, Served: d.client}
	t.Cleanup(func() {
		ctx := context.Background()
		if err := devcluster.InstallCRDs(ctx, cluster.Config); err != nil {
			t.Errorf("putting gpufleet's CRDs back: %v", err)
		}
		if err := waitSchema(ctx, false); err != nil {
			t.Errorf("gpufleet's ClusterPolicy schema not served again: %v", err)
		}
	})
	nodes := listNodes(t)
	p := createPolicy(t, "cluster-policy", func(p *nvidiav1.ClusterPolicy) { p.Spec.Driver.KernelModuleType = "open" })

	// Rolled out under gpufleet's schema: SchemaCurrent is True.
	converged := rollOut(t, d, r, p.Name, len(nodes.healthy))
	if c := meta.FindStatusCondition(converged.Status.Conditions, gpustack.ConditionSchemaCurrent); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("SchemaCurrent under gpufleet's schema: %+v", c)
	}
	stateBefore := converged.Status.State
	degradedBefore := meta.FindStatusCondition(converged.Status.Conditions, nvidiav1.ConditionDegraded)

	// The older schema.
	if err := replaceClusterPolicyCRD(t.Context(), olderClusterPolicyCRD(t, olderFields...), true); err != nil {
		t.Fatal(err)
	}
	older := d.reconcileWith(r, p.Name)
	if older.err != nil || older.statusWrites() != 1 {
		t.Fatalf("the first pass under the older schema: want one status write: %s", older)
	}
	warnings := older.eventsWith(gpustack.ReasonOlderSchemaInstalled)
	if len(warnings) != 1 || !strings.HasPrefix(warnings[0], "Warning ") || !strings.Contains(warnings[0], "lacks 3 fields of gpufleet's schema: "+strings.Join(olderFields, ", ")) {
		t.Errorf("want one Warning naming the 3 missing fields: %v", older.events)
	}
	got := getPolicy(t, p.Name)
	c := meta.FindStatusCondition(got.Status.Conditions, gpustack.ConditionSchemaCurrent)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != gpustack.ReasonOlderSchemaInstalled ||
		!strings.Contains(c.Message, gpustack.ClusterPolicyCRD) || !strings.Contains(c.Message, "helm upgrade gpufleet-crds") {
		t.Errorf("SchemaCurrent under the older schema: %+v", c)
	}
	if got.Status.State != stateBefore {
		t.Errorf("state %s under the older schema, was %s", got.Status.State, stateBefore)
	}
	if deg := meta.FindStatusCondition(got.Status.Conditions, nvidiav1.ConditionDegraded); deg == nil || degradedBefore == nil ||
		deg.Status != degradedBefore.Status || deg.Reason != degradedBefore.Reason {
		t.Errorf("Degraded under the older schema %+v, was %+v", deg, degradedBefore)
	}
	if got.Status.Components != nil || got.Spec.Driver.KernelModuleType != "" {
		t.Errorf("the older schema keeps status.components (%v) or spec.driver.kernelModuleType (%q): the test no longer removes them",
			got.Status.Components, got.Spec.Driver.KernelModuleType)
	}

	// Nothing changes: nothing is written, nothing reported again
	// (status.components, which it drops, is not written again).
	for i := range 3 {
		if again := d.reconcileWith(r, p.Name); again.err != nil || len(again.writes) != 0 || len(again.wire) != 0 || len(again.events) != 0 {
			t.Errorf("pass %d under the older schema, nothing changed: want no write, no event: %s\nwrite requests: %v", i, again, again.wire)
		}
	}

	// The stack goes on: a deleted DaemonSet is created again.
	ds := &appsv1.DaemonSet{}
	ds.Namespace, ds.Name = ns, "nvidia-device-plugin-daemonset"
	if err := k8s.Delete(t.Context(), ds); err != nil {
		t.Fatal(err)
	}
	waitGone(t, ds)
	if again := d.reconcileWith(r, p.Name); again.err != nil || again.count("Create", "DaemonSet") != 1 {
		t.Errorf("under the older schema a deleted DaemonSet is not created again: %s", again)
	}

	// gpufleet's CRD back: SchemaCurrent turns True, without an event.
	if err := devcluster.InstallCRDs(t.Context(), cluster.Config); err != nil {
		t.Fatal(err)
	}
	if err := waitSchema(t.Context(), false); err != nil {
		t.Fatal(err)
	}
	back := d.reconcileWith(r, p.Name)
	// (The stack's own state may change meanwhile: the re-created
	// DaemonSet's pods becoming Ready.)
	if back.err != nil || back.statusWrites() != 1 || len(back.eventsWith(gpustack.ReasonOlderSchemaInstalled)) != 0 {
		t.Errorf("gpufleet's schema back: want one status write and no %s event: %s", gpustack.ReasonOlderSchemaInstalled, back)
	}
	got = getPolicy(t, p.Name)
	if c := meta.FindStatusCondition(got.Status.Conditions, gpustack.ConditionSchemaCurrent); c == nil || c.Status != metav1.ConditionTrue || c.Reason != "AllFieldsServed" {
		t.Errorf("SchemaCurrent with gpufleet's schema back: %+v", c)
	}
	if len(got.Status.Components) == 0 {
		t.Errorf("status.components not written again with gpufleet's schema back")
	}
	// What the older schema lacks is gone from the stored policy: the
	// first write under it (here gpufleet's status write) stored the
	// policy as that schema reads it. docs/switching.md says to set it again.
	if got.Spec.Driver.KernelModuleType != "" {
		t.Errorf("spec.driver.kernelModuleType %q survived a write under the older schema: docs/switching.md says it is lost",
			got.Spec.Driver.KernelModuleType)
	}
}

// rollOut reconciles with r until every enabled component is Ready on the
// healthy GPU nodes and a pass writes nothing; it returns the policy.
func rollOut(t *testing.T, d *direct, r *gpustack.Reconciler, name string, healthy int) *nvidiav1.ClusterPolicy {
	t.Helper()
	var got *nvidiav1.ClusterPolicy
	passes := 0
	err := wait.PollUntilContextTimeout(t.Context(), 300*time.Millisecond, 90*time.Second, false, func(context.Context) (bool, error) {
		pass := d.reconcileWith(r, name)
		passes++
		if pass.err != nil {
			return false, fmt.Errorf("pass %d: %s", passes, pass)
		}
		got = getPolicy(t, name)
		for _, c := range got.Status.Components {
			if c.Enabled && c.Name != gpustack.MIGManager && c.NodesReady != int32(healthy) {
				return false, nil
			}
		}
		return len(got.Status.Components) > 0 && len(pass.writes) == 0, nil
	})
	if err != nil {
		t.Fatalf("the stack did not roll out in %d passes: %v; status %+v", passes, err, got.Status)
	}
	return got
}
