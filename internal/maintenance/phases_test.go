package maintenance_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/maintenance"
	"github.com/gpufleet/gpufleet/internal/operator"
)

// phaseWatch records, from a real watch of NodeMaintenance objects, every
// Ready reason each object goes through, and the object as it was when it
// first showed each one.
type phaseWatch struct {
	mu     sync.Mutex
	phases map[string][]string
	first  map[string]map[string]*maintenancev1.NodeMaintenance
}

func watchPhases(t *testing.T, namespace string) *phaseWatch {
	t.Helper()
	scheme, err := operator.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.NewWithWatch(maintenance.AdminConfigForTest, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := c.Watch(ctx, &maintenancev1.NodeMaintenanceList{}, client.InNamespace(namespace))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	pw := &phaseWatch{phases: map[string][]string{}, first: map[string]map[string]*maintenancev1.NodeMaintenance{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			nm, ok := ev.Object.(*maintenancev1.NodeMaintenance)
			if !ok {
				continue
			}
			c := meta.FindStatusCondition(nm.Status.Conditions, maintenancev1.ConditionTypeReady)
			if c == nil {
				continue
			}
			pw.mu.Lock()
			seen := pw.phases[nm.Name]
			if len(seen) == 0 || seen[len(seen)-1] != c.Reason {
				pw.phases[nm.Name] = append(seen, c.Reason)
				if pw.first[nm.Name] == nil {
					pw.first[nm.Name] = map[string]*maintenancev1.NodeMaintenance{}
				}
				if _, ok := pw.first[nm.Name][c.Reason]; !ok {
					pw.first[nm.Name][c.Reason] = nm.DeepCopy()
				}
			}
			pw.mu.Unlock()
		}
	}()
	t.Cleanup(func() { w.Stop(); cancel(); <-done })
	return pw
}

func (pw *phaseWatch) of(name string) []string {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	return append([]string(nil), pw.phases[name]...)
}

func (pw *phaseWatch) firstIn(name, phase string) *maintenancev1.NodeMaintenance {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	return pw.first[name][phase]
}

var referencePhases = []string{"Pending", "Scheduled", "Cordon", "WaitForPodCompletion", "Draining", "Ready"}

// Every phase NVIDIA's Maintenance Operator writes is written, in its
// order, whatever the spec asks for: a client waiting for Cordon sees it.
// The object in each phase also carries what that operator reads in it
// (its finalizer, the node's state before the cordon, the wait's start),
// so it could continue the object after a switch back.
func TestEveryPhaseWrittenInOrder(t *testing.T) {
	withOperator(t, ios(4), nil)
	pw := watchPhases(t, "default")
	deployment(t, "phases", "phases-work", 2, nil, "gpu-001")

	drain := &maintenancev1.DrainSpec{PodSelector: "app=phases-work", Force: true}
	drainOnly := newNM("phases-drain", "gpu-001", "phases.example.com")
	drainOnly.Spec.DrainSpec = drain
	waitAndDrain := newNM("phases-wait", "gpu-002", "phases.example.com")
	waitAndDrain.Spec.DrainSpec = drain
	waitAndDrain.Spec.WaitForPodCompletion = &maintenancev1.WaitForPodCompletionSpec{PodSelector: "app=phases-nothing"}
	noCordon := newNM("phases-nocordon", "gpu-003", "phases.example.com")
	noCordon.Spec.Cordon = ptr.To(false)
	bare := newNM("phases-bare", "gpu-004", "phases.example.com") // no drain, no wait
	objs := []*maintenancev1.NodeMaintenance{drainOnly, waitAndDrain, noCordon, bare}
	for _, nm := range objs {
		create(t, nm)
	}
	for _, nm := range objs {
		waitPhase(t, nm.Name, maintenancev1.PhaseReady, 60*time.Second)
	}
	for _, nm := range objs {
		if diff := cmp.Diff(referencePhases, pw.of(nm.Name)); diff != "" {
			t.Errorf("%s: Ready reasons seen by a watch (-want +got):\n%s", nm.Name, diff)
		}
	}
	if getNode(t, "gpu-003").Spec.Unschedulable {
		t.Errorf("node gpu-003 cordoned for an object with cordon: false")
	}

	// What NVIDIA's Maintenance Operator reads in each phase.
	for _, nm := range objs {
		for _, phase := range referencePhases {
			got := pw.firstIn(nm.Name, phase)
			if got == nil {
				continue // reported above
			}
			hasFinalizer := got.HasFinalizer()
			switch phase {
			case "Pending", "Scheduled":
				// Both operators add the finalizer while handling Scheduled;
				// a Pending object without one is deleted at once by either.
				if phase == "Pending" && hasFinalizer {
					t.Errorf("%s in %s has the finalizer: NVIDIA's operator never removes it from a Pending object", nm.Name, phase)
				}
			default:
				if !hasFinalizer {
					t.Errorf("%s in %s lacks finalizer %s", nm.Name, phase, maintenancev1.Finalizer)
				}
				initial, ok := got.Annotations[maintenancev1.AnnotationNodeInitialUnschedulable]
				switch {
				case got.CordonRequested() && initial != "false":
					t.Errorf("%s in %s: %s = %q (present %t), want \"false\"", nm.Name, phase, maintenancev1.AnnotationNodeInitialUnschedulable, initial, ok)
				case !got.CordonRequested() && ok:
					t.Errorf("%s in %s: %s set without a cordon", nm.Name, phase, maintenancev1.AnnotationNodeInitialUnschedulable)
				}
				_, hasStart := got.Annotations[maintenancev1.AnnotationWaitPodCompletionStart]
				if phase == "WaitForPodCompletion" && got.Spec.WaitForPodCompletion != nil && !hasStart {
					t.Errorf("%s in %s lacks %s", nm.Name, phase, maintenancev1.AnnotationWaitPodCompletionStart)
				}
			}
			c := readyCondition(got)
			if wantTrue := phase == "Ready"; (c.Status == "True") != wantTrue {
				t.Errorf("%s in %s: Ready=%s", nm.Name, phase, c.Status)
			}
		}
	}
}
