// Package liveowner tells whether another operator that owns the same
// objects as gpufleet is still running: NVIDIA's GPU Operator (ClusterPolicy
// stack) or NVIDIA's Maintenance Operator (NodeMaintenance). Both elect a
// leader through a coordination.k8s.io Lease of a fixed name in their own
// namespace; a lease that is held and renewed within its duration means the
// other operator acts on the cluster, and gpufleet must not act beside it.
//
// The decision is pure (Held); the controllers read the leases from a cache
// restricted to these names and look again when a lease would expire.
package liveowner

import (
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
)

// Operator is another operator whose leader-election lease gpufleet reads.
type Operator struct {
	// Name is how users know it.
	Name string
	// Lease is the name of its leader-election Lease (in its own namespace).
	Lease string
	// Stop says how to stop it for a switch to gpufleet.
	Stop string
}

var (
	// GPUOperator is NVIDIA's GPU Operator (controller-runtime leader
	// election ID of its manager).
	GPUOperator = Operator{Name: "NVIDIA GPU Operator", Lease: "53822513.nvidia.com",
		Stop: "scale its Deployment to 0 (kubectl -n <namespace> scale deployment gpu-operator --replicas=0), or see gpufleet takeover --from gpu-operator"}
	// MaintenanceOperator is NVIDIA's Maintenance Operator.
	MaintenanceOperator = Operator{Name: "NVIDIA Maintenance Operator", Lease: "a9620a8f.nvidia.com",
		Stop: "scale its Deployment to 0 (kubectl -n <namespace> scale deployment maintenance-operator --replicas=0), or see gpufleet takeover --from maintenance-operator"}
)

// defaultLeaseDuration is controller-runtime's lease duration, for a lease
// that does not state its own.
const defaultLeaseDuration = 15 * time.Second

// Holding is a live holder of an operator's lease.
type Holding struct {
	Operator  Operator
	Namespace string
	Holder    string
	// Until is when the lease expires unless renewed again: the time to
	// look again.
	Until time.Time
	// Reason, when set, is what was seen instead of a lease (Rivals): a
	// Deployment of an operator that runs without leader election, or a
	// second gpufleet.
	Reason string
}

// Message says who holds the objects and why gpufleet waits.
func (h Holding) Message() string {
	if h.Reason != "" {
		return h.Reason
	}
	if strings.HasPrefix(h.Holder, FencePrefix) {
		return fmt.Sprintf("another gpufleet operator (%s) acts in place of %s (it holds Lease %s/%s, renewed until %s): two gpufleet operators run in this cluster; this one does not act beside it — stop one of them",
			strings.TrimPrefix(h.Holder, FencePrefix), h.Operator.Name, h.Namespace, h.Operator.Lease, h.Until.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("%s is running (Lease %s/%s held by %s, renewed until %s): gpufleet does not act beside it; %s",
		h.Operator.Name, h.Namespace, h.Operator.Lease, h.Holder, h.Until.UTC().Format(time.RFC3339), h.Operator.Stop)
}

// Names reports whether msg is this holding's Message (whatever renewal
// time it states): the same operator, lease and holder, or the same
// Reason.
func (h Holding) Names(msg string) bool {
	return msg != "" && beforeRenewal(msg) == beforeRenewal(h.Message())
}

// beforeRenewal is a Message up to the renewal time it states.
func beforeRenewal(msg string) string {
	before, _, _ := strings.Cut(msg, ", renewed until ")
	return before
}

// Held returns the live holding of op's lease among leases (any
// namespace), if any: a lease of op's name with a holder, renewed (or
// acquired) within its duration of now. A lease released on shutdown has
// no holder; a crashed holder's lease expires.
func Held(leases []coordinationv1.Lease, op Operator, now time.Time) (Holding, bool) {
	var best Holding
	found := false
	for i := range leases {
		l := &leases[i]
		if l.Name != op.Lease || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
			continue
		}
		renewed := l.Spec.RenewTime
		if renewed == nil {
			renewed = l.Spec.AcquireTime
		}
		if renewed == nil {
			continue
		}
		d := defaultLeaseDuration
		if l.Spec.LeaseDurationSeconds != nil && *l.Spec.LeaseDurationSeconds > 0 {
			d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
		}
		until := renewed.Add(d)
		if !now.Before(until) {
			continue
		}
		if !found || until.After(best.Until) {
			best = Holding{Operator: op, Namespace: l.Namespace, Holder: *l.Spec.HolderIdentity, Until: until}
			found = true
		}
	}
	return best, found
}
