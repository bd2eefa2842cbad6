package gpustack_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/events"
	"k8s.io/kubectl/pkg/util/podutils"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
	"github.com/gpufleet/gpufleet/internal/gpustack"
	"github.com/gpufleet/gpufleet/internal/maintenance/requestor"
)

// The tests in this file drive the GPU stack's Reconciler directly against
// the real API server of the package's local cluster, with no operator
// running: a Reconciler built on a direct admin client, a fake clock and a
// fake event recorder reconciles one ClusterPolicy request at a time, and
// the test checks what each pass wrote — objects, node labels, status,
// events — and the write requests it sent. The DaemonSet pods are made by
// the cluster's DaemonSet controller and run by kwok; nothing else acts on
// the objects (no maintenance controller: NodeMaintenance stays Pending).

const degradedAfter = 2 * time.Minute

var errInjected = errors.New("injected: the status write did not reach the API server")

// write is one mutating call the Reconciler made through its client.
type write struct {
	verb, kind, key string // "Create", "DaemonSet", "gpu-operator/nvidia-driver-daemonset-ubuntu22.04"
	obj             client.Object
	err             error
}

func (w write) String() string {
	s := w.verb + " " + w.kind + " " + w.key
	if w.err != nil {
		s += " (" + w.err.Error() + ")"
	}
	return s
}

// writeLog records the Reconciler's writes and fails status writes on demand.
type writeLog struct {
	mu         sync.Mutex
	writes     []write
	failStatus int // status writes still to fail with errInjected
}

func (l *writeLog) add(w write) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.writes = append(l.writes, w)
}

func (l *writeLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.writes)
}

func (l *writeLog) since(mark int) []write {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.writes[mark:])
}

// failNextStatusWrites makes the next n status writes fail without
// reaching the API server.
func (l *writeLog) failNextStatusWrites(n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failStatus = n
}

func (l *writeLog) failStatusNow() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failStatus > 0 {
		l.failStatus--
		return true
	}
	return false
}

func describe(c client.Client, obj runtime.Object) (kind, key string) {
	gvk, err := c.GroupVersionKindFor(obj)
	kind = gvk.Kind
	if err != nil {
		kind = fmt.Sprintf("%T", obj)
	}
	if o, ok := obj.(client.Object); ok {
		key = o.GetName()
		if o.GetNamespace() != "" {
			key = o.GetNamespace() + "/" + key
		}
	}
	return kind, key
}

// funcs intercepts every mutating call of the client.
func (l *writeLog) funcs() interceptor.Funcs {
	rec := func(c client.WithWatch, verb string, obj runtime.Object, err error) error {
		kind, key := describe(c, obj)
		w := write{verb: verb, kind: kind, key: key, err: err}
		if o, ok := obj.(client.Object); ok {
			w.obj = o.DeepCopyObject().(client.Object)
		}
		l.add(w)
		return err
	}
	sub := func(c client.Client, verb, name string, obj client.Object, do func() error) error {
		kind, key := describe(c, obj)
		var err error
		if name == "status" && l.failStatusNow() {
			err = errInjected
		} else {
			err = do()
		}
		l.add(write{verb: verb, kind: kind + "/" + name, key: key, err: err})
		return err
	}
	return interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			return rec(c, "Create", obj, c.Create(ctx, obj, opts...))
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			return rec(c, "Update", obj, c.Update(ctx, obj, opts...))
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			return rec(c, "Patch", obj, c.Patch(ctx, obj, patch, opts...))
		},
		Apply: func(ctx context.Context, c client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
			err := c.Apply(ctx, obj, opts...)
			l.add(write{verb: "Apply", kind: fmt.Sprintf("%T", obj), err: err})
			return err
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			return rec(c, "Delete", obj, c.Delete(ctx, obj, opts...))
		},
		DeleteAllOf: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteAllOfOption) error {
			return rec(c, "DeleteAllOf", obj, c.DeleteAllOf(ctx, obj, opts...))
		},
		SubResourceCreate: func(ctx context.Context, c client.Client, name string, obj, subObj client.Object, opts ...client.SubResourceCreateOption) error {
			return sub(c, "Create", name, obj, func() error { return c.SubResource(name).Create(ctx, obj, subObj, opts...) })
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, name string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			return sub(c, "Update", name, obj, func() error { return c.SubResource(name).Update(ctx, obj, opts...) })
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, name string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			return sub(c, "Patch", name, obj, func() error { return c.SubResource(name).Patch(ctx, obj, patch, opts...) })
		},
		SubResourceApply: func(ctx context.Context, c client.Client, name string, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
			err := c.SubResource(name).Apply(ctx, obj, opts...)
			l.add(write{verb: "Apply", kind: fmt.Sprintf("%T/%s", obj, name), err: err})
			return err
		},
	}
}

// direct is a Reconciler's surroundings: its client, clock and write log.
type direct struct {
	t      *testing.T
	clock  *clocktesting.FakeClock
	client client.Client
	log    *writeLog
	wire   *devcluster.RequestCounter // every request of the client, as the API server sees it
	r      *gpustack.Reconciler
}

// quietClients: the tests' own clients log nothing of interest, and
// without a logger controller-runtime prints a warning with a stack trace.
var quietClients sync.Once

func newDirect(t *testing.T) *direct {
	t.Helper()
	devtest.NeedCluster(t)
	quietClients.Do(func() { ctrl.SetLogger(logr.Discard()) })
	cleanSlate(t)
	cfg, wire := devcluster.CountRequests(cluster.Config)
	base, err := client.NewWithWatch(cfg, client.Options{Scheme: k8s.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	d := &direct{t: t, clock: clocktesting.NewFakeClock(time.Now().Truncate(time.Second)), log: &writeLog{}, wire: wire}
	d.client = interceptor.NewClient(base, d.log.funcs())
	d.r = d.reconciler()
	return d
}

// reconciler builds a new Reconciler, as the operator does when it starts,
// with its own event recorder.
func (d *direct) reconciler() *gpustack.Reconciler {
	return &gpustack.Reconciler{
		Client: d.client, Live: d.client, Namespace: ns, Clock: d.clock, Recorder: events.NewFakeRecorder(100),
		Assets: gpustack.Assets, DegradedAfter: degradedAfter,
		Monitors: &gpustack.ServiceMonitors{CRDs: d.client, Mapper: d.client.RESTMapper(), Reader: d.client},
	}
}

// pass is what one Reconcile did.
type pass struct {
	res    reconcile.Result
	err    error
	writes []write
	wire   map[string]int // write requests sent, by "VERB resource"
	events []string       // "Normal Ignored ClusterPolicy cluster-policy is active; ..."
}

func (p pass) count(verb, kind string) int {
	n := 0
	for _, w := range p.writes {
		if w.verb == verb && w.kind == kind {
			n++
		}
	}
	return n
}

func (p pass) statusWrites() int {
	n := 0
	for _, w := range p.writes {
		if strings.HasSuffix(w.kind, "/status") {
			n++
		}
	}
	return n
}

// keys lists the "Kind key" of a pass's writes of one verb.
func (p pass) keys(verb string) []string {
	var out []string
	for _, w := range p.writes {
		if w.verb == verb {
			out = append(out, w.kind+" "+w.key)
		}
	}
	sort.Strings(out)
	return out
}

func (p pass) eventsWith(reason string) []string {
	var out []string
	for _, e := range p.events {
		if f := strings.Fields(e); len(f) > 1 && f[1] == reason {
			out = append(out, e)
		}
	}
	return out
}

func (p pass) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "err %v, %d writes", p.err, len(p.writes))
	for _, w := range p.writes {
		b.WriteString("\n  " + w.String())
	}
	for _, e := range p.events {
		b.WriteString("\n  event: " + e)
	}
	return b.String()
}

func (d *direct) reconcile(name string) pass {
	d.t.Helper()
	return d.reconcileWith(d.r, name)
}

// reconcileWith runs one Reconcile of the named ClusterPolicy with r.
func (d *direct) reconcileWith(r *gpustack.Reconciler, name string) pass {
	d.t.Helper()
	mark, before := d.log.len(), d.wire.Snapshot()
	var p pass
	func() {
		defer func() {
			if v := recover(); v != nil {
				d.t.Fatalf("Reconcile %s panicked: %v", name, v)
			}
		}()
		ctx := ctrl.LoggerInto(d.t.Context(), testr.New(d.t)) // the Reconciler's log lines go to the test's output
		p.res, p.err = r.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Name: name}})
	}()
	p.writes = d.log.since(mark)
	p.wire = map[string]int{}
	for k, v := range d.wire.Since(before) {
		if devcluster.IsWrite(k) {
			p.wire[k] = v
		}
	}
	rec := r.Recorder.(*events.FakeRecorder)
	for drained := false; !drained; {
		select {
		case e := <-rec.Events:
			p.events = append(p.events, e)
		default:
			drained = true
		}
	}
	if n := p.statusWrites(); n > 1 {
		d.t.Errorf("one reconcile of %s wrote the status %d times: %s", name, n, p)
	}
	return p
}

// createPolicy creates the GPU Operator 1.6 ClusterPolicy under name, changed by change.
func createPolicy(t *testing.T, name string, change func(*nvidiav1.ClusterPolicy)) *nvidiav1.ClusterPolicy {
	t.Helper()
	p := v16Policy(t)
	p.Name = name
	if change != nil {
		change(p)
	}
	if err := k8s.Create(t.Context(), p); err != nil {
		t.Fatalf("creating ClusterPolicy %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := k8s.Delete(context.Background(), p); client.IgnoreNotFound(err) != nil {
			t.Errorf("deleting ClusterPolicy %s: %v", name, err)
		}
	})
	return p
}

// stackLabelKeys are the node labels the Reconciler writes.
func stackLabelKeys() []string {
	keys := []string{nvidiav1.LabelGPUPresent, gpustack.LabelRuntime, nvidiav1.LabelUpgradeState, gpustack.LabelNVIDIADriver}
	for _, c := range nvidiav1.Components {
		keys = append(keys, c.DeployLabel)
	}
	return keys
}

// stripStackLabels removes the Reconciler's labels from every node.
func stripStackLabels(ctx context.Context) error {
	nodes, err := cluster.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, n := range nodes.Items {
		remove := map[string]any{}
		for _, k := range stackLabelKeys() {
			if _, ok := n.Labels[k]; ok {
				remove[k] = nil
			}
		}
		if len(remove) == 0 {
			continue
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": remove}})
		if _, err := cluster.Client.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{}); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("unlabelling node %s: %w", n.Name, err)
		}
	}
	return nil
}

// stackLeft lists what remains of a GPU stack: its objects, its pods, its
// driver-upgrade NodeMaintenance.
func stackLeft(ctx context.Context) ([]string, error) {
	sel := client.MatchingLabels{gpustack.LabelManagedBy: "gpufleet", gpustack.LabelPartOf: "gpufleet-gpu-stack"}
	var left []string
	for _, list := range []client.ObjectList{&appsv1.DaemonSetList{}, &corev1.ServiceAccountList{}, &corev1.ServiceList{},
		&rbacv1.ClusterRoleList{}, &rbacv1.ClusterRoleBindingList{}} {
		if err := k8s.List(ctx, list, sel); err != nil {
			return nil, err
		}
		items, err := meta.ExtractList(list)
		if err != nil {
			return nil, err
		}
		for _, item := range items {
			kind, key := describe(k8s, item)
			left = append(left, kind+" "+key)
		}
	}
	var pods corev1.PodList
	if err := k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{gpustack.LabelManagedBy: "gpufleet"}); err != nil {
		return nil, err
	}
	for _, p := range pods.Items {
		left = append(left, "Pod "+p.Name)
	}
	nms, err := upgradeMaintenance(ctx)
	if err != nil {
		return nil, err
	}
	for _, nm := range nms {
		left = append(left, "NodeMaintenance "+nm.Name)
	}
	return left, nil
}

// upgradeMaintenance lists the driver-upgrade NodeMaintenance objects,
// those being deleted included.
func upgradeMaintenance(ctx context.Context) ([]maintenancev1.NodeMaintenance, error) {
	var list maintenancev1.NodeMaintenanceList
	if err := k8s.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	return slices.DeleteFunc(list.Items, func(nm maintenancev1.NodeMaintenance) bool {
		return nm.Spec.RequestorID != gpustack.UpgradeRequestor
	}), nil
}

func waitStackGone(ctx context.Context, timeout time.Duration) ([]string, error) {
	var left []string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var err error
		left, err = stackLeft(ctx)
		return err == nil && len(left) == 0, nil
	})
	return left, err
}

// cleanSlate starts a test without ClusterPolicies, GPU stack objects or
// stack node labels (an earlier test's stack is garbage-collected after
// its ClusterPolicy is deleted), and leaves the cluster that way.
func cleanSlate(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	var names []string
	var listErr error
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var list nvidiav1.ClusterPolicyList
		if listErr = k8s.List(ctx, &list); listErr != nil {
			return false, nil //nolint:nilerr // the API server may be busy: keep polling, report the last error on timeout
		}
		names = names[:0]
		for _, p := range list.Items {
			names = append(names, p.Name)
		}
		return len(names) == 0, nil
	})
	if err != nil {
		t.Fatalf("ClusterPolicies left by an earlier test: %v (last list error: %v)", names, listErr)
	}
	if err := stripStackLabels(ctx); err != nil {
		t.Fatal(err)
	}
	if left, err := waitStackGone(ctx, 60*time.Second); err != nil {
		t.Fatalf("an earlier GPU stack is still there: %v", left)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		// The ClusterPolicies are deleted by now (their cleanups run first).
		if nms, err := upgradeMaintenance(ctx); err == nil {
			for _, nm := range nms {
				_ = requestor.Release(ctx, k8s, nm.Namespace, nm.Name)
			}
		}
		if err := stripStackLabels(ctx); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		if left, err := waitStackGone(ctx, 60*time.Second); err != nil {
			t.Errorf("cleanup: the GPU stack was not garbage-collected: %v", left)
		}
	})
}

// nodeSet is the cluster's nodes by kind.
type nodeSet struct {
	gpu, healthy, cpu []string
	items             map[string]corev1.Node
}

func listNodes(t *testing.T) nodeSet {
	t.Helper()
	nodes, err := cluster.Client.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := nodeSet{items: map[string]corev1.Node{}}
	for _, n := range nodes.Items {
		s.items[n.Name] = n
		switch {
		case !nvidiav1.HasNvidiaGPU(n.Labels):
			s.cpu = append(s.cpu, n.Name)
		case strings.HasPrefix(n.Name, devcluster.UnhealthyNodePrefix):
			s.gpu = append(s.gpu, n.Name)
		default:
			s.gpu = append(s.gpu, n.Name)
			s.healthy = append(s.healthy, n.Name)
		}
	}
	sort.Strings(s.gpu)
	if len(s.healthy) < 3 || len(s.cpu) == 0 {
		t.Fatalf("the tests need GPU and CPU nodes; found GPU %v, CPU %v", s.gpu, s.cpu)
	}
	return s
}

// facts are the facts the Reconciler sees on these nodes.
func (s nodeSet) facts() gpustack.Facts {
	f := gpustack.Facts{Namespace: ns}
	for _, name := range s.gpu {
		labels := s.items[name].Labels
		if os, ok := gpustack.NodeOS(labels); ok && !slices.Contains(f.OSFlavours, os) {
			f.OSFlavours = append(f.OSFlavours, os)
		}
		// As the reconciler does: the runtime the kubelet reports.
		node := s.items[name]
		if rt := gpustack.Runtime(&node, ""); !slices.Contains(f.Runtimes, rt) {
			f.Runtimes = append(f.Runtimes, rt)
		}
	}
	return f
}

func getNode(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n, err := cluster.Client.CoreV1().Nodes().Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// driverPods returns each node's driver pod (scheduled, not being deleted).
func driverPods(t *testing.T) map[string]corev1.Pod {
	t.Helper()
	pods, err := cluster.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: gpustack.LabelComponent + "=" + gpustack.Driver})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]corev1.Pod{}
	for _, p := range pods.Items {
		if p.Spec.NodeName != "" && p.DeletionTimestamp == nil {
			out[p.Spec.NodeName] = p
		}
	}
	return out
}

// waitDriverPods waits until every GPU node runs a driver pod, Ready on
// the healthy nodes when ready is set (kwok runs them: a few hundred
// milliseconds per pod).
func waitDriverPods(t *testing.T, nodes nodeSet, ready bool) map[string]corev1.Pod {
	t.Helper()
	var pods map[string]corev1.Pod
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		pods = driverPods(t)
		for _, n := range nodes.gpu {
			p, ok := pods[n]
			if !ok || (ready && slices.Contains(nodes.healthy, n) && !podutils.IsPodReady(&p)) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("driver pods not running on every GPU node %v: %d found", nodes.gpu, len(pods))
	}
	return pods
}

// uids reads the current UID of each object a pass created.
func uids(t *testing.T, p pass) map[string]types.UID {
	t.Helper()
	out := map[string]types.UID{}
	for _, w := range p.writes {
		if w.verb != "Create" || w.err != nil {
			continue
		}
		o := w.obj.DeepCopyObject().(client.Object)
		if err := k8s.Get(t.Context(), client.ObjectKeyFromObject(w.obj), o); err != nil {
			t.Fatalf("%s: %v", w, err)
		}
		out[w.kind+" "+w.key] = o.GetUID()
	}
	return out
}

func TestReconcileV16PolicyCreatesTheStackAndConvergedCostsNothing(t *testing.T) {
	d := newDirect(t)
	nodes := listNodes(t)
	// The 1.6 policy's components have no RBAC of their own; MIG manager (off by
	// default) brings a ClusterRole and its binding.
	p := createPolicy(t, "cluster-policy", func(p *nvidiav1.ClusterPolicy) { p.Spec.MIGManager.Enabled = ptr.To(true) })
	began := time.Now()

	// One pass: the rendered objects are created, the GPU nodes labelled
	// for the first component only.
	first := d.reconcile(p.Name)
	if first.err != nil {
		t.Fatalf("first reconcile: %s", first)
	}
	rendered, err := gpustack.Render(p, nodes.facts(), gpustack.Assets)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, o := range rendered {
		kind, key := describe(k8s, o)
		want = append(want, kind+" "+key)
	}
	sort.Strings(want)
	created := first.keys("Create")
	if !slices.Equal(created, want) {
		t.Errorf("first reconcile created\n  %v\nwant the rendered objects\n  %v", created, want)
	}
	for _, ds := range []string{"nvidia-driver-daemonset-ubuntu22.04", "nvidia-driver-daemonset-ubuntu20.04"} {
		if !slices.Contains(created, "DaemonSet "+ns+"/"+ds) {
			t.Errorf("no driver DaemonSet %s for the OS flavour of the GPU nodes", ds)
		}
	}
	for _, kind := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding"} {
		if !slices.ContainsFunc(created, func(c string) bool { return strings.HasPrefix(c, kind+" ") }) {
			t.Errorf("first reconcile created no %s: %v", kind, created)
		}
	}
	for _, o := range rendered {
		have := o.DeepCopyObject().(client.Object)
		if err := k8s.Get(t.Context(), client.ObjectKeyFromObject(o), have); err != nil {
			t.Errorf("%T %s not on the API server: %v", o, o.GetName(), err)
			continue
		}
		if ref := metav1.GetControllerOf(have); ref == nil || ref.UID != p.UID {
			t.Errorf("%T %s: controller %v, want ClusterPolicy %s", o, o.GetName(), ref, p.UID)
		}
	}
	if n := first.count("Patch", "Node"); n != len(nodes.gpu) {
		t.Errorf("%d node patches, want one per GPU node (%d): %s", n, len(nodes.gpu), first)
	}
	for _, w := range first.writes {
		if w.verb != "Create" && (w.verb != "Patch" || w.kind != "Node") && (w.verb != "Patch" || w.kind != "ClusterPolicy/status") {
			t.Errorf("first reconcile: want creates, node label patches and the status only, got %s", w)
		}
	}
	if n := first.count("Patch", "ClusterPolicy/status"); n != 1 {
		t.Errorf("first reconcile wrote the status %d times, want once", n)
	}
	for _, name := range nodes.gpu {
		labels := getNode(t, name).Labels
		if labels[nvidiav1.LabelGPUPresent] != "true" {
			t.Errorf("GPU node %s: %s=%q, want true", name, nvidiav1.LabelGPUPresent, labels[nvidiav1.LabelGPUPresent])
		}
		for _, c := range nvidiav1.Components {
			// Every enabled component at once (its init containers keep
			// the order on the node); mig-manager only on MIG-capable nodes.
			wantSet := c.Enabled(&p.Spec) && c.RunsOn(labels)
			if got := labels[c.DeployLabel]; (got == "true") != wantSet || (!wantSet && got != "") {
				t.Errorf("GPU node %s after one pass: %s=%q, want set: %v (every enabled component in the first pass)", name, c.DeployLabel, got, wantSet)
			}
		}
	}
	for _, name := range nodes.cpu {
		for k := range getNode(t, name).Labels {
			if strings.HasPrefix(k, "nvidia.com/") {
				t.Errorf("CPU node %s labelled %s", name, k)
			}
		}
	}

	// Reconcile as the operator would on every change, until every enabled
	// component is Ready on every healthy GPU node. An unchanged policy's
	// objects are never rewritten.
	passes, seen := 1, map[string]int{}
	for _, e := range first.events {
		seen[e]++
	}
	got := p
	err = wait.PollUntilContextTimeout(t.Context(), 300*time.Millisecond, 90*time.Second, false, func(context.Context) (bool, error) {
		pass := d.reconcile(p.Name)
		passes++
		if pass.err != nil {
			return false, fmt.Errorf("pass %d: %s", passes, pass)
		}
		if n := pass.count("Update", "DaemonSet") + len(pass.keys("Delete")); n != 0 {
			t.Errorf("pass %d rewrote or deleted objects of an unchanged policy: %s", passes, pass)
		}
		for _, e := range pass.events {
			seen[e]++
		}
		got = getPolicy(t, p.Name)
		for _, c := range got.Status.Components {
			want := int32(len(nodes.healthy))
			if c.Name == gpustack.MIGManager {
				want = 0 // mig-manager runs only on MIG-capable nodes; none here
			}
			if c.Enabled && c.NodesReady != want {
				return false, nil
			}
		}
		return len(got.Status.Components) > 0, nil
	})
	if err != nil {
		t.Fatalf("the stack did not roll out on the healthy GPU nodes in %d passes: %v; status %+v", passes, err, got.Status)
	}
	t.Logf("rolled out on %d healthy GPU nodes in %d passes, %s", len(nodes.healthy), passes, time.Since(began).Round(100*time.Millisecond))
	for e, n := range seen {
		if n > 1 {
			t.Errorf("event recorded %d times during the rollout: %s", n, e)
		}
	}
	ready := 0
	for e := range seen {
		if strings.HasPrefix(e, "Normal "+gpustack.ReasonStackReady+" ") {
			ready++
		}
	}
	if wantReady := len(nodes.healthy) == len(nodes.gpu); (ready == 1) != wantReady {
		t.Errorf("%d StackReady events; want one exactly when every GPU node is healthy (%v of %v)", ready, nodes.healthy, nodes.gpu)
	}
	for _, rt := range []string{"containerd", "docker"} {
		var ds appsv1.DaemonSet
		if err := k8s.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: "nvidia-container-toolkit-daemonset-" + rt}, &ds); err != nil {
			t.Errorf("toolkit DaemonSet for %s: %v", rt, err)
		}
	}

	// Converged: nothing changed, nothing is written.
	converged := d.reconcile(p.Name)
	if converged.err != nil || len(converged.writes) != 0 || len(converged.wire) != 0 || len(converged.events) != 0 {
		t.Errorf("a converged reconcile must write nothing and record nothing: %s\nwrite requests: %v", converged, converged.wire)
	}
	if after := getPolicy(t, p.Name); after.ResourceVersion != got.ResourceVersion {
		t.Errorf("converged reconcile changed the ClusterPolicy (resourceVersion %s -> %s)", got.ResourceVersion, after.ResourceVersion)
	}
}

func TestReconcileRecordsEventsOnlyAfterTheStatusWrite(t *testing.T) {
	d := newDirect(t)
	nodes := listNodes(t)
	// No stack pod ever becomes Ready: every GPU node's driver crosses the
	// Degraded threshold when the clock is moved past it.
	p := createPolicy(t, "cluster-policy", func(p *nvidiav1.ClusterPolicy) {
		p.Spec.Daemonsets.Annotations = map[string]string{devcluster.AnnotationNeverReady: "true"}
	})
	if first := d.reconcile(p.Name); first.err != nil {
		t.Fatalf("first reconcile: %s", first)
	}
	waitDriverPods(t, nodes, false)
	starting := d.reconcile(p.Name)
	if starting.err != nil || len(starting.events) != 0 || starting.res.RequeueAfter <= 0 {
		t.Fatalf("driver pods starting: want no event and a requeue for the Degraded threshold: %s (requeue %s)", starting, starting.res.RequeueAfter)
	}
	before := getPolicy(t, p.Name)

	d.clock.Step(degradedAfter + time.Minute)
	d.log.failNextStatusWrites(1)
	failed := d.reconcile(p.Name)
	if !errors.Is(failed.err, errInjected) {
		t.Errorf("reconcile whose status write failed returned %v, want the write's error", failed.err)
	}
	if len(failed.events) != 0 {
		t.Errorf("events recorded although the status they report was not written: %v", failed.events)
	}
	if failed.statusWrites() != 1 || len(failed.writes) != 1 {
		t.Errorf("want the one (failed) status write only: %s", failed)
	}
	if after := getPolicy(t, p.Name); after.ResourceVersion != before.ResourceVersion {
		t.Errorf("the ClusterPolicy changed although its status write failed")
	}

	next := d.reconcile(p.Name)
	if next.err != nil || next.count("Patch", "ClusterPolicy/status") != 1 || len(next.writes) != 1 {
		t.Errorf("the next reconcile must write the status once: %s", next)
	}
	if ev := next.eventsWith(gpustack.ReasonNodeDegraded); len(ev) != 1 || len(next.events) != 1 || !strings.HasPrefix(ev[0], "Warning ") {
		t.Errorf("want one NodeDegraded Warning: %v", next.events)
	}
	got := getPolicy(t, p.Name)
	deg := meta.FindStatusCondition(got.Status.Conditions, nvidiav1.ConditionDegraded)
	if got.Status.State != nvidiav1.StateNotReady || deg == nil || deg.Status != metav1.ConditionTrue || deg.Reason != "NodesDegraded" ||
		!strings.Contains(deg.Message, "driver on "+nodes.gpu[0]) {
		t.Errorf("status after the Degraded threshold: state %s, Degraded %+v", got.Status.State, deg)
	}

	again := d.reconcile(p.Name)
	if again.err != nil || len(again.writes) != 0 || len(again.wire) != 0 || len(again.events) != 0 {
		t.Errorf("reconciling the reported state again must write and record nothing: %s", again)
	}
}

func TestReconcileIgnoresTheYoungerPolicyOnce(t *testing.T) {
	d := newDirect(t)
	active := createPolicy(t, "cluster-policy", nil)
	// creationTimestamp has a resolution of one second; the younger policy
	// is named to sort first, so only its age makes it the ignored one.
	for !time.Now().Truncate(time.Second).After(active.CreationTimestamp.Time) {
		time.Sleep(50 * time.Millisecond)
	}
	younger := createPolicy(t, "another-policy", nil)
	if !younger.CreationTimestamp.After(active.CreationTimestamp.Time) {
		t.Fatalf("creation times %s and %s", active.CreationTimestamp, younger.CreationTimestamp)
	}

	d.log.failNextStatusWrites(1)
	failed := d.reconcile(younger.Name)
	if !errors.Is(failed.err, errInjected) || len(failed.events) != 0 || len(failed.writes) != 1 {
		t.Errorf("status write failed: want its error, no event and no other write: %s", failed)
	}
	if s := getPolicy(t, younger.Name).Status.State; s != "" {
		t.Errorf("state %q after a failed status write", s)
	}

	ignored := d.reconcile(younger.Name)
	if ignored.err != nil || len(ignored.writes) != 1 || ignored.count("Patch", "ClusterPolicy/status") != 1 {
		t.Errorf("ignoring a policy writes its status and nothing else: %s", ignored)
	}
	if ev := ignored.eventsWith(gpustack.ReasonIgnored); len(ev) != 1 || len(ignored.events) != 1 || !strings.Contains(ev[0], "ClusterPolicy cluster-policy is active") {
		t.Errorf("want one Ignored event naming the active policy: %v", ignored.events)
	}
	got := getPolicy(t, younger.Name)
	ready := meta.FindStatusCondition(got.Status.Conditions, nvidiav1.ConditionReady)
	if got.Status.State != nvidiav1.StateIgnored || ready == nil || ready.Status != metav1.ConditionFalse ||
		ready.Reason != gpustack.ReasonIgnored || !strings.Contains(ready.Message, active.Name) {
		t.Errorf("ignored policy: state %s, Ready %+v; want ignored, a condition naming %s", got.Status.State, ready, active.Name)
	}

	again := d.reconcile(younger.Name)
	if again.err != nil || len(again.writes) != 0 || len(again.wire) != 0 || len(again.events) != 0 {
		t.Errorf("reconciling an ignored policy again must write and record nothing: %s", again)
	}
	if a := getPolicy(t, active.Name); a.Status.State != "" {
		t.Errorf("reconciling the ignored policy touched the active one: %+v", a.Status)
	}
	if left, err := stackLeft(t.Context()); err != nil || len(left) != 0 {
		t.Errorf("an ignored policy deployed objects: %v %v", left, err)
	}
}

func TestReconcileAfterARestartBetweenApplyAndStatus(t *testing.T) {
	d := newDirect(t)
	nodes := listNodes(t)
	// Cluster-scoped objects too: the driver manager's and (with MIG
	// manager) mig-manager's ClusterRole and binding.
	p := createPolicy(t, "cluster-policy", func(p *nvidiav1.ClusterPolicy) { p.Spec.MIGManager.Enabled = ptr.To(true) })

	// The first pass applies the objects and labels the nodes; its status
	// write fails (as if the operator stopped right there).
	d.log.failNextStatusWrites(1)
	crashed := d.reconcile(p.Name)
	if !errors.Is(crashed.err, errInjected) || len(crashed.events) != 0 {
		t.Fatalf("pass whose status write failed: want its error and no event: %s", crashed)
	}
	created := crashed.keys("Create")
	if crashed.count("Create", "DaemonSet") == 0 || crashed.count("Create", "ClusterRoleBinding") != 2 || crashed.count("Patch", "Node") != len(nodes.gpu) {
		t.Fatalf("the interrupted pass did not apply the objects and node labels: %s", crashed)
	}
	if s := getPolicy(t, p.Name).Status; s.State != "" || len(s.Conditions) != 0 {
		t.Fatalf("status written although the write failed: %+v", s)
	}
	before := uids(t, crashed)

	// A new Reconciler, as after a restart, takes over.
	restarted := d.reconcileWith(d.reconciler(), p.Name)
	if restarted.err != nil {
		t.Fatalf("after the restart: %s", restarted)
	}
	for _, w := range restarted.writes {
		if w.verb == "Create" && (slices.Contains(created, w.kind+" "+w.key) || w.err != nil) {
			t.Errorf("after the restart: %s (the interrupted pass had created it)", w)
		}
	}
	if restarted.count("Update", "DaemonSet") != 0 || len(restarted.keys("Delete")) != 0 {
		t.Errorf("after the restart, objects were rewritten or deleted: %s", restarted)
	}
	if n := restarted.count("Patch", "ClusterPolicy/status"); n != 1 {
		t.Errorf("after the restart the status was written %d times, want once: %s", n, restarted)
	}
	t.Logf("the restarted pass created %v (rendered from the runtime labels the interrupted pass set)", restarted.keys("Create"))
	for key, uid := range uids(t, crashed) {
		if before[key] != uid {
			t.Errorf("%s was recreated (UID %s -> %s)", key, before[key], uid)
		}
	}
	got := getPolicy(t, p.Name)
	if got.Status.State != nvidiav1.StateNotReady || got.Status.Namespace != ns || got.Status.ObservedGeneration != got.Generation {
		t.Errorf("status after the restart: %+v", got.Status)
	}
}

// brokenAssets are the embedded manifests with one of them replaced.
func brokenAssets(t *testing.T, component, doc string) fs.FS {
	t.Helper()
	out := fstest.MapFS{}
	entries, err := fs.ReadDir(gpustack.Assets, ".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := fs.ReadFile(gpustack.Assets, e.Name())
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = &fstest.MapFile{Data: data}
	}
	if _, ok := out[component+".yaml"]; !ok {
		t.Fatalf("no asset %s.yaml", component)
	}
	out[component+".yaml"] = &fstest.MapFile{Data: []byte(doc)}
	return out
}

func TestReconcileMalformedAssetReportsRenderFailed(t *testing.T) {
	d := newDirect(t)
	p := createPolicy(t, "cluster-policy", nil)
	deployed := d.reconcile(p.Name)
	if deployed.err != nil {
		t.Fatalf("deploying with the embedded assets: %s", deployed)
	}
	before := uids(t, deployed)
	if len(before) == 0 {
		t.Fatalf("nothing deployed: %s", deployed)
	}

	r := d.reconciler()
	r.Assets = brokenAssets(t, gpustack.DevicePlugin, "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: nvidia-device-plugin-daemonset\nspec:\n  bogus: 1\n")
	broken := d.reconcileWith(r, p.Name)
	if broken.err != nil {
		t.Errorf("a render failure is reported in the status, not retried: %v", broken.err)
	}
	if len(broken.writes) != 1 || broken.count("Patch", "ClusterPolicy/status") != 1 {
		t.Errorf("a render failure must write the status only (no object deleted or changed): %s", broken)
	}
	if ev := broken.eventsWith(gpustack.ReasonRenderFailed); len(ev) != 1 || len(broken.events) != 1 ||
		!strings.HasPrefix(ev[0], "Warning ") || !strings.Contains(ev[0], gpustack.DevicePlugin) {
		t.Errorf("want one RenderFailed Warning naming %s: %v", gpustack.DevicePlugin, broken.events)
	}
	got := getPolicy(t, p.Name)
	deg := meta.FindStatusCondition(got.Status.Conditions, nvidiav1.ConditionDegraded)
	ready := meta.FindStatusCondition(got.Status.Conditions, nvidiav1.ConditionReady)
	if got.Status.State != nvidiav1.StateNotReady || deg == nil || deg.Status != metav1.ConditionTrue || deg.Reason != gpustack.ReasonRenderFailed ||
		!strings.Contains(deg.Message, gpustack.DevicePlugin) || ready == nil || ready.Status != metav1.ConditionFalse {
		t.Errorf("status with a malformed asset: state %s, Degraded %+v, Ready %+v", got.Status.State, deg, ready)
	}

	again := d.reconcileWith(r, p.Name)
	if again.err != nil || len(again.writes) != 0 || len(again.wire) != 0 || len(again.events) != 0 {
		t.Errorf("the same render failure again must write and record nothing: %s", again)
	}
	for key, uid := range uids(t, deployed) {
		if before[key] != uid {
			t.Errorf("%s was recreated (UID %s -> %s)", key, before[key], uid)
		}
	}
}

// waitGarbageCollector waits until kube-controller-manager's garbage
// collector acts on ClusterPolicies and NodeMaintenance: it starts watching
// custom resources on its discovery sync (every 30 s) after their CRDs are
// installed, so just after TestMain a deleted ClusterPolicy's dependents
// can stay for half a minute. A probe policy owning one request (on a CPU
// node, which nothing acts on) shows when it is ready.
func waitGarbageCollector(t *testing.T, node string) {
	t.Helper()
	ctx := t.Context()
	probe := v16Policy(t)
	probe.Name = "gc-probe"
	if err := k8s.Create(ctx, probe); err != nil {
		t.Fatal(err)
	}
	req := requestor.Request{RequestorID: "gc-probe.gpufleet.test", Namespace: ns, Name: "gc-probe", NodeName: node, Owner: probe, Cordon: ptr.To(false)}
	t.Cleanup(func() {
		_ = requestor.Release(context.Background(), k8s, ns, req.Name)
		_ = k8s.Delete(context.Background(), probe)
	})
	if _, err := requestor.Ensure(ctx, k8s, req); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Delete(ctx, probe); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		nm, err := requestor.Get(ctx, k8s, ns, req.Name)
		return err == nil && nm == nil, nil
	})
	if err != nil {
		t.Fatalf("the garbage collector never removed the NodeMaintenance of a deleted ClusterPolicy")
	}
	t.Logf("garbage collector ready for ClusterPolicy dependents (probe collected in %s)", time.Since(began).Round(100*time.Millisecond))
}

func TestReconcileDriverUpgradeRequestsNodeMaintenance(t *testing.T) {
	const limit = 2
	d := newDirect(t)
	nodes := listNodes(t)
	waitGarbageCollector(t, nodes.cpu[0])
	p := createPolicy(t, "cluster-policy", func(p *nvidiav1.ClusterPolicy) {
		p.Spec.Driver.UpgradePolicy = &nvidiav1.DriverUpgradePolicySpec{MaxParallelUpgrades: ptr.To[int32](limit)}
	})
	if first := d.reconcile(p.Name); first.err != nil {
		t.Fatalf("first reconcile: %s", first)
	}
	oldImage := ":" + p.Spec.Driver.Version + "-"
	for node, pod := range waitDriverPods(t, nodes, true) {
		if !strings.Contains(pod.Spec.Containers[0].Image, oldImage) {
			t.Fatalf("driver pod on %s runs %s, want the old version", node, pod.Spec.Containers[0].Image)
		}
	}

	p = getPolicy(t, p.Name)
	p.Spec.Driver.Version = "550.54.15"
	if err := k8s.Update(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	upgrade := d.reconcile(p.Name)
	if upgrade.err != nil {
		t.Fatalf("reconcile of the new driver version: %s", upgrade)
	}
	if n := upgrade.count("Create", "NodeMaintenance"); n != limit {
		t.Errorf("%d NodeMaintenance requested, want maxParallelUpgrades=%d: %s", n, limit, upgrade)
	}
	if n := len(upgrade.eventsWith(gpustack.ReasonUpgradeStarted)); n != limit {
		t.Errorf("%d %s events, want %d: %v", n, gpustack.ReasonUpgradeStarted, limit, upgrade.events)
	}
	mine, err := requestor.Mine(t.Context(), k8s, ns, gpustack.UpgradeRequestor)
	if err != nil {
		t.Fatal(err)
	}
	var held []string
	for node, nm := range mine {
		held = append(held, node)
		if nm.Spec.RequestorID != gpustack.UpgradeRequestor || nm.Spec.NodeName != node {
			t.Errorf("NodeMaintenance %s: requestor %s, node %s", nm.Name, nm.Spec.RequestorID, nm.Spec.NodeName)
		}
		if owner := requestor.OwnerOf(nm, "ClusterPolicy"); owner != p.Name || metav1.GetControllerOf(nm).UID != p.UID {
			t.Errorf("NodeMaintenance %s: controller owner %q (%v), want ClusterPolicy %s", nm.Name, owner, nm.OwnerReferences, p.Name)
		}
		if !nm.CordonRequested() || nm.Spec.DrainSpec == nil || !slices.ContainsFunc(nm.Spec.DrainSpec.PodEvictionFilters, func(f maintenancev1.PodEvictionFilterEntry) bool {
			return ptr.Deref(f.ByResourceNameRegex, "") == `^nvidia\.com/`
		}) {
			t.Errorf("NodeMaintenance %s: want a cordon and a drain of the GPU pods only: cordon %v, drain %+v", nm.Name, nm.Spec.Cordon, nm.Spec.DrainSpec)
		}
		if l := getNode(t, node).Labels[nvidiav1.LabelUpgradeState]; l != "upgrading" {
			t.Errorf("node %s under upgrade labelled %s=%q", node, nvidiav1.LabelUpgradeState, l)
		}
	}
	sort.Strings(held)
	if !slices.Equal(held, nodes.gpu[:limit]) {
		t.Errorf("upgrades requested for %v, want the first %d GPU nodes by name %v", held, limit, nodes.gpu[:limit])
	}

	// The requests are Pending (no maintenance controller runs): another
	// pass waits, within the limit, and restarts no driver.
	d.clock.Step(time.Hour)
	waiting := d.reconcile(p.Name)
	if waiting.err != nil || waiting.count("Create", "NodeMaintenance") != 0 || waiting.count("Delete", "Pod") != 0 {
		t.Errorf("with the upgrades Pending, a pass must request no more and restart no driver: %s", waiting)
	}
	if mine, _ := requestor.Mine(t.Context(), k8s, ns, gpustack.UpgradeRequestor); len(mine) != limit {
		t.Errorf("%d upgrades requested, limit %d", len(mine), limit)
	}

	// Deleting the ClusterPolicy garbage-collects its requests.
	if err := k8s.Delete(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	var left []maintenancev1.NodeMaintenance
	err = wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		left, err = upgradeMaintenance(ctx)
		return err == nil && len(left) == 0, nil
	})
	if err != nil {
		var names []string
		for _, nm := range left {
			names = append(names, nm.Name)
		}
		t.Fatalf("NodeMaintenance of a deleted ClusterPolicy not garbage-collected within 30s: %v", names)
	}
	t.Logf("NodeMaintenance garbage-collected %s after the ClusterPolicy was deleted", time.Since(deleted).Round(100*time.Millisecond))
	var gone nvidiav1.ClusterPolicy
	if err := k8s.Get(t.Context(), client.ObjectKeyFromObject(p), &gone); !apierrors.IsNotFound(err) {
		t.Errorf("ClusterPolicy still there: %v", err)
	}
}
