package repair

import (
	"context"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// writeEnd writes the end of a repair (l, decided on read) on the stored
// version, after its first write conflicted: the status this pass decided,
// with the timeline entries written meanwhile (an agent's outcome) kept
// before this pass's own. A repair that ended meanwhile is left as it is.
func (r *Repairer) writeEnd(ctx context.Context, read *repairv1.NodeRepair, l *ladder) error {
	added := l.nr.Status.Timeline[len(read.Status.Timeline):]
	var err error
	for range 5 {
		fresh := &repairv1.NodeRepair{}
		if err := r.Live.Get(ctx, client.ObjectKeyFromObject(read), fresh); err != nil {
			return fmt.Errorf("reading NodeRepair %s again to record its end: %w", read.Name, err)
		}
		if fresh.Status.Phase != "" && fresh.Status.Phase != repairv1.PhaseRepairing {
			l.final = "" // ended by another pass: nothing more of this one
			return nil
		}
		after := fresh.DeepCopy()
		after.Status = *l.nr.Status.DeepCopy()
		after.Status.Timeline = append(slices.Clone(fresh.Status.Timeline), added...)
		if err = r.Client.Status().Patch(ctx, after, client.MergeFromWithOptions(fresh, client.MergeFromWithOptimisticLock{})); !apierrors.IsConflict(err) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("recording the end of NodeRepair %s: %w", read.Name, err)
	}
	return nil
}
