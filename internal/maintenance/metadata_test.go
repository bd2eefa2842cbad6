package maintenance

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

func TestMetadataFor(t *testing.T) {
	now := time.Date(2026, 7, 1, 10, 0, 0, 0, time.UTC)
	earlier := metav1.NewTime(now.Add(-time.Minute))
	const (
		initial = maintenancev1.AnnotationNodeInitialUnschedulable
		start   = maintenancev1.AnnotationWaitPodCompletionStart
	)
	wait := &maintenancev1.WaitForPodCompletionSpec{}
	tests := map[string]struct {
		phase          maintenancev1.Phase
		noFinalizer    bool
		deleting       bool
		cordon         *bool
		wait           *maintenancev1.WaitForPodCompletionSpec
		annotations    map[string]string
		statusBefore   *bool
		statusStart    *metav1.Time
		nodeCordoned   bool
		wantFinalizer  bool
		wantAnnotation map[string]string
	}{
		"pending: nothing (the finalizer step handles it)": {phase: maintenancev1.PhasePending, noFinalizer: true},
		"scheduled by gpufleet: its scheduler's record":    {phase: maintenancev1.PhaseScheduled, statusBefore: ptr.To(false), nodeCordoned: true, wantAnnotation: map[string]string{initial: "false"}},
		"scheduled by the reference, no finalizer":         {phase: maintenancev1.PhaseScheduled, noFinalizer: true, nodeCordoned: true, wantFinalizer: true, wantAnnotation: map[string]string{initial: "true"}},
		"scheduled, node schedulable":                      {phase: maintenancev1.PhaseScheduled, wantAnnotation: map[string]string{initial: "false"}},
		"scheduled, cordon false: no record":               {phase: maintenancev1.PhaseScheduled, cordon: ptr.To(false)},
		"scheduled with wait: its start too":               {phase: maintenancev1.PhaseScheduled, wait: wait, wantAnnotation: map[string]string{initial: "false", start: "2026-07-01T10:00:00Z"}},
		"cordon by the reference, recorded":                {phase: maintenancev1.PhaseCordon, annotations: map[string]string{initial: "true"}},
		"cordon by the reference, before its record":       {phase: maintenancev1.PhaseCordon, wantAnnotation: map[string]string{initial: "false"}},
		"cordon, unparsable record is rewritten":           {phase: maintenancev1.PhaseCordon, annotations: map[string]string{initial: "maybe"}, nodeCordoned: true, wantAnnotation: map[string]string{initial: "true"}},
		"waiting, taken over with its start":               {phase: maintenancev1.PhaseWaitForPodCompletion, wait: wait, annotations: map[string]string{start: "2026-07-01T09:00:00Z"}},
		"waiting, taken over without a start: now":         {phase: maintenancev1.PhaseWaitForPodCompletion, wait: wait, wantAnnotation: map[string]string{start: "2026-07-01T10:00:00Z"}},
		"waiting, gpufleet status start is kept":           {phase: maintenancev1.PhaseWaitForPodCompletion, wait: wait, statusStart: &earlier, wantAnnotation: map[string]string{start: "2026-07-01T09:59:00Z"}},
		"waiting without waitForPodCompletion: nothing":    {phase: maintenancev1.PhaseWaitForPodCompletion},
		"draining: no node record rewritten":               {phase: maintenancev1.PhaseDraining},
		"draining by the reference, no finalizer":          {phase: maintenancev1.PhaseDraining, noFinalizer: true, wantFinalizer: true},
		"ready: nothing":                                   {phase: maintenancev1.PhaseReady, wait: wait},
		"deleting: nothing":                                {phase: maintenancev1.PhaseScheduled, deleting: true, noFinalizer: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			nm := &maintenancev1.NodeMaintenance{
				ObjectMeta: metav1.ObjectMeta{Name: "nm", Annotations: tc.annotations},
				Spec:       maintenancev1.NodeMaintenanceSpec{NodeName: "n", Cordon: tc.cordon, WaitForPodCompletion: tc.wait},
			}
			if !tc.noFinalizer {
				nm.Finalizers = []string{maintenancev1.Finalizer}
			}
			if tc.deleting {
				nm.DeletionTimestamp = &earlier
			}
			if tc.phase != maintenancev1.PhasePending {
				setPhase(nm, tc.phase, "", now)
			}
			nm.Status.NodeUnschedulableBefore = tc.statusBefore
			nm.Status.WaitForCompletionStartTime = tc.statusStart
			node := &corev1.Node{Spec: corev1.NodeSpec{Unschedulable: tc.nodeCordoned}}
			gotFinalizer, gotAnnotations := metadataFor(nm, node, now)
			if gotFinalizer != tc.wantFinalizer {
				t.Errorf("finalizer = %t, want %t", gotFinalizer, tc.wantFinalizer)
			}
			if diff := cmp.Diff(tc.wantAnnotation, gotAnnotations); diff != "" {
				t.Errorf("annotations (-want +got):\n%s", diff)
			}
		})
	}
}
