package maintenance

// What a maintenance never does to the jobs it is there to protect, tested
// on the local cluster's API server with the lifecycle Reconciler driven
// step by step (lifecycle_direct_test.go): a drain refused at once is not
// a drain that timed out, and pods it did not choose never refuse it; an
// uncordon from outside is cordoned again; a drainSpec that asks for more
// drains again; gpufleet's own requestors' objects are not garbage-
// collected under them; and no sequence of maintenances leaves a node
// cordoned that no administrator cordoned.

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

// podOn creates a bare pod bound to node, changed by mutate, deleted at
// the end (with the others of its labels).
func (d *directEnv) podOn(t *testing.T, name, node string, labels map[string]string, mutate ...func(*corev1.Pod)) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: directNS, Name: name, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main", Image: "registry.example/" + name + ":1"}},
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}},
	}
	for _, m := range mutate {
		m(pod)
	}
	if err := d.c.Create(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.deletePods(t, labels) })
}

// withShm gives a pod the /dev/shm emptyDir of every PyTorch job.
func withShm(p *corev1.Pod) {
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "shm", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}})
	p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "shm", MountPath: "/dev/shm"})
}

// withGPU makes a pod request one nvidia.com/gpu.
func withGPU(p *corev1.Pod) {
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
}

// toDraining takes an admitted object through Cordon and
// WaitForPodCompletion into Draining.
func (d *directEnv) toDraining(t *testing.T, key types.NamespacedName, node string) {
	t.Helper()
	d.reconcile(t, key)       // Scheduled -> Cordon
	d.waitPodsSynced(t, node) // the cordon step waits for the watch of the node's pods
	d.reconcile(t, key)       // enter WaitForPodCompletion (nothing to wait for)
	d.reconcile(t, key)       // enter Draining
	wantPhase(t, d.get(t, key), maintenancev1.PhaseDraining)
}

// podState is "gone", "deleting" or "running".
func (d *directEnv) podState(t *testing.T, name string) string {
	t.Helper()
	p := &corev1.Pod{}
	err := d.c.Get(t.Context(), types.NamespacedName{Namespace: directNS, Name: name}, p)
	switch {
	case apierrors.IsNotFound(err):
		return "gone"
	case err != nil:
		t.Fatal(err)
	case p.DeletionTimestamp != nil:
		return "deleting"
	}
	return "running"
}

// drainUntilReady reconciles until the object is Ready (the evicted pods
// take a moment to go), at most 30 s.
func (d *directEnv) drainUntilReady(t *testing.T, key types.NamespacedName) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		d.reconcile(t, key)
		return d.get(t, key).Phase() == maintenancev1.PhaseReady, nil
	})
	if err != nil {
		t.Fatalf("%s never Ready: %+v", key, d.get(t, key).Status)
	}
}

// TestDirectPodsTheDrainDidNotChooseNeverRefuseIt: a drain of the GPU pods
// (podEvictionFilters, as a driver upgrade's) on a node that also runs a
// bare pod with an emptyDir and no GPU: kubectl's rules (no controller, local
// storage) apply to the pods the drain chose only, so the drain is not
// refused; it evicts the GPU pod and leaves the other running.
func TestDirectPodsTheDrainDidNotChooseNeverRefuseIt(t *testing.T) {
	d := newDirectEnv(t)
	node := "gpu-007"
	d.useNode(t, node)
	d.podOn(t, "bystander", node, map[string]string{"app": "direct-bystander"}, withShm)
	d.podOn(t, "gpu-job", node, map[string]string{"app": "direct-gpu-job"}, withGPU)
	key := d.admit(t, "gpu-pods", node, withDrain(maintenancev1.DrainSpec{
		Force: true, TimeoutSeconds: ptr.To[int32](300),
		PodEvictionFilters: []maintenancev1.PodEvictionFilterEntry{{ByResourceNameRegex: ptr.To(`^nvidia\.com/gpu$`)}},
	}))
	d.toDraining(t, key, node)
	d.reconcile(t, key)
	if c := meta.FindStatusCondition(d.get(t, key).Status.Conditions, maintenancev1.ConditionTypeDrainBlocked); c != nil {
		t.Fatalf("the drain of the GPU pods is held by a pod it did not choose: %+v", c)
	}
	d.drainUntilReady(t, key)
	if got := d.podState(t, "gpu-job"); got == "running" {
		t.Errorf("the GPU pod is %s after the drain", got)
	}
	if got := d.podState(t, "bystander"); got != "running" {
		t.Errorf("the pod without a GPU is %s: the drain did not choose it", got)
	}
}

// TestDirectARefusedDrainIsNotATimeout: a drain that kubectl's rules refuse
// (a chosen pod with an emptyDir, deleteEmptyDir false) says so at once —
// condition DrainBlocked, reason DrainFailed — and evicts nothing; it is
// no timeout (which is what lets a requestor go on without the drain)
// until its timeoutSeconds have passed: then reason DrainBlocked. Its look
// again is never later than the timeout.
func TestDirectARefusedDrainIsNotATimeout(t *testing.T) {
	d := newDirectEnv(t)
	node := "gpu-008"
	d.useNode(t, node)
	d.podOn(t, "trainer", node, map[string]string{"app": "direct-trainer"}, withShm)
	const timeout = 60 * time.Second
	key := d.admit(t, "refused", node, withDrain(maintenancev1.DrainSpec{
		Force: true, PodSelector: "app=direct-trainer", TimeoutSeconds: ptr.To(int32(timeout / time.Second)),
	}))
	d.toDraining(t, key, node)
	start := d.get(t, key).Status.Drain.StartTime.Time
	d.clock.SetTime(start.Add(time.Second))
	res := d.reconcile(t, key)
	nm := d.get(t, key)
	c := meta.FindStatusCondition(nm.Status.Conditions, maintenancev1.ConditionTypeDrainBlocked)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != "DrainFailed" || !strings.Contains(c.Message, "local storage") {
		t.Fatalf("a refused drain: condition %+v, want DrainBlocked True, reason DrainFailed, naming the local storage", c)
	}
	if res.RequeueAfter <= 0 || res.RequeueAfter > timeout {
		t.Errorf("a refused drain looks again after %s, want within its timeout %s", res.RequeueAfter, timeout)
	}
	if got := d.podState(t, "trainer"); got != "running" {
		t.Errorf("the refused drain's pod is %s", got)
	}
	if evs := reasons(d.events()); len(evs) != 1 || evs[0] != "Warning DrainFailed" {
		t.Errorf("events of the refusal %v, want one Warning DrainFailed", evs)
	}

	d.clock.SetTime(start.Add(timeout + time.Second))
	d.reconcile(t, key)
	nm = d.get(t, key)
	c = meta.FindStatusCondition(nm.Status.Conditions, maintenancev1.ConditionTypeDrainBlocked)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != "DrainBlocked" || !strings.Contains(c.Message, "local storage") {
		t.Fatalf("a refused drain past its timeout: condition %+v, want reason DrainBlocked with the refusal in the message", c)
	}
	wantPhase(t, nm, maintenancev1.PhaseDraining)
	if got := d.podState(t, "trainer"); got != "running" {
		t.Errorf("the refused drain's pod is %s past the timeout", got)
	}
}

// TestDirectAnOutsideUncordonIsCordonedAgain: a Ready maintenance whose node
// someone uncordons (and a pod lands on it meanwhile) cordons it again and
// drains again what landed, with a Warning saying so; it is Ready again
// once that pod is gone. While draining, an uncordon is cordoned again too.
func TestDirectAnOutsideUncordonIsCordonedAgain(t *testing.T) {
	d := newDirectEnv(t)
	node := "gpu-009"
	d.useNode(t, node)
	key := d.admit(t, "held", node, withDrain(maintenancev1.DrainSpec{Force: true, PodSelector: "app=direct-lander", TimeoutSeconds: ptr.To[int32](300)}))
	d.toDraining(t, key, node)
	d.drainUntilReady(t, key)
	d.events()

	d.setUnschedulable(t, node, false)
	d.podOn(t, "lander", node, map[string]string{"app": "direct-lander"})
	d.reconcile(t, key)
	if !d.cordoned(t, node) {
		t.Fatalf("node %s schedulable after its Ready maintenance saw the uncordon", node)
	}
	nm := d.get(t, key)
	wantPhase(t, nm, maintenancev1.PhaseDraining)
	if evs := d.events(); len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning Recordoned") || !strings.Contains(evs[0], "drained again") {
		t.Errorf("events %v, want one Warning Recordoned saying the node is drained again", evs)
	}
	d.waitPodsSynced(t, node)
	d.drainUntilReady(t, key)
	if got := d.podState(t, "lander"); got == "running" {
		t.Errorf("the pod that landed while the node was uncordoned is %s", got)
	}

	// Uncordoned while draining: cordoned again, the drain goes on.
	key2 := types.NamespacedName{Namespace: directNS, Name: "held"}
	d.setUnschedulable(t, node, false)
	nm = d.get(t, key2)
	nm.Spec.DrainSpec.PodSelector = "app=direct-lander-2" // drains again (a changed drainSpec)
	if err := d.c.Update(t.Context(), nm); err != nil {
		t.Fatal(err)
	}
	d.podOn(t, "lander-2", node, map[string]string{"app": "direct-lander-2"})
	d.reconcile(t, key2) // the cordon first
	if !d.cordoned(t, node) {
		t.Errorf("node %s schedulable after the re-cordon", node)
	}
	d.drainUntilReady(t, key2)
	if got := d.podState(t, "lander-2"); got == "running" {
		t.Errorf("pod lander-2 is %s", got)
	}
}

// TestDirectAChangedDrainSpecDrainsAgain: a requestor that needs more of a
// node it holds (a driver upgrade that must now reboot it) widens the
// drainSpec of its Ready object: the object drains again, with the new
// spec (Ready=False meanwhile), and reports the new generation once Ready.
// A change of anything else leaves it Ready.
func TestDirectAChangedDrainSpecDrainsAgain(t *testing.T) {
	d := newDirectEnv(t)
	node := "gpu-006"
	d.useNode(t, node)
	d.podOn(t, "gpu-only", node, map[string]string{"app": "direct-widen", "gpu": "yes"}, withGPU)
	d.podOn(t, "cpu-only", node, map[string]string{"app": "direct-widen", "gpu": "no"}, withShm)
	key := d.admit(t, "widen", node, withDrain(maintenancev1.DrainSpec{Force: true, DeleteEmptyDir: true, TimeoutSeconds: ptr.To[int32](300),
		PodEvictionFilters: []maintenancev1.PodEvictionFilterEntry{{ByResourceNameRegex: ptr.To(`^nvidia\.com/`)}}}))
	d.toDraining(t, key, node)
	d.drainUntilReady(t, key)
	if got := d.podState(t, "cpu-only"); got != "running" {
		t.Fatalf("the first drain (GPU pods only) left the CPU pod %s", got)
	}

	// Another requestor joins: no new drain.
	nm := d.get(t, key)
	nm.Spec.AdditionalRequestors = []string{"other.example.com"}
	if err := d.c.Update(t.Context(), nm); err != nil {
		t.Fatal(err)
	}
	d.reconcile(t, key)
	if nm = d.get(t, key); nm.Phase() != maintenancev1.PhaseReady || nm.Status.ObservedGeneration != nm.Generation {
		t.Fatalf("after an unrelated spec change: phase %s, observedGeneration %d of %d; want Ready for the new generation", nm.Phase(), nm.Status.ObservedGeneration, nm.Generation)
	}

	nm.Spec.AdditionalRequestors = nil
	nm.Spec.DrainSpec.PodEvictionFilters = nil // the whole node
	if err := d.c.Update(t.Context(), nm); err != nil {
		t.Fatal(err)
	}
	d.restart() // what was drained is on the object: nothing in memory is needed
	d.reconcile(t, key)
	nm = d.get(t, key)
	wantPhase(t, nm, maintenancev1.PhaseDraining)
	if nm.IsReady() {
		t.Fatalf("Ready while it drains again")
	}
	d.waitPodsSynced(t, node)
	d.drainUntilReady(t, key)
	if got := d.podState(t, "cpu-only"); got == "running" {
		t.Errorf("the widened drain left the CPU pod %s", got)
	}
	if nm = d.get(t, key); nm.Status.ObservedGeneration != nm.Generation {
		t.Errorf("observedGeneration %d, generation %d", nm.Status.ObservedGeneration, nm.Generation)
	}
}

// TestDirectADRAPodIsDrainedByItsDriver: an eviction filter by DRA driver
// (byDRADriverRegex, as a driver upgrade's) chooses the pod whose
// ResourceClaim was allocated a device of that driver, and neither a pod
// whose claim only has an admin-access (monitoring) allocation nor a pod
// without claims.
func TestDirectADRAPodIsDrainedByItsDriver(t *testing.T) {
	d := newDirectEnv(t)
	node := "gpu-005"
	d.useNode(t, node)
	// Admin access (a monitor's claim) is allowed in namespaces so labelled.
	ns := &corev1.Namespace{}
	if err := d.c.Get(t.Context(), types.NamespacedName{Name: directNS}, ns); err != nil {
		t.Fatal(err)
	}
	if ns.Labels["resource.kubernetes.io/admin-access"] != "true" {
		if ns.Labels == nil {
			ns.Labels = map[string]string{}
		}
		ns.Labels["resource.kubernetes.io/admin-access"] = "true"
		if err := d.c.Update(t.Context(), ns); err != nil {
			t.Fatal(err)
		}
	}
	claim := func(name string, admin bool) {
		c := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: directNS, Name: name},
			Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu",
				Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com", AdminAccess: ptr.To(admin)}}}}}}
		if err := d.c.Create(t.Context(), c); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.c.Delete(context.Background(), c) })
		c.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{{
			Request: "gpu", Driver: "gpu.nvidia.com", Pool: node, Device: "gpu-0", AdminAccess: ptr.To(admin)}}}}
		if err := d.c.Status().Update(t.Context(), c); err != nil {
			t.Fatal(err)
		}
	}
	claim("trainer-gpu", false)
	claim("monitor-gpu", true)
	withClaim := func(name string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(name)}}
			p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
		}
	}
	d.podOn(t, "dra-trainer", node, map[string]string{"app": "direct-dra", "role": "trainer"}, withClaim("trainer-gpu"))
	d.podOn(t, "dra-monitor", node, map[string]string{"app": "direct-dra", "role": "monitor"}, withClaim("monitor-gpu"))
	d.podOn(t, "plain", node, map[string]string{"app": "direct-dra", "role": "plain"})
	key := d.admit(t, "dra", node, withDrain(maintenancev1.DrainSpec{Force: true, DeleteEmptyDir: true, TimeoutSeconds: ptr.To[int32](300),
		PodEvictionFilters: []maintenancev1.PodEvictionFilterEntry{{ByResourceNameRegex: ptr.To(`^nvidia\.com/`)}, {ByDRADriverRegex: ptr.To(`^gpu\.nvidia\.com$`)}}}))
	d.toDraining(t, key, node)
	d.drainUntilReady(t, key)
	for pod, want := range map[string]bool{"dra-trainer": true, "dra-monitor": false, "plain": false} {
		if evicted := d.podState(t, pod) != "running"; evicted != want {
			t.Errorf("pod %s evicted: %t, want %t", pod, evicted, want)
		}
	}
}

// TestDirectOwnRequestorsAreNotGarbageCollected: past
// maxNodeMaintenanceTimeSeconds (the default hour here) a Ready object of
// another requestor is garbage-collected, as NVIDIA's operator does; one of
// gpufleet's repairs (a long reboot, a validation, a GPU kept out of
// service for a person) is kept, and condition Retained says why.
func TestDirectOwnRequestorsAreNotGarbageCollected(t *testing.T) {
	d := newDirectEnv(t)
	d.r.BoundedRequestors = []string{"repair.gpufleet.dev"}
	for _, n := range []string{"gpu-003", "gpu-004"} {
		d.useNode(t, n)
	}
	other := d.readyOn(t, "other", "gpu-003")
	own := d.readyOn(t, "own", "gpu-004", func(nm *maintenancev1.NodeMaintenance) { nm.Spec.RequestorID = "repair.gpufleet.dev" })
	d.clock.Step(time.Hour + time.Second)
	d.reconcile(t, other)
	d.reconcile(t, own)
	if !d.gone(t, other) {
		d.reconcile(t, other) // its finalizer step
	}
	if !d.gone(t, other) {
		t.Errorf("another requestor's object past the GC age is still there")
	}
	nm := d.get(t, own)
	wantPhase(t, nm, maintenancev1.PhaseReady)
	c := meta.FindStatusCondition(nm.Status.Conditions, "Retained")
	if c == nil || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "repair.gpufleet.dev") || nm.DeletionTimestamp != nil {
		t.Fatalf("gpufleet's repair object past the GC age: deleting %v, Retained %+v", nm.DeletionTimestamp, c)
	}
	if !d.cordoned(t, "gpu-004") {
		t.Errorf("the repair's node was released")
	}
	rv := nm.ResourceVersion
	d.clock.Step(time.Hour)
	if res := d.reconcile(t, own); res != (reconcile.Result{}) || d.get(t, own).ResourceVersion != rv {
		t.Errorf("a retained object: result %+v, written again %t; want nothing", res, d.get(t, own).ResourceVersion != rv)
	}
}

// staleNodes serves the node list of the past: what a cache that has not
// seen the last uncordon shows.
type staleNodes struct {
	client.Client
	nodes corev1.NodeList
}

func (s staleNodes) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if l, ok := list.(*corev1.NodeList); ok {
		s.nodes.DeepCopyInto(l)
		return nil
	}
	return s.Client.List(ctx, list, opts...)
}

// staleNode serves one node as it was.
type staleNode struct {
	client.Client
	node *corev1.Node
}

func (s staleNode) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if n, ok := obj.(*corev1.Node); ok && key.Name == s.node.Name {
		s.node.DeepCopyInto(n)
		return nil
	}
	return s.Client.Get(ctx, key, obj, opts...)
}

// TestDirectBackToBackMaintenancesNeverKeepTheNodeCordoned: maintenance
// "first" ends and releases its node; "second", of another requestor,
// waited for the node and is scheduled by a pass whose node cache does not
// show the release yet (it shows the node cordoned by "first"). That cordon
// must not be taken for an administrator's: "second" records the node as
// schedulable before, and the node is schedulable once it ends. Also: a
// short maintenance released while the cache does not show its own cordon
// yet still uncordons the node.
func TestDirectBackToBackMaintenancesNeverKeepTheNodeCordoned(t *testing.T) {
	d := newDirectEnv(t)
	node := "gpu-002"
	d.useNode(t, node)
	first := d.readyOn(t, "first", node)
	var cached corev1.NodeList
	if err := d.c.List(t.Context(), &cached); err != nil {
		t.Fatal(err)
	}
	second := d.newNM(t, "second", node, func(nm *maintenancev1.NodeMaintenance) { nm.Spec.RequestorID = "second.test.gpufleet.dev" })
	d.reconcile(t, second) // Pending
	d.delete(t, first)
	d.reconcile(t, first) // released: uncordoned
	if !d.gone(t, first) || d.cordoned(t, node) {
		t.Fatalf("first not released: gone %t, node cordoned %t", d.gone(t, first), d.cordoned(t, node))
	}
	s := &Scheduler{Client: staleNodes{Client: d.c, nodes: cached}, Live: d.c, Namespace: directNS, Clock: d.clock,
		Recorder: events.NewFakeRecorder(100), Reasons: &WaitReasons{Client: d.c, Clock: d.clock}}
	if _, err := s.Reconcile(t.Context(), reconcile.Request{}); err != nil {
		t.Fatal(err)
	}
	nm := d.get(t, second)
	wantPhase(t, nm, maintenancev1.PhaseScheduled)
	if b := nm.Status.NodeUnschedulableBefore; b == nil || *b {
		t.Fatalf("second recorded the node as cordoned before it (%v): the cordon of the maintenance that just ended, taken for an administrator's", b)
	}
	for range 4 { // Cordon, WaitForPodCompletion, Draining, Ready
		d.reconcile(t, second)
	}
	wantPhase(t, d.get(t, second), maintenancev1.PhaseReady)
	d.delete(t, second)
	d.reconcile(t, second)
	if !d.gone(t, second) || d.cordoned(t, node) {
		t.Fatalf("after both maintenances: second gone %t, node cordoned %t; want the node schedulable", d.gone(t, second), d.cordoned(t, node))
	}

	// A short maintenance: released by a reconcile whose node cache does
	// not show its cordon yet.
	d.events()
	third := d.readyOn(t, "third", node)
	var before corev1.Node
	if err := d.c.Get(t.Context(), types.NamespacedName{Name: node}, &before); err != nil {
		t.Fatal(err)
	}
	before.Spec.Unschedulable = false
	d.r.Client = staleNode{Client: d.c, node: &before}
	d.delete(t, third)
	d.reconcile(t, third)
	d.r.Client = d.c
	if !d.gone(t, third) || d.cordoned(t, node) {
		t.Errorf("a maintenance released from a cache behind its cordon: gone %t, node cordoned %t", d.gone(t, third), d.cordoned(t, node))
	}
}
