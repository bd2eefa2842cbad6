package uninstall

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/testobj"
)

var t0 = time.Date(2026, 12, 3, 22, 0, 0, 0, time.UTC)

// nm is a NodeMaintenance that the lifecycle controller has taken over
// (it has the finalizer), as a value.
func nm(name, node string, opts ...testobj.NMOption) maintenancev1.NodeMaintenance {
	return *testobj.NodeMaintenance(name, node, append([]testobj.NMOption{testobj.Finalizer()}, opts...)...)
}

func key(name string) client.ObjectKey { return client.ObjectKey{Namespace: "default", Name: name} }

func TestMakePlan(t *testing.T) {
	nodes := map[string]*corev1.Node{
		"cordoned-1": testobj.Node("cordoned-1", testobj.Unschedulable()), "cordoned-2": testobj.Node("cordoned-2", testobj.Unschedulable()),
		"cordoned-3": testobj.Node("cordoned-3", testobj.Unschedulable()), "free": testobj.Node("free"),
	}
	tests := []struct {
		name string
		nms  []maintenancev1.NodeMaintenance
		want Plan
	}{
		{name: "nothing", want: Plan{}},
		{
			name: "a drained node is uncordoned, its object deleted and finalized",
			nms:  []maintenancev1.NodeMaintenance{nm("a", "cordoned-1", testobj.Phase(maintenancev1.PhaseReady), testobj.UnschedulableBefore(false))},
			want: Plan{Delete: []client.ObjectKey{key("a")}, Uncordon: []string{"cordoned-1"}, Finalize: []client.ObjectKey{key("a")}},
		},
		{
			name: "a node cordoned before its maintenance stays cordoned",
			nms:  []maintenancev1.NodeMaintenance{nm("a", "cordoned-1", testobj.Phase(maintenancev1.PhaseDraining), testobj.UnschedulableBefore(true))},
			want: Plan{Delete: []client.ObjectKey{key("a")}, Finalize: []client.ObjectKey{key("a")},
				LeftCordoned: map[string]string{"cordoned-1": "cordoned before its maintenance, or not by one"}},
		},
		{
			name: "the first of two objects cordoned the node: uncordoned once",
			nms: []maintenancev1.NodeMaintenance{
				nm("second", "cordoned-1", testobj.Phase(maintenancev1.PhaseReady), testobj.UnschedulableBefore(true)),
				nm("first", "cordoned-1", testobj.Phase(maintenancev1.PhaseReady), testobj.UnschedulableBefore(false)),
			},
			want: Plan{Delete: []client.ObjectKey{key("first"), key("second")}, Uncordon: []string{"cordoned-1"},
				Finalize: []client.ObjectKey{key("first"), key("second")}},
		},
		{
			name: "a Pending object holds nothing: deleted only (no finalizer yet)",
			nms:  []maintenancev1.NodeMaintenance{nm("p", "cordoned-2", testobj.NoFinalizer())},
			want: Plan{Delete: []client.ObjectKey{key("p")}},
		},
		{
			name: "an object already being deleted is finalized and its node released",
			nms:  []maintenancev1.NodeMaintenance{nm("d", "cordoned-2", testobj.Phase(maintenancev1.PhaseDraining), testobj.UnschedulableBefore(false), testobj.Deleting(t0))},
			want: Plan{Uncordon: []string{"cordoned-2"}, Finalize: []client.ObjectKey{key("d")}},
		},
		{
			name: "a deleted node: nothing to uncordon, the object still goes",
			nms:  []maintenancev1.NodeMaintenance{nm("g", "gone", testobj.Phase(maintenancev1.PhaseReady), testobj.UnschedulableBefore(false))},
			want: Plan{Delete: []client.ObjectKey{key("g")}, Finalize: []client.ObjectKey{key("g")}},
		},
		{
			name: "a node someone already uncordoned is left alone",
			nms:  []maintenancev1.NodeMaintenance{nm("f", "free", testobj.Phase(maintenancev1.PhaseReady), testobj.UnschedulableBefore(false))},
			want: Plan{Delete: []client.ObjectKey{key("f")}, Finalize: []client.ObjectKey{key("f")}},
		},
		{
			name: "a maintenance without cordon did not cordon the node",
			nms:  []maintenancev1.NodeMaintenance{nm("n", "cordoned-3", testobj.Phase(maintenancev1.PhaseReady), testobj.UnschedulableBefore(false), testobj.NoCordon())},
			want: Plan{Delete: []client.ObjectKey{key("n")}, Finalize: []client.ObjectKey{key("n")},
				LeftCordoned: map[string]string{"cordoned-3": "cordoned before its maintenance, or not by one"}},
		},
		{
			name: "a maintenance with additional requestors is released too",
			nms: []maintenancev1.NodeMaintenance{nm("shared", "cordoned-3", testobj.Phase(maintenancev1.PhaseReady), testobj.UnschedulableBefore(false),
				func(o *maintenancev1.NodeMaintenance) { o.Spec.AdditionalRequestors = []string{"other.example"} })},
			want: Plan{Delete: []client.ObjectKey{key("shared")}, Uncordon: []string{"cordoned-3"}, Finalize: []client.ObjectKey{key("shared")}},
		},
		{
			name: "cordon recorded but the object is Pending again: not a holder",
			nms:  []maintenancev1.NodeMaintenance{nm("q", "cordoned-1", testobj.UnschedulableBefore(false))},
			want: Plan{Delete: []client.ObjectKey{key("q")}, Finalize: []client.ObjectKey{key("q")}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := MakePlan(tt.nms, nodes)
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateEmpty(), cmpopts.IgnoreFields(Plan{}, "InProgress")); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
			if got.Empty() != (len(tt.want.Delete)+len(tt.want.Uncordon)+len(tt.want.Finalize) == 0) {
				t.Errorf("Empty() = %t", got.Empty())
			}
			if len(got.Describe()) == 0 {
				t.Error("no description")
			}
		})
	}
}

// FuzzMakePlan: for any objects and nodes, every object with the finalizer
// is finalized, every object not yet deleting is deleted, and only an
// unschedulable node that one of its in-progress objects cordoned is
// uncordoned.
func FuzzMakePlan(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7})
	f.Add([]byte{255, 3, 17, 42, 9})
	f.Fuzz(func(t *testing.T, data []byte) {
		nodes := map[string]*corev1.Node{}
		var nms []maintenancev1.NodeMaintenance
		phases := []maintenancev1.Phase{maintenancev1.PhasePending, maintenancev1.PhaseCordon, maintenancev1.PhaseDraining, maintenancev1.PhaseReady}
		for i, b := range data {
			n := string(rune('a' + b%4))
			if b&0x80 == 0 {
				nodes[n] = testobj.Node(n)
				nodes[n].Spec.Unschedulable = b&0x40 != 0
			}
			o := nm(strconv.Itoa(i), n)
			if p := phases[b>>2&3]; p != maintenancev1.PhasePending {
				testobj.Phase(p)(&o)
			}
			if b&0x10 != 0 {
				testobj.UnschedulableBefore(b&0x20 != 0)(&o)
			}
			if b&0x01 != 0 && b&0x02 != 0 {
				testobj.NoFinalizer()(&o)
			}
			if b&0x08 != 0 {
				testobj.Deleting(t0)(&o)
			}
			nms = append(nms, o)
		}
		p := MakePlan(nms, nodes)
		for i := range nms {
			o := &nms[i]
			k := client.ObjectKeyFromObject(o)
			if o.HasFinalizer() != slices.Contains(p.Finalize, k) {
				t.Errorf("%s: finalizer %t, finalized %t", k, o.HasFinalizer(), slices.Contains(p.Finalize, k))
			}
			if (o.DeletionTimestamp == nil) != slices.Contains(p.Delete, k) {
				t.Errorf("%s: deleting %t, in Delete %t", k, o.DeletionTimestamp != nil, slices.Contains(p.Delete, k))
			}
		}
		for _, n := range p.Uncordon {
			ok := nodes[n] != nil && nodes[n].Spec.Unschedulable
			cordoned := false
			for i := range nms {
				cordoned = cordoned || (nms[i].Spec.NodeName == n && nms[i].CordonedTheNode())
			}
			if !ok || !cordoned {
				t.Errorf("node %s uncordoned: unschedulable %t, cordoned by a maintenance %t", n, ok, cordoned)
			}
			if _, left := p.LeftCordoned[n]; left {
				t.Errorf("node %s both uncordoned and left cordoned", n)
			}
		}
	})
}

func TestLeaseHeld(t *testing.T) {
	lease := func(holder string, renewed *time.Time, seconds *int32) *coordinationv1.Lease {
		l := &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: seconds}}
		if holder != "" {
			l.Spec.HolderIdentity = ptr.To(holder)
		}
		if renewed != nil {
			l.Spec.RenewTime = &metav1.MicroTime{Time: *renewed}
		}
		return l
	}
	tests := []struct {
		name string
		l    *coordinationv1.Lease
		want bool
	}{
		{"released (ReleaseOnCancel clears the holder)", lease("", ptr.To(t0), ptr.To[int32](15)), false},
		{"renewed 5 s ago, 15 s lease", lease("op-1", ptr.To(t0.Add(-5*time.Second)), ptr.To[int32](15)), true},
		{"renewed 15 s ago, 15 s lease: expired", lease("op-1", ptr.To(t0.Add(-15*time.Second)), ptr.To[int32](15)), false},
		{"holder without times: held", lease("op-1", nil, nil), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, got := leaseHeld(tt.l, t0); got != tt.want {
				t.Errorf("held = %t, want %t", got, tt.want)
			}
		})
	}
}
