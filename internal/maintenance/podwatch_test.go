package maintenance

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

// testPod is a running pod on node "a" (the fake clientset ignores the
// watch's field selector, so every test pod is on the watched node).
func testPod(namespace, name string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels},
		Spec:       corev1.PodSpec{NodeName: "a"},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

// nextChange waits for the watch to announce a node.
func nextChange(t *testing.T, w *PodWatch) string {
	t.Helper()
	select {
	case e := <-w.Changes():
		return e.Object
	case <-time.After(10 * time.Second):
		t.Fatal("no change announced")
		return ""
	}
}

func noChange(t *testing.T, w *PodWatch) {
	t.Helper()
	select {
	case e := <-w.Changes():
		t.Fatalf("unexpected change of %s", e.Object)
	case <-time.After(100 * time.Millisecond):
	}
}

func TestPodWatchFollowsItsHolders(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// The fake clientset ignores field selectors: every pod is on node a.
	kube := fake.NewClientset(testPod("default", "train", nil))
	w := NewPodWatch(kube)
	first := types.NamespacedName{Namespace: "default", Name: "first"}
	second := types.NamespacedName{Namespace: "default", Name: "second"}

	w.Hold(first, "a")
	if _, synced := w.Pods("a"); synced {
		t.Fatal("a watch held before Start must not report pods")
	}
	done := make(chan struct{})
	go func() { _ = w.Start(ctx); close(done) }()
	if got := nextChange(t, w); got != "a" {
		t.Fatalf("sync announced %q, want a", got)
	}
	pods, synced := w.Pods("a")
	if !synced || len(pods) != 1 || pods[0].Name != "train" {
		t.Fatalf("Pods(a) = %v, %t; want [train], true", pods, synced)
	}

	// A phase change and a deletion are announced; a label change is not.
	p := testPod("default", "train", map[string]string{"x": "y"})
	if _, err := kube.CoreV1().Pods("default").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	noChange(t, w)
	p.Status.Phase = corev1.PodSucceeded
	if _, err := kube.CoreV1().Pods("default").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := nextChange(t, w); got != "a" {
		t.Fatalf("phase change announced %q, want a", got)
	}
	if err := kube.CoreV1().Pods("default").Delete(ctx, "train", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := nextChange(t, w); got != "a" {
		t.Fatalf("deletion announced %q, want a", got)
	}

	// Two holders share one watch; it ends with the last of them.
	w.Hold(second, "a")
	w.Hold(second, "a") // holding twice is holding once
	w.Release(first)
	if _, synced := w.Pods("a"); !synced {
		t.Fatal("the watch must stay while another object holds the node")
	}
	w.Release(second)
	w.Release(second) // releasing twice is harmless
	if _, synced := w.Pods("a"); synced {
		t.Fatal("the watch must end with its last holder")
	}
	if len(w.nodes) != 0 || len(w.holders) != 0 {
		t.Errorf("left nodes %v holders %v", w.nodes, w.holders)
	}

	// A watch started after Start syncs on its own.
	w.Hold(first, "b")
	if got := nextChange(t, w); got != "b" {
		t.Fatalf("sync announced %q, want b", got)
	}
	cancel()
	<-done
	if len(w.nodes) != 0 {
		t.Errorf("watches left after Start returned: %v", w.nodes)
	}
}

func TestPodsFromServesTheDrainListFromTheWatch(t *testing.T) {
	pods := []corev1.Pod{
		*testPod("default", "train", map[string]string{"app": "train"}),
		*testPod("default", "serve", map[string]string{"app": "serve"}),
		*testPod("other", "batch", map[string]string{"app": "train"}),
	}
	// The API server has a pod the watch has not seen: only a query the
	// watch cannot answer reaches it.
	live := fake.NewClientset(testPod("default", "live", nil))
	c := podsFrom{Interface: live, pods: pods}
	cases := map[string]struct {
		namespace string
		opts      metav1.ListOptions
		want      []string
	}{
		"all pods of the node":       {"", metav1.ListOptions{FieldSelector: "spec.nodeName=a"}, []string{"train", "serve", "batch"}},
		"label selector":             {"", metav1.ListOptions{LabelSelector: "app=train", FieldSelector: "spec.nodeName=a"}, []string{"train", "batch"}},
		"namespace":                  {"default", metav1.ListOptions{LabelSelector: "app=train"}, []string{"train"}},
		"another node":               {"", metav1.ListOptions{FieldSelector: "spec.nodeName=b"}, nil},
		"other fields go to the API": {"", metav1.ListOptions{FieldSelector: "status.phase=Running"}, []string{"live"}},
		"selector that matches none": {"", metav1.ListOptions{LabelSelector: "app in (x)"}, nil},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			list, err := c.CoreV1().Pods(tc.namespace).List(t.Context(), tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range list.Items {
				got = append(got, p.Name)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("listed (-want +got):\n%s", diff)
			}
		})
	}
	if _, err := c.CoreV1().Pods("").List(t.Context(), metav1.ListOptions{LabelSelector: "app in"}); err == nil {
		t.Error("a malformed selector must be an error")
	}
}

// A drain asks the API server for each DaemonSet of its node's pods once
// within daemonSetSeenFor, not at every step (the drain library looks each
// DaemonSet pod's owner up every time it lists the pods to evict); a
// DaemonSet that is not found is asked for again.
func TestDrainAsksForEachDaemonSetOncePerMinute(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "gpu-plugin", UID: "ds-1"}}
	owned := func(name, owner string) corev1.Pod {
		p := testPod("kube-system", name, nil)
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: owner, UID: "ds-1", Controller: ptr.To(true)}}
		return *p
	}
	pods := []corev1.Pod{owned("gpu-plugin-a", "gpu-plugin"), owned("orphan-a", "deleted"), *testPod("default", "train", nil)}
	kube := fake.NewClientset(ds)
	r := &Reconciler{Kube: kube, Clock: clk}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a"},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	gets := func() map[string]int {
		out := map[string]int{}
		for _, a := range kube.Actions() {
			if g, ok := a.(clienttesting.GetAction); ok && a.GetResource().Resource == "daemonsets" {
				out[g.GetName()]++
			}
		}
		return out
	}
	step := func() []string {
		t.Helper()
		helper, err := r.drainHelper(t.Context(), &maintenancev1.DrainSpec{Force: true}, node, pods)
		if err != nil {
			t.Fatal(err)
		}
		list, errs := helper.GetPodsForDeletion("a")
		if len(errs) > 0 {
			t.Fatal(errs)
		}
		var names []string
		for _, p := range list.Pods() {
			names = append(names, p.Name)
		}
		return names
	}
	for range 5 {
		if got, want := step(), []string{"orphan-a", "train"}; !cmp.Equal(got, want) {
			t.Fatalf("pods to evict %v, want %v (the DaemonSet's pod stays, the orphan goes)", got, want)
		}
	}
	if diff := cmp.Diff(map[string]int{"gpu-plugin": 1, "deleted": 5}, gets()); diff != "" {
		t.Errorf("DaemonSet lookups in five steps (-want +got):\n%s", diff)
	}
	clk.Step(daemonSetSeenFor + time.Second)
	step()
	if got := gets()["gpu-plugin"]; got != 2 {
		t.Errorf("after %s the DaemonSet was asked for %d times in all, want 2", daemonSetSeenFor, got)
	}
}
