package maintenance

import (
	"context"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

// +kubebuilder:rbac:groups=resource.nvidia.com,resources=computedomains,verbs=get;list;watch

// LabelComputeDomain (NVIDIA's DRA driver's node label, its value a
// ComputeDomain's UID) makes a domain busy (docs/maintenance.md, "NVLink
// domains").
const LabelComputeDomain = maintenancev1.LabelComputeDomain

// computeDomainRelist bounds how often UIDs that no ComputeDomain has
// (the CRD is not installed, or the object is gone but a label stays) are
// looked up again.
const computeDomainRelist = time.Minute

// ComputeDomainNames names ComputeDomains by UID for wait reasons. It
// lists their metadata only when a UID it has not seen appears (at most
// once per computeDomainRelist while some stay unknown); a UID it cannot
// name is shown as it is.
type ComputeDomainNames struct {
	// Reader lists ComputeDomain metadata (the API reader: no informer
	// is started for a CRD that may not be installed).
	Reader client.Reader
	Clock  clock.PassiveClock

	mu         sync.Mutex
	names      map[string]string // UID -> namespace/name
	lastListed time.Time
}

// Name returns "namespace/name" of the ComputeDomain with uid, or the UID.
func (c *ComputeDomainNames) Name(ctx context.Context, uid string) string {
	if c == nil || c.Reader == nil {
		return uid
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if n, ok := c.names[uid]; ok {
		return n
	}
	now := c.Clock.Now()
	if !c.lastListed.IsZero() && now.Sub(c.lastListed) < computeDomainRelist {
		return uid
	}
	c.lastListed = now
	var list metav1.PartialObjectMetadataList
	list.SetGroupVersionKind(maintenancev1.ComputeDomainListGVK)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.Reader.List(ctx, &list); err != nil {
		// Not installed (no such kind), not allowed, or not answering:
		// the UID is shown; the next try is after computeDomainRelist.
		return uid
	}
	c.names = make(map[string]string, len(list.Items))
	for i := range list.Items {
		o := &list.Items[i]
		c.names[string(o.UID)] = o.Namespace + "/" + o.Name
	}
	if n, ok := c.names[uid]; ok {
		return n
	}
	return uid
}

// computeDomainNodes is what the lifecycle waits for with
// waitForComputeDomains: the nodes of domain (by domainLabel) that run a
// ComputeDomain's workload, grouped by ComputeDomain UID (nodes sorted).
func computeDomainNodes(nodes []corev1.Node, domainLabel, domain string) map[string][]string {
	out := map[string][]string{}
	for i := range nodes {
		n := &nodes[i]
		uid := n.Labels[LabelComputeDomain]
		if uid == "" || n.Labels[domainLabel] != domain {
			continue
		}
		out[uid] = append(out[uid], n.Name)
	}
	for _, v := range out {
		sort.Strings(v)
	}
	return out
}

// computeDomainWait says what a node's maintenance waits for in its
// domain ("" for nothing): each ComputeDomain (named) with its nodes.
func computeDomainWait(domain string, running map[string][]string, name func(uid string) string) string {
	if len(running) == 0 {
		return ""
	}
	uids := make([]string, 0, len(running))
	for uid := range running {
		uids = append(uids, uid)
	}
	slices.Sort(uids)
	parts := make([]string, 0, len(uids))
	for _, uid := range uids {
		parts = append(parts, "ComputeDomain "+name(uid)+" on "+summarize(running[uid], domainMembersShown))
	}
	return "domain " + domain + ": waiting for its ComputeDomain workload to finish: " + strings.Join(parts, "; ")
}
