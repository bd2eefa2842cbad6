// Package podindex indexes the operator's cached pods by node, so that the
// controllers that need one node's pods (maintenance, repair) read those and
// not every pod of the cluster.
package podindex

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// NodeName is the field index of pods by spec.nodeName.
const NodeName = "spec.nodeName"

// Register adds the index to the manager's cache; call it once per manager.
func Register(ctx context.Context, idx client.FieldIndexer) error {
	if err := idx.IndexField(ctx, &corev1.Pod{}, NodeName, func(o client.Object) []string {
		if n := o.(*corev1.Pod).Spec.NodeName; n != "" {
			return []string{n}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("indexing pods by node: %w", err)
	}
	return nil
}

// OnNode lists the cached pods bound to node.
func OnNode(ctx context.Context, c client.Reader, node string) ([]corev1.Pod, error) {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.MatchingFields{NodeName: node}); err != nil {
		return nil, fmt.Errorf("listing pods on node %s: %w", node, err)
	}
	return pods.Items, nil
}
