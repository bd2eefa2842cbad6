package requestor

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// What the maintenance engine and its requestors (the repair controller,
// gpufleet uninstall) agree on about nodes and pods: the engine's
// contract, kept here so that they need not import the engine.

// SurvivesDrain reports whether a drain leaves the pod on its node (a
// DaemonSet's or a static pod's mirror).
func SurvivesDrain(p *corev1.Pod) bool {
	if c := metav1.GetControllerOf(p); c != nil && c.Kind == "DaemonSet" {
		return true
	}
	_, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]
	return mirror
}

// SetUnschedulable cordons (v true) or uncordons node with a patch of
// spec.unschedulable alone: the one way gpufleet changes it (the
// maintenance engine, and gpufleet uninstall releasing what it cordoned).
func SetUnschedulable(ctx context.Context, c client.Client, node *corev1.Node, v bool) error {
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"unschedulable": v}})
	if err != nil {
		return err
	}
	if err := c.Patch(ctx, node, client.RawPatch(types.StrategicMergePatchType, patch)); err != nil {
		return fmt.Errorf("setting node %s unschedulable=%t: %w", node.Name, v, err)
	}
	return nil
}
