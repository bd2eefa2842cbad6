package requestor_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/event"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/maintenance/requestor"
)

const ns = "gpufleet-system"

func testScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, maintenancev1.AddToScheme, repairv1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func fakeClient(t *testing.T, objs ...client.Object) client.Client {
	t.Helper()
	return fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(objs...).Build()
}

// nodeRepair is a cluster-scoped owner.
func nodeRepair(name string) *repairv1.NodeRepair {
	return &repairv1.NodeRepair{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)}}
}

// request is a complete request for node, owned by a NodeRepair.
func request(name, node, requestorID string) requestor.Request {
	return requestor.Request{
		RequestorID: requestorID, Namespace: ns, Name: name, NodeName: node, Owner: nodeRepair("repair-of-" + node),
		Cordon: ptr.To(true),
		Drain:  &maintenancev1.DrainSpec{Force: true, TimeoutSeconds: ptr.To[int32](120)},
	}
}

// nmOf builds a NodeMaintenance directly (not through a Request).
func nmOf(name, node, requestorID string) *maintenancev1.NodeMaintenance {
	return &maintenancev1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       maintenancev1.NodeMaintenanceSpec{RequestorID: requestorID, NodeName: node},
	}
}

func withPhase(nm *maintenancev1.NodeMaintenance, phase maintenancev1.Phase) *maintenancev1.NodeMaintenance {
	status := metav1.ConditionFalse
	if phase == maintenancev1.PhaseReady {
		status = metav1.ConditionTrue
	}
	nm.Status.Conditions = append(nm.Status.Conditions, metav1.Condition{
		Type: maintenancev1.ConditionTypeReady, Status: status, Reason: string(phase),
	})
	return nm
}

func TestRequestObjectRequiredFields(t *testing.T) {
	tests := map[string]struct {
		mutate  func(*requestor.Request)
		wantErr string
	}{
		"complete":             {mutate: func(*requestor.Request) {}},
		"no requestor":         {mutate: func(r *requestor.Request) { r.RequestorID = "" }, wantErr: "requestor, name and node are required"},
		"no name":              {mutate: func(r *requestor.Request) { r.Name = "" }, wantErr: "requestor, name and node are required"},
		"no node":              {mutate: func(r *requestor.Request) { r.NodeName = "" }, wantErr: "requestor, name and node are required"},
		"no owner is optional": {mutate: func(r *requestor.Request) { r.Owner = nil }},
		"owner in another namespace": {
			mutate: func(r *requestor.Request) {
				r.Owner = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "elsewhere", Name: "cm", UID: "uid-cm"}}
			},
			wantErr: "cross-namespace owner references are disallowed",
		},
		"owner type unknown to the scheme": {
			mutate:  func(r *requestor.Request) { r.Owner = &unknownOwner{ObjectMeta: metav1.ObjectMeta{Name: "x"}} },
			wantErr: "no kind is registered",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := request("nm", "gpu-000", "test.gpufleet.dev")
			tc.mutate(&r)
			nm, err := r.Object(testScheme(t))
			if tc.wantErr == "" {
				if err != nil || nm == nil {
					t.Fatalf("Object() = %v, %v; want an object", nm, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Object() error = %v, want one containing %q", err, tc.wantErr)
			}
			if !strings.Contains(err.Error(), ns+"/"+r.Name) {
				t.Errorf("error %q does not name the request %s/%s", err, ns, r.Name)
			}
			if nm != nil {
				t.Errorf("Object() returned %v along with an error", nm)
			}
		})
	}
}

// unknownOwner is a type the test scheme does not know.
type unknownOwner struct {
	metav1.TypeMeta
	metav1.ObjectMeta
}

func (u *unknownOwner) DeepCopyObject() runtime.Object { c := *u; return &c }

func TestRequestObjectBuildsTheObject(t *testing.T) {
	owner := nodeRepair("gpu-003-xid79")
	r := requestor.Request{
		RequestorID: "repair.gpufleet.dev", Namespace: ns, Name: "repair-gpu-003-xid79", NodeName: "gpu-003",
		Owner:                owner,
		Cordon:               ptr.To(false),
		Drain:                &maintenancev1.DrainSpec{Force: true, DeleteEmptyDir: true, TimeoutSeconds: ptr.To[int32](60), PodSelector: "app=train"},
		WaitForPodCompletion: &maintenancev1.WaitForPodCompletionSpec{PodSelector: "job=x", TimeoutSeconds: ptr.To[int32](30)},
		AdditionalRequestors: []string{"other.requestor"},
		Labels:               map[string]string{"app.kubernetes.io/component": "repair"},
		Urgent:               true,
	}
	nm, err := r.Object(testScheme(t))
	if err != nil {
		t.Fatal(err)
	}
	want := &maintenancev1.NodeMaintenance{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: "repair-gpu-003-xid79",
			Labels:      map[string]string{"app.kubernetes.io/component": "repair"},
			Annotations: map[string]string{maintenancev1.AnnotationUrgent: "true"},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: repairv1.GroupVersion.String(), Kind: "NodeRepair", Name: owner.Name, UID: owner.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(false),
			}},
		},
		Spec: maintenancev1.NodeMaintenanceSpec{
			RequestorID: "repair.gpufleet.dev", NodeName: "gpu-003", Cordon: ptr.To(false),
			DrainSpec:            &maintenancev1.DrainSpec{Force: true, DeleteEmptyDir: true, TimeoutSeconds: ptr.To[int32](60), PodSelector: "app=train"},
			WaitForPodCompletion: &maintenancev1.WaitForPodCompletionSpec{PodSelector: "job=x", TimeoutSeconds: ptr.To[int32](30)},
			AdditionalRequestors: []string{"other.requestor"},
		},
	}
	if diff := cmp.Diff(want, nm); diff != "" {
		t.Errorf("Object() (-want +got):\n%s", diff)
	}
	if got := requestor.OwnerOf(nm, "NodeRepair"); got != owner.Name {
		t.Errorf("OwnerOf(NodeRepair) = %q, want %q", got, owner.Name)
	}

	// The drain and wait specs are copies: changing the object (as the API
	// server's defaulting or a later mutation would) leaves the request alone.
	nm.Spec.DrainSpec.Force = false
	*nm.Spec.DrainSpec.TimeoutSeconds = 1
	nm.Spec.WaitForPodCompletion.PodSelector = "changed"
	*nm.Spec.WaitForPodCompletion.TimeoutSeconds = 1
	if !r.Drain.Force || *r.Drain.TimeoutSeconds != 60 {
		t.Errorf("the object's drain spec aliases the request's: request now %+v", r.Drain)
	}
	if r.WaitForPodCompletion.PodSelector != "job=x" || *r.WaitForPodCompletion.TimeoutSeconds != 30 {
		t.Errorf("the object's waitForPodCompletion aliases the request's: request now %+v", r.WaitForPodCompletion)
	}
	// And the other way round: reusing the request's specs for the next
	// request does not change an object already built.
	r.Drain.PodSelector = "app=other"
	if nm.Spec.DrainSpec.PodSelector != "app=train" {
		t.Errorf("changing the request changed the built object's drain spec: %+v", nm.Spec.DrainSpec)
	}
}

func TestEnsure(t *testing.T) {
	ctx := context.Background()
	c := fakeClient(t)
	r := request("repair-a", "gpu-001", "repair.gpufleet.dev")

	created, err := requestor.Ensure(ctx, c, r)
	if err != nil {
		t.Fatal(err)
	}
	got, err := requestor.Get(ctx, c, ns, "repair-a")
	if err != nil || got == nil {
		t.Fatalf("Get after Ensure = %v, %v", got, err)
	}
	if got.Spec.NodeName != "gpu-001" || got.Spec.RequestorID != "repair.gpufleet.dev" || got.UID != created.UID {
		t.Errorf("stored object %+v does not match the created one", got.Spec)
	}
	if requestor.OwnerOf(got, "NodeRepair") != "repair-of-gpu-001" {
		t.Errorf("stored object has owners %+v", got.OwnerReferences)
	}

	// A second call (e.g. after a crash before the requestor recorded the
	// first) returns the existing object, untouched.
	r2 := r
	r2.Drain = &maintenancev1.DrainSpec{TimeoutSeconds: ptr.To[int32](5)}
	again, err := requestor.Ensure(ctx, c, r2)
	if err != nil {
		t.Fatalf("second Ensure: %v", err)
	}
	if again.UID != created.UID || again.ResourceVersion != got.ResourceVersion {
		t.Errorf("second Ensure returned uid %s rv %s, want the existing %s rv %s", again.UID, again.ResourceVersion, created.UID, got.ResourceVersion)
	}
	if *again.Spec.DrainSpec.TimeoutSeconds != 120 {
		t.Errorf("second Ensure returned drain %+v, want the existing object's", again.Spec.DrainSpec)
	}
	var list maintenancev1.NodeMaintenanceList
	if err := c.List(ctx, &list); err != nil || len(list.Items) != 1 {
		t.Fatalf("%d objects after two Ensure calls (err %v), want 1", len(list.Items), err)
	}

	// The name is taken by another node's or another requestor's object.
	for name, clash := range map[string]requestor.Request{
		"other node":      request("repair-a", "gpu-002", "repair.gpufleet.dev"),
		"other requestor": request("repair-a", "gpu-001", "someone.else"),
	} {
		t.Run(name, func(t *testing.T) {
			nm, err := requestor.Ensure(ctx, c, clash)
			if err == nil {
				t.Fatalf("Ensure over %s's object returned %v, want an error", name, nm)
			}
			for _, want := range []string{ns + "/repair-a", "gpu-001", "repair.gpufleet.dev", clash.NodeName, clash.RequestorID} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
		})
	}

	// An incomplete request is refused before any API call.
	if _, err := requestor.Ensure(ctx, c, requestor.Request{Namespace: ns, Name: "x"}); err == nil {
		t.Error("Ensure of an incomplete request succeeded")
	}
}

func TestEnsureReportsAPIErrors(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("etcd is on fire")
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error { return boom },
	}).Build()
	_, err := requestor.Ensure(ctx, c, request("repair-a", "gpu-001", "repair.gpufleet.dev"))
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "gpu-001") {
		t.Errorf("Ensure error = %v, want the create error wrapped with the node", err)
	}
}

func TestGet(t *testing.T) {
	ctx := context.Background()
	c := fakeClient(t, nmOf("there", "gpu-001", "a.b"))
	nm, err := requestor.Get(ctx, c, ns, "absent")
	if nm != nil || err != nil {
		t.Errorf("Get(absent) = %v, %v; want nil, nil", nm, err)
	}
	nm, err = requestor.Get(ctx, c, ns, "there")
	if err != nil || nm == nil || nm.Spec.NodeName != "gpu-001" {
		t.Errorf("Get(there) = %v, %v", nm, err)
	}

	boom := errors.New("connection refused")
	failing := fake.NewClientBuilder().WithScheme(testScheme(t)).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
			return boom
		},
	}).Build()
	nm, err = requestor.Get(ctx, failing, ns, "there")
	if nm != nil || !errors.Is(err, boom) || !strings.Contains(err.Error(), ns+"/there") {
		t.Errorf("Get on a failing client = %v, %v; want nil and the error, naming the object", nm, err)
	}
}

func TestRelease(t *testing.T) {
	ctx := context.Background()
	c := fakeClient(t, nmOf("held", "gpu-001", "a.b"), nmOf("kept", "gpu-002", "a.b"))
	for i := range 2 { // releasing what is gone is not an error
		if err := requestor.Release(ctx, c, ns, "held"); err != nil {
			t.Fatalf("Release #%d: %v", i+1, err)
		}
	}
	if nm, err := requestor.Get(ctx, c, ns, "held"); nm != nil || err != nil {
		t.Errorf("after Release, Get = %v, %v; want nil, nil", nm, err)
	}
	if nm, err := requestor.Get(ctx, c, ns, "kept"); nm == nil || err != nil {
		t.Errorf("Release deleted another object: Get(kept) = %v, %v", nm, err)
	}
	if err := requestor.Release(ctx, c, ns, "never-existed"); err != nil {
		t.Errorf("Release of an object that never existed: %v", err)
	}

	// An object with the maintenance finalizer stays (being deleted) until
	// the lifecycle controller releases the node; Release again is fine.
	fin := nmOf("finalized", "gpu-003", "a.b")
	fin.Finalizers = []string{maintenancev1.Finalizer}
	c = fakeClient(t, fin)
	for range 2 {
		if err := requestor.Release(ctx, c, ns, "finalized"); err != nil {
			t.Fatal(err)
		}
	}
	got, err := requestor.Get(ctx, c, ns, "finalized")
	if err != nil || got == nil || got.DeletionTimestamp == nil {
		t.Errorf("finalized object after Release = %v, %v; want it present and being deleted", got, err)
	}

	boom := errors.New("forbidden")
	failing := fake.NewClientBuilder().WithScheme(testScheme(t)).WithInterceptorFuncs(interceptor.Funcs{
		Delete: func(context.Context, client.WithWatch, client.Object, ...client.DeleteOption) error { return boom },
	}).Build()
	if err := requestor.Release(ctx, failing, ns, "held"); !errors.Is(err, boom) {
		t.Errorf("Release on a failing client = %v, want the delete error", err)
	}
}

func TestMine(t *testing.T) {
	ctx := context.Background()
	deleting := nmOf("mine-deleting", "gpu-003", "me.requestor")
	deleting.Finalizers = []string{maintenancev1.Finalizer}
	c := fakeClient(t,
		nmOf("mine-1", "gpu-001", "me.requestor"),
		nmOf("mine-2", "gpu-002", "me.requestor"),
		deleting,
		nmOf("theirs", "gpu-004", "other.requestor"),
		// Mine in name only: another requestor's object names me as an
		// additional requestor; it is not mine to release.
		&maintenancev1.NodeMaintenance{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "shared"},
			Spec:       maintenancev1.NodeMaintenanceSpec{RequestorID: "other.requestor", NodeName: "gpu-005", AdditionalRequestors: []string{"me.requestor"}},
		},
		&maintenancev1.NodeMaintenance{
			ObjectMeta: metav1.ObjectMeta{Namespace: "elsewhere", Name: "mine-elsewhere"},
			Spec:       maintenancev1.NodeMaintenanceSpec{RequestorID: "me.requestor", NodeName: "gpu-006"},
		},
	)
	if err := c.Delete(ctx, deleting); err != nil {
		t.Fatal(err)
	}
	got, err := requestor.Mine(ctx, c, ns, "me.requestor")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for node, nm := range got {
		names[node] = nm.Name
		if nm.Spec.NodeName != node {
			t.Errorf("Mine()[%s] is the object of node %s", node, nm.Spec.NodeName)
		}
	}
	if diff := cmp.Diff(map[string]string{"gpu-001": "mine-1", "gpu-002": "mine-2"}, names); diff != "" {
		t.Errorf("Mine() by node (-want +got):\n%s", diff)
	}

	none, err := requestor.Mine(ctx, c, ns, "nobody")
	if err != nil || len(none) != 0 {
		t.Errorf("Mine(nobody) = %v, %v; want empty", none, err)
	}
}

func TestOwnerOf(t *testing.T) {
	withOwners := func(refs ...metav1.OwnerReference) *maintenancev1.NodeMaintenance {
		nm := nmOf("nm", "gpu-001", "a.b")
		nm.OwnerReferences = refs
		return nm
	}
	ref := func(kind, name string, controller bool) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: "x/v1", Kind: kind, Name: name, UID: types.UID(name), Controller: ptr.To(controller)}
	}
	tests := map[string]struct {
		nm   *maintenancev1.NodeMaintenance
		kind string
		want string
	}{
		"controller of that kind":        {nm: withOwners(ref("NodeRepair", "r1", true)), kind: "NodeRepair", want: "r1"},
		"controller of another kind":     {nm: withOwners(ref("ClusterPolicy", "p", true)), kind: "NodeRepair", want: ""},
		"owner that is not a controller": {nm: withOwners(ref("NodeRepair", "r1", false)), kind: "NodeRepair", want: ""},
		"no owner":                       {nm: withOwners(), kind: "NodeRepair", want: ""},
		"controller among other owners": {
			nm: withOwners(ref("NodeRepair", "not-controller", false), ref("NodeRepair", "r2", true)), kind: "NodeRepair", want: "r2",
		},
		// The name says nothing: only the reference counts.
		"name prefix but no reference": {nm: nmOf("repair-r1", "gpu-001", "repair.gpufleet.dev"), kind: "NodeRepair", want: ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := requestor.OwnerOf(tc.nm, tc.kind); got != tc.want {
				t.Errorf("OwnerOf(%s) = %q, want %q", tc.kind, got, tc.want)
			}
		})
	}
}

func TestOfRequestor(t *testing.T) {
	p := requestor.OfRequestor("me.requestor")
	mine, theirs := nmOf("a", "gpu-001", "me.requestor"), nmOf("b", "gpu-002", "other.requestor")
	shared := nmOf("c", "gpu-003", "other.requestor")
	shared.Spec.AdditionalRequestors = []string{"me.requestor"}
	tests := map[string]struct {
		obj  client.Object
		want bool
	}{
		"mine":                          {obj: mine, want: true},
		"another requestor's":           {obj: theirs, want: false},
		"me as an additional requestor": {obj: shared, want: false},
		"not a NodeMaintenance":         {obj: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-001"}}, want: false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := map[string]bool{
				"create":  p.Create(event.CreateEvent{Object: tc.obj}),
				"update":  p.Update(event.UpdateEvent{ObjectOld: tc.obj, ObjectNew: tc.obj}),
				"delete":  p.Delete(event.DeleteEvent{Object: tc.obj}),
				"generic": p.Generic(event.GenericEvent{Object: tc.obj}),
			}
			for kind, g := range got {
				if g != tc.want {
					t.Errorf("%s event passed = %t, want %t", kind, g, tc.want)
				}
			}
		})
	}
}

func TestTransitions(t *testing.T) {
	base := func() *maintenancev1.NodeMaintenance {
		return withPhase(nmOf("nm", "gpu-001", "a.b"), maintenancev1.PhaseDraining)
	}
	blocked := func(nm *maintenancev1.NodeMaintenance, status metav1.ConditionStatus) *maintenancev1.NodeMaintenance {
		nm.Status.Conditions = append(nm.Status.Conditions, metav1.Condition{
			Type: maintenancev1.ConditionTypeDrainBlocked, Status: status, Reason: "DrainBlocked", Message: "pod x/y",
		})
		return nm
	}
	drained := func(nm *maintenancev1.NodeMaintenance, progress int32, waiting ...string) *maintenancev1.NodeMaintenance {
		nm.Status.Drain = &maintenancev1.DrainStatus{TotalPods: 4, EvictionPods: 4, DrainProgress: progress, WaitForEviction: waiting}
		return nm
	}
	deleted := func(nm *maintenancev1.NodeMaintenance) *maintenancev1.NodeMaintenance {
		nm.DeletionTimestamp = ptr.To(metav1.NewTime(time.Unix(1700000000, 0)))
		nm.Finalizers = []string{maintenancev1.Finalizer}
		return nm
	}
	readyFalse := func(nm *maintenancev1.NodeMaintenance) *maintenancev1.NodeMaintenance {
		nm.Status.Conditions[0].Status = metav1.ConditionFalse
		return nm
	}
	tests := map[string]struct {
		old, new *maintenancev1.NodeMaintenance
		want     bool
	}{
		"drain progress only": {
			old: drained(base(), 25, "ns/a", "ns/b", "ns/c"), new: drained(base(), 50, "ns/b", "ns/c"), want: false,
		},
		"drain started (status.drain set)": {old: base(), new: drained(base(), 0, "ns/a"), want: false},
		"condition message only": {
			old: base(), new: func() *maintenancev1.NodeMaintenance {
				nm := base()
				nm.Status.Conditions[0].Message = "still draining"
				return nm
			}(),
			want: false,
		},
		"labels only": {
			old: base(), new: func() *maintenancev1.NodeMaintenance {
				nm := base()
				nm.Labels = map[string]string{"x": "y"}
				return nm
			}(),
			want: false,
		},
		"a Pending object's wait reason changes (shown on the requestor's object)": {
			old: withPhase(nmOf("nm", "gpu-001", "a.b"), maintenancev1.PhasePending), new: func() *maintenancev1.NodeMaintenance {
				nm := withPhase(nmOf("nm", "gpu-001", "a.b"), maintenancev1.PhasePending)
				nm.Status.Conditions[0].Message = "outside maintenance window; next opens 2026-12-04T01:00:00+01:00"
				return nm
			}(),
			want: true,
		},
		"no change":                           {old: base(), new: base(), want: false},
		"phase Draining to Ready":             {old: base(), new: withPhase(nmOf("nm", "gpu-001", "a.b"), maintenancev1.PhaseReady), want: true},
		"phase Pending to Scheduled":          {old: nmOf("nm", "gpu-001", "a.b"), new: withPhase(nmOf("nm", "gpu-001", "a.b"), maintenancev1.PhaseScheduled), want: true},
		"phase Cordon to Draining":            {old: withPhase(nmOf("nm", "gpu-001", "a.b"), maintenancev1.PhaseCordon), new: base(), want: true},
		"Ready flips, phase unchanged":        {old: withPhase(nmOf("nm", "gpu-001", "a.b"), maintenancev1.PhaseReady), new: readyFalse(withPhase(nmOf("nm", "gpu-001", "a.b"), maintenancev1.PhaseReady)), want: true},
		"DrainBlocked set":                    {old: base(), new: blocked(base(), metav1.ConditionTrue), want: true},
		"DrainBlocked cleared":                {old: blocked(base(), metav1.ConditionTrue), new: base(), want: true},
		"DrainBlocked True to False":          {old: blocked(base(), metav1.ConditionTrue), new: blocked(base(), metav1.ConditionFalse), want: true},
		"DrainBlocked stays, progress moves":  {old: drained(blocked(base(), metav1.ConditionTrue), 25), new: drained(blocked(base(), metav1.ConditionTrue), 75), want: false},
		"deletion starts":                     {old: base(), new: deleted(base()), want: true},
		"deleted object's drain progress":     {old: drained(deleted(base()), 25), new: drained(deleted(base()), 50), want: false},
		"not NodeMaintenance objects (other)": {old: nil, new: nil, want: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e := event.UpdateEvent{ObjectOld: tc.old, ObjectNew: tc.new}
			if tc.old == nil {
				e = event.UpdateEvent{ObjectOld: &corev1.Node{}, ObjectNew: &corev1.Node{}}
			}
			if got := requestor.Transitions.Update(e); got != tc.want {
				t.Errorf("Transitions.Update = %t, want %t", got, tc.want)
			}
		})
	}
	// Creations and deletions always pass.
	if !requestor.Transitions.Create(event.CreateEvent{Object: base()}) {
		t.Error("Transitions dropped a creation")
	}
	if !requestor.Transitions.Delete(event.DeleteEvent{Object: base()}) {
		t.Error("Transitions dropped a deletion")
	}
}

func TestRequestObjectCopiesLabelsAndAdditionalRequestors(t *testing.T) {
	r := request("nm", "gpu-000", "test.gpufleet.dev")
	r.Labels = map[string]string{"component": "driver"}
	r.AdditionalRequestors = []string{"other.requestor"}
	nm, err := r.Object(testScheme(t))
	if err != nil {
		t.Fatal(err)
	}
	nm.Labels["component"] = "changed"
	nm.Spec.AdditionalRequestors[0] = "changed"
	if r.Labels["component"] != "driver" {
		t.Errorf("labels aliased: %v", r.Labels)
	}
	if r.AdditionalRequestors[0] != "other.requestor" {
		t.Errorf("additionalRequestors aliased: %v", r.AdditionalRequestors)
	}
}
