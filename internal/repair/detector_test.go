package repair

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// writeLog records a detector pass's writes in order, and holds the fault
// clock writes until `hold` of them are in flight at once (or a second
// passed), to see how many it sends together.
type writeLog struct {
	mu           sync.Mutex
	order        []string
	inFlight     int
	most         int
	hold         int
	all          chan struct{}
	released     bool
	refuseCreate string // the node whose NodeRepair the API server refuses
}

func (w *writeLog) funcs() interceptor.Funcs {
	return interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if r, ok := obj.(*repairv1.NodeRepair); ok {
				w.mu.Lock()
				w.order = append(w.order, "create "+r.Spec.NodeName)
				w.mu.Unlock()
				if r.Spec.NodeName == w.refuseCreate {
					return apierrors.NewForbidden(repairv1.GroupVersion.WithResource("noderepairs").GroupResource(), r.Name, errors.New("refused by the test"))
				}
			}
			return c.Create(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			data, _ := patch.Data(obj)
			if _, ok := obj.(*corev1.Node); !ok || !strings.Contains(string(data), annotationFaults) {
				return c.Patch(ctx, obj, patch, opts...)
			}
			w.mu.Lock()
			w.order = append(w.order, "clock "+obj.GetName())
			w.inFlight++
			w.most = max(w.most, w.inFlight)
			if w.inFlight == w.hold && !w.released {
				// Once: on a loaded machine a write may time out of the
				// wait below before the others arrive, and a later batch
				// reach hold again.
				w.released = true
				close(w.all)
			}
			w.mu.Unlock()
			select {
			case <-w.all:
			case <-time.After(time.Second):
			}
			w.mu.Lock()
			w.inFlight--
			w.mu.Unlock()
			return c.Patch(ctx, obj, patch, opts...)
		},
	}
}

// TestDetectorCreatesTheRepairsBeforeTheFaultClocks: a burst of new faults
// on 40 nodes (each gets its fault clock) in the pass that also starts two
// repairs: the repairs are created before any clock is written, the clocks
// go out trackWriters at once, and a repair the API server refuses stops
// neither the other repair nor the clocks (the pass fails, to run again).
func TestDetectorCreatesTheRepairsBeforeTheFaultClocks(t *testing.T) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, repairv1.AddToScheme, maintenancev1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	policy := testPolicy(func(s *repairv1.NodeRepairPolicySpec) { s.MaxParallelPools = ptr.To[int32](2) })
	objs := []client.Object{policy}
	for i := range 2 { // past the threshold: repairs to start
		n := faultyNode(fmt.Sprintf("old-%d", i), fmt.Sprintf("pool-old-%d", i), now.Add(-time.Minute))
		objs = append(objs, &n)
	}
	const burst = 40
	for i := range burst { // just seen: a clock each
		n := faultyNode(fmt.Sprintf("new-%02d", i), fmt.Sprintf("pool-new-%02d", i), time.Time{})
		objs = append(objs, &n)
	}
	for _, refuse := range []string{"", "old-0"} {
		t.Run("refused "+refuse, func(t *testing.T) {
			log := &writeLog{hold: trackWriters, all: make(chan struct{}), refuseCreate: refuse}
			api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
				WithStatusSubresource(&repairv1.NodeRepairPolicy{}, &repairv1.NodeRepair{}).WithInterceptorFuncs(log.funcs()).Build()
			d := &Detector{Client: api, Clock: clocktesting.NewFakeClock(now), Recorder: events.NewFakeRecorder(100)}
			_, err := d.Reconcile(t.Context(), reconcile.Request{NamespacedName: client.ObjectKeyFromObject(policy)})
			if refuse == "" && err != nil {
				t.Fatal(err)
			}
			if refuse != "" && !strings.Contains(fmt.Sprint(err), "refused by the test") {
				t.Errorf("a refused repair: the pass returned %v, want the refusal (to run again)", err)
			}
			creates, clocks, firstClock := 0, 0, -1
			for i, w := range log.order {
				switch {
				case strings.HasPrefix(w, "create "):
					creates++
					if firstClock >= 0 {
						t.Errorf("%q written after the first fault clock (write %d): %v", w, i, log.order)
					}
				case firstClock < 0:
					firstClock = i
					fallthrough
				default:
					clocks++
				}
			}
			if creates != 2 || clocks != burst {
				t.Errorf("%d repairs created and %d clocks written; want 2 and %d", creates, clocks, burst)
			}
			if log.most != trackWriters {
				t.Errorf("at most %d fault clocks written at once, want %d", log.most, trackWriters)
			}
			var list repairv1.NodeRepairList
			if err := api.List(t.Context(), &list); err != nil {
				t.Fatal(err)
			}
			want := 2
			if refuse != "" {
				want = 1
			}
			if len(list.Items) != want {
				t.Errorf("%d NodeRepairs exist, want %d", len(list.Items), want)
			}
			// The operator restarts and the API server takes the write now:
			// the next pass creates only the repair still missing and
			// writes no clock again.
			log.mu.Lock()
			log.order, log.refuseCreate = nil, ""
			log.mu.Unlock()
			if _, err := d.Reconcile(t.Context(), reconcile.Request{NamespacedName: client.ObjectKeyFromObject(policy)}); err != nil {
				t.Fatalf("the pass after: %v", err)
			}
			wantAfter := []string(nil)
			if refuse != "" {
				wantAfter = []string{"create " + refuse}
			}
			if !slices.Equal(log.order, wantAfter) {
				t.Errorf("the pass after wrote %v, want %v", log.order, wantAfter)
			}
			if err := api.List(t.Context(), &list); err != nil || len(list.Items) != 2 {
				t.Errorf("%d NodeRepairs after the pass after (%v), want 2", len(list.Items), err)
			}
		})
	}
}

// countingReader counts the GPUFault records its lists return.
type countingReader struct {
	client.Reader
	read int
}

func (c *countingReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	err := c.Reader.List(ctx, list, opts...)
	if l, ok := list.(*repairv1.GPUFaultList); ok {
		c.read += len(l.Items)
	}
	return err
}

// TestANodeEventReadsThatNodesGPUFaultsOnly: the isolator maps a slice or
// node event to the out-of-service records of that node through the index
// (100 nodes with 10 records each: one event reads 10, not 1,000); a
// policy change maps to every out-of-service record.
func TestANodeEventReadsThatNodesGPUFaultsOnly(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := repairv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	var objs []client.Object
	for n := range 100 {
		for g := range 10 {
			gf := &repairv1.GPUFault{}
			gf.Name, gf.Spec.NodeName = fmt.Sprintf("node-%03d-gpu-%d", n, g), fmt.Sprintf("node-%03d", n)
			if g%2 == 0 {
				gf.Status.Class = repairv1.GPUClassResetGPU // out of service
			}
			objs = append(objs, gf)
		}
	}
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithIndex(&repairv1.GPUFault{}, indexGPUNode, func(o client.Object) []string { return []string{o.(*repairv1.GPUFault).Spec.NodeName} }).Build()
	c := &countingReader{Reader: api}
	reqs, err := recordsOutOfService(t.Context(), c, "node-007")
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 5 || c.read != 10 {
		t.Errorf("one node's event: %d records queued after reading %d; want its 5 out of service, read from its 10", len(reqs), c.read)
	}
	for _, r := range reqs {
		if !strings.HasPrefix(r.Name, "node-007-") {
			t.Errorf("queued %s for an event of node-007", r.Name)
		}
	}
	if all, err := recordsOutOfService(t.Context(), c, ""); err != nil || len(all) != 500 {
		t.Errorf("a policy change: %d records queued (%v), want 500", len(all), err)
	}
}

// TestDetectorStatusConflictIsRetriedQuietly: a status write refused with
// a conflict (the cache still held the policy before the pass's own
// previous write) is no error: the pass runs again shortly, with the
// repairs it created kept; any other refusal is returned, without a
// requeue time beside it.
func TestDetectorStatusConflictIsRetriedQuietly(t *testing.T) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, repairv1.AddToScheme, maintenancev1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	policy := testPolicy(nil)
	n := faultyNode("old-0", "pool-0", now.Add(-time.Minute))
	for _, tc := range []struct {
		name    string
		refusal error
		wantErr bool
	}{
		{"conflict", apierrors.NewConflict(repairv1.GroupVersion.WithResource("noderepairpolicies").GroupResource(), policy.Name, errors.New("modified")), false},
		{"forbidden", apierrors.NewForbidden(repairv1.GroupVersion.WithResource("noderepairpolicies").GroupResource(), policy.Name, errors.New("refused by the test")), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(policy.DeepCopy(), n.DeepCopy()).
				WithStatusSubresource(&repairv1.NodeRepairPolicy{}, &repairv1.NodeRepair{}).
				WithInterceptorFuncs(interceptor.Funcs{SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
					if _, ok := obj.(*repairv1.NodeRepairPolicy); ok {
						return tc.refusal
					}
					return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
				}}).Build()
			d := &Detector{Client: api, Clock: clocktesting.NewFakeClock(now), Recorder: events.NewFakeRecorder(100)}
			res, err := d.Reconcile(t.Context(), reconcile.Request{NamespacedName: client.ObjectKeyFromObject(policy)})
			if tc.wantErr {
				if err == nil || res.RequeueAfter != 0 {
					t.Errorf("refused: result %+v, error %v; want the error and no requeue time", res, err)
				}
				return
			}
			if err != nil || res.RequeueAfter <= 0 || res.RequeueAfter > statusConflictRetry {
				t.Errorf("conflict: result %+v, error %v; want no error and a retry within %s", res, err, statusConflictRetry)
			}
			var list repairv1.NodeRepairList
			if err := api.List(t.Context(), &list); err != nil || len(list.Items) != 1 {
				t.Errorf("%d repairs after the pass (%v), want the one it started", len(list.Items), err)
			}
		})
	}
}
