package takeover

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	nvidiav1alpha1 "github.com/gpufleet/gpufleet/api/nvidia/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/liveowner"
)

// Options of a takeover.
type Options struct {
	// Client reads and writes with the caller's identity (a scheme with
	// the core, apps, coordination, nvidia.com and maintenance types).
	Client    client.Client
	Direction Direction
	// Namespace is gpufleet's; Deployment names its Deployment there and
	// its leader lease.
	Namespace, Deployment string
	// Timeout bounds the wait for the stopped operator's lease to be free
	// (default 2 minutes).
	Timeout time.Duration
	// DryRun prints the plan and changes nothing.
	DryRun bool
	Out    io.Writer
	Clock  clock.PassiveClock
	// PollInterval of the wait (default 1 s).
	PollInterval time.Duration
}

// Errors a takeover returns.
var (
	// ErrProblems: the plan has problems; nothing was changed.
	ErrProblems = errors.New("the takeover has problems")
	// ErrStillRunning: the stopped operator still holds its lease.
	ErrStillRunning = errors.New("the operator is still running")
)

// Read takes the snapshot of the cluster a takeover plans from: one List
// per kind (the stack's DaemonSets and pods in its namespace only).
func Read(ctx context.Context, c client.Client, o Options, now time.Time) (Snapshot, error) {
	s := Snapshot{Namespace: o.Namespace, OwnDeployment: o.Deployment, Now: now}
	var deps appsv1.DeploymentList
	if err := c.List(ctx, &deps); err != nil {
		return s, fmt.Errorf("listing Deployments: %w", err)
	}
	s.Deployments = deps.Items
	for _, name := range []string{o.Direction.Operator.owner().Lease, o.Deployment} {
		var leases coordinationv1.LeaseList
		if err := c.List(ctx, &leases, client.MatchingFields{"metadata.name": name}); err != nil {
			return s, fmt.Errorf("listing leases named %s: %w", name, err)
		}
		s.Leases = append(s.Leases, leases.Items...)
	}
	switch o.Direction.Operator {
	case GPUOperator:
		err := readGPUStack(ctx, c, &s)
		return s, err
	case MaintenanceOperator:
		var nms maintenancev1.NodeMaintenanceList
		if err := c.List(ctx, &nms); err != nil && !noCRD(err) {
			return s, fmt.Errorf("listing NodeMaintenance objects: %w", err)
		}
		s.NodeMaintenances = nms.Items
	}
	return s, nil
}

func readGPUStack(ctx context.Context, c client.Client, s *Snapshot) error {
	var policies nvidiav1.ClusterPolicyList
	if err := c.List(ctx, &policies); err != nil && !noCRD(err) {
		return fmt.Errorf("listing ClusterPolicies: %w", err)
	}
	s.Policies = policies.Items
	var gcs nvidiav1alpha1.GPUClusterList
	if err := c.List(ctx, &gcs); err != nil && !noCRD(err) {
		return fmt.Errorf("listing GPUClusters: %w", err)
	}
	s.GPUClusters = gcs.Items
	if len(s.Policies) == 0 && len(s.GPUClusters) == 0 {
		return nil
	}
	var drivers nvidiav1alpha1.NVIDIADriverList
	if err := c.List(ctx, &drivers); err != nil && !noCRD(err) {
		return fmt.Errorf("listing NVIDIADrivers: %w", err)
	}
	s.NVIDIADrivers = drivers.Items
	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes); err != nil {
		return fmt.Errorf("listing nodes: %w", err)
	}
	s.Nodes = nodes.Items
	ns := s.StackNamespace()
	var dss appsv1.DaemonSetList
	if err := c.List(ctx, &dss, client.InNamespace(ns)); err != nil {
		return fmt.Errorf("listing the DaemonSets of namespace %s: %w", ns, err)
	}
	s.DaemonSets = dss.Items
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		return fmt.Errorf("listing the pods of namespace %s: %w", ns, err)
	}
	s.Pods = pods.Items
	return nil
}

func noCRD(err error) bool { return meta.IsNoMatchError(err) || apierrors.IsNotFound(err) }

// Run plans the takeover, prints the plan and, unless it is a dry run or
// the plan has problems, carries it out: the Deployments of Stop scaled to
// 0 (their replicas recorded), a bounded wait until the stopped operator's
// lease is free, then the Deployments of Start scaled up. Every step is
// idempotent: run it again after any interruption.
func Run(ctx context.Context, o Options) error {
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Minute
	}
	if o.PollInterval <= 0 {
		o.PollInterval = time.Second
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	say := func(format string, args ...any) { _, _ = fmt.Fprintf(o.Out, format+"\n", args...) }
	s, err := Read(ctx, o.Client, o, o.Clock.Now())
	if err != nil {
		return err
	}
	plan := MakePlan(s, o.Direction)
	if o.DryRun {
		say("(dry run: nothing is changed)")
	}
	if err := plan.Write(o.Out); err != nil {
		return err
	}
	if o.DryRun {
		return nil
	}
	if len(plan.Problems) > 0 {
		return fmt.Errorf("%w (%d, listed above): nothing was changed", ErrProblems, len(plan.Problems))
	}
	say("")
	for _, w := range plan.Stop {
		if err := scale(ctx, o.Client, w, 0, fmt.Sprint(w.Replicas)); err != nil {
			return err
		}
		say("scaled %s to 0 (from %s)", w, replicas(w.Replicas))
	}
	stopped, in := plan.Operator, "" // its lease, in any namespace
	if o.Direction.Back {
		stopped, in = liveowner.Operator{Name: "gpufleet", Lease: o.Deployment}, o.Namespace
	}
	if err := waitFree(ctx, o, stopped, in, say); err != nil {
		return err
	}
	for _, w := range plan.Start {
		n := w.RestoreReplicas()
		if err := scale(ctx, o.Client, w, n, ""); err != nil {
			return err
		}
		say("scaled %s to %s", w, replicas(n))
	}
	if o.Direction.Back {
		say("%s takes over from here; gpufleet's Deployment stays at 0 replicas (gpufleet takeover --from %s starts it again)",
			plan.Operator.Name, o.Direction.Operator)
		return nil
	}
	say("gpufleet takes over: its controllers continue from here (adopting what is listed above); nothing else is written by this command")
	return nil
}

// scale sets a Deployment's replicas, recording from (the replicas before
// a stop) in an annotation, or removing that record ("").
func scale(ctx context.Context, c client.Client, w Workload, replicas int32, from string) error {
	record := "null"
	if from != "" {
		record = fmt.Sprintf("%q", from)
	}
	patch := client.RawPatch("application/merge-patch+json",
		fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%s}},"spec":{"replicas":%d}}`, AnnotationScaledDownFrom, record, replicas))
	d := &appsv1.Deployment{}
	d.Namespace, d.Name = w.Namespace, w.Name
	if err := c.Patch(ctx, d, patch); err != nil {
		return fmt.Errorf("scaling %s to %d: %w", w, replicas, err)
	}
	return nil
}

// waitFree waits, at most o.Timeout, until op's lease is free in namespace
// ns ("": every namespace): released, or expired.
func waitFree(ctx context.Context, o Options, op liveowner.Operator, ns string, say func(string, ...any)) error {
	why, readErr := "not looked at yet", error(nil)
	err := wait.PollUntilContextTimeout(ctx, o.PollInterval, o.Timeout, true, func(ctx context.Context) (bool, error) {
		var leases coordinationv1.LeaseList
		if err := o.Client.List(ctx, &leases, client.MatchingFields{"metadata.name": op.Lease}, client.InNamespace(ns)); err != nil {
			readErr = err
			return false, nil //nolint:nilerr // a failed look does not end the wait: the timeout does, and reports it
		}
		readErr = nil
		h, held := liveowner.Held(leases.Items, op, o.Clock.Now())
		if held {
			why = fmt.Sprintf("lease %s/%s is held by %s", h.Namespace, op.Lease, h.Holder)
		}
		return !held, nil
	})
	if err == nil {
		say("%s stopped (its lease %s is free)", op.Name, op.Lease)
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if readErr != nil {
		why += fmt.Sprintf(" (the last look failed: %v)", readErr)
	}
	return fmt.Errorf("%w: %s after %s: %s; its Deployment is scaled to 0: look at its pods, then run this again to finish",
		ErrStillRunning, op.Name, o.Timeout, why)
}
