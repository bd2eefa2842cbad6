package takeover_test

import (
	"bytes"
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/liveowner"
	"github.com/gpufleet/gpufleet/internal/takeover"
)

// operatorDeployment is a Deployment as the GPU Operator's chart (or
// gpufleet's) installs it; its pods never schedule (no such node): only
// the Deployment and the lease matter to a takeover.
func operatorDeployment(name string, labels map[string]string) *appsv1.Deployment {
	sel := map[string]string{"app": name}
	podLabels := map[string]string{"app": name}
	for k, v := range labels {
		podLabels[k] = v
	}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: podLabels},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: sel},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: podLabels},
				Spec: corev1.PodSpec{NodeSelector: map[string]string{"gpufleet.dev/no-such-node": "true"},
					Containers: []corev1.Container{{Name: name, Image: "example.com/" + name + ":v1"}}}}},
	}
}

// waitStackGone waits until a stack (garbage-collected after its
// ClusterPolicy) is gone: its DaemonSets, their pods, its RuntimeClass.
func waitStackGone(ctx context.Context, t *testing.T) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		var dss appsv1.DaemonSetList
		if err := k8s.List(ctx, &dss, client.InNamespace(ns)); err != nil {
			return false, err
		}
		var pods corev1.PodList
		if err := k8s.List(ctx, &pods, client.InNamespace(ns)); err != nil {
			return false, err
		}
		stack := slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool { return nvidiav1.PodComponent(p.Labels) == "" })
		err := k8s.Get(ctx, types.NamespacedName{Name: "nvidia"}, &nodev1.RuntimeClass{})
		return len(dss.Items) == 0 && len(stack) == 0 && apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("an earlier stack is still in namespace %s: %v", ns, err)
	}
}

func replicasOf(t *testing.T, name string) (int32, string) {
	t.Helper()
	d := &appsv1.Deployment{}
	if err := k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name}, d); err != nil {
		t.Fatal(err)
	}
	return *d.Spec.Replicas, d.Annotations[takeover.AnnotationScaledDownFrom]
}

func writes(counts map[string]int) []string {
	var out []string
	for k := range counts {
		if devcluster.IsWrite(k) {
			out = append(out, k)
		}
	}
	return out
}

// TestTakeoverCommandFromTheGPUOperator runs `gpufleet takeover --from
// gpu-operator` (its runner, with the command's options) against the GPU
// Operator's converged stack: the dry run writes nothing and plans every
// DaemonSet adopted with no restart; the real run scales the GPU
// Operator's Deployment to 0 and returns once its lease is free; a second
// run writes nothing. TAKEOVER_REPORT=file saves the dry run's report.
func TestTakeoverCommandFromTheGPUOperator(t *testing.T) {
	devtest.NeedCluster(t)
	ctx := t.Context()
	waitStackGone(ctx, t)
	// Registered first, run last: after the ClusterPolicy's deletion, the
	// next test waits for nothing.
	t.Cleanup(func() { waitStackGone(context.Background(), t) })
	st := setUpPreviousStack(t)

	// The GPU Operator (Helm chart labels) and gpufleet, installed in the
	// stack's namespace; the GPU Operator holds its lease.
	gpuOp := operatorDeployment("gpu-operator", map[string]string{"app.kubernetes.io/component": "gpu-operator",
		"app.kubernetes.io/managed-by": "Helm", "app.kubernetes.io/instance": "gpu-operator"})
	own := operatorDeployment("gpufleet-operator", map[string]string{"app.kubernetes.io/name": "gpufleet-operator"})
	for _, d := range []*appsv1.Deployment{gpuOp, own} {
		if err := k8s.Create(ctx, d); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), d) })
	}
	_ = k8s.Delete(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: liveowner.GPUOperator.Lease}})
	lease := holdLease(t)
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), lease) })

	admin, err := cluster.ConfigFor("takeover-admin", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	cfg, wire := devcluster.CountRequests(admin)
	c, err := client.New(cfg, client.Options{Scheme: k8s.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	opts := takeover.Options{Client: c, Direction: takeover.Direction{Operator: takeover.GPUOperator}, Namespace: ns,
		Deployment: "gpufleet-operator", DryRun: true, Out: &out, Timeout: time.Minute, PollInterval: 200 * time.Millisecond}

	// 1. Dry run: the plan, and not one write.
	before := wire.Snapshot()
	if err := takeover.Run(ctx, opts); err != nil {
		t.Fatalf("dry run: %v\n%s", err, out.String())
	}
	if w := writes(wire.Since(before)); len(w) != 0 {
		t.Errorf("the dry run wrote: %v", w)
	}
	report := out.String()
	t.Logf("takeover --from gpu-operator --dry-run:\n%s", report)
	if path := os.Getenv("TAKEOVER_REPORT"); path != "" {
		if err := os.WriteFile(path, []byte(report), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range []string{"kubectl -n gpu-operator scale deployment gpu-operator --replicas=0", "Restarts:\n  none\n",
		"Blocked:\n  none\n", "Problems:\n  none\n"} {
		if !strings.Contains(report, want) {
			t.Errorf("the dry run's report lacks %q", want)
		}
	}
	for name := range st.templates {
		if !strings.Contains(report, "DaemonSet "+name+" ") {
			t.Errorf("the dry run's report does not list DaemonSet %s as adopted", name)
		}
	}
	if n, _ := replicasOf(t, "gpu-operator"); n != 1 {
		t.Errorf("the dry run scaled the GPU Operator to %d", n)
	}

	// 2. For real. The GPU Operator releases its lease once its pod is
	// gone (controller-runtime's release on shutdown), simulated here.
	go func() {
		_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			if n, _ := replicasOf(t, "gpu-operator"); n != 0 {
				return false, nil
			}
			l := &coordinationv1.Lease{}
			if err := k8s.Get(ctx, client.ObjectKeyFromObject(lease), l); err != nil {
				return false, nil //nolint:nilerr // try again
			}
			l.Spec.HolderIdentity = ptr.To("")
			return k8s.Update(ctx, l) == nil, nil
		})
	}()
	out.Reset()
	opts.DryRun = false
	if err := takeover.Run(ctx, opts); err != nil {
		t.Fatalf("takeover: %v\n%s", err, out.String())
	}
	t.Logf("takeover --from gpu-operator:\n%s", out.String())
	if n, from := replicasOf(t, "gpu-operator"); n != 0 || from != "1" {
		t.Errorf("GPU Operator Deployment: %d replicas, %s=%q; want 0 and \"1\"", n, takeover.AnnotationScaledDownFrom, from)
	}
	if n, _ := replicasOf(t, "gpufleet-operator"); n != 1 {
		t.Errorf("gpufleet's Deployment: %d replicas, want 1 (untouched)", n)
	}
	if !strings.Contains(out.String(), "gpufleet takes over") {
		t.Errorf("the takeover does not say that gpufleet takes over:\n%s", out.String())
	}
	if r := restarted(st.pods, stackPods(t)); len(r) != 0 {
		t.Errorf("pods restarted: %v", r)
	}

	// 3. Again: nothing left to do, nothing written.
	out.Reset()
	before = wire.Snapshot()
	if err := takeover.Run(ctx, opts); err != nil {
		t.Fatalf("second takeover: %v\n%s", err, out.String())
	}
	if w := writes(wire.Since(before)); len(w) != 0 {
		t.Errorf("the second run wrote: %v", w)
	}
	if !strings.Contains(out.String(), "Stop first:\n  none (stopped)\n") {
		t.Errorf("the second run still stops something:\n%s", out.String())
	}

	// 4. The way back, --to gpu-operator: gpufleet's Deployment to 0 (its
	// replicas recorded), the GPU Operator's back to its replicas before;
	// nothing restarts; run again, nothing is written.
	back := opts
	back.Direction.Back = true
	out.Reset()
	if err := takeover.Run(ctx, back); err != nil {
		t.Fatalf("takeover --to gpu-operator: %v\n%s", err, out.String())
	}
	t.Logf("takeover --to gpu-operator:\n%s", out.String())
	if n, from := replicasOf(t, "gpufleet-operator"); n != 0 || from != "1" {
		t.Errorf("gpufleet's Deployment after --to: %d replicas, %s=%q; want 0 and \"1\"", n, takeover.AnnotationScaledDownFrom, from)
	}
	if n, from := replicasOf(t, "gpu-operator"); n != 1 || from != "" {
		t.Errorf("the GPU Operator's Deployment after --to: %d replicas, %s=%q; want 1 and none", n, takeover.AnnotationScaledDownFrom, from)
	}
	if r := restarted(st.pods, stackPods(t)); len(r) != 0 {
		t.Errorf("pods restarted on the way back: %v", r)
	}
	out.Reset()
	before = wire.Snapshot()
	if err := takeover.Run(ctx, back); err != nil {
		t.Fatalf("second takeover --to: %v\n%s", err, out.String())
	}
	if w := writes(wire.Since(before)); len(w) != 0 {
		t.Errorf("the second --to run wrote: %v", w)
	}
}
