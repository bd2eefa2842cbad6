package devcluster

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// A simulated NVIDIA driver whose new pod cannot load while the old kernel
// module is still in use (a process on the host holds the GPUs), as a real
// driver upgrade sometimes finds; only a reboot frees the module.
//
// Annotating a node AnnotationModuleInUse with its current boot ID
// (status.nodeInfo.bootID) arms it: every driver pod (component "driver")
// that starts on the node from then on, until the node reboots, stays not
// Ready and reports, as the NVIDIA driver container does,
// ModuleInUseMessage in its container's last termination state (the
// driver DaemonSet's FallbackToLogsOnError). A pod that is Ready already
// keeps running: the module it loaded is the one in use. Once the boot ID
// changes, the pods it broke are restarted (deleted, as a reboot restarts
// every container; their DaemonSet creates them again) and load normally.
const (
	AnnotationModuleInUse = "sim.gpufleet.dev/driver-module-in-use"
	// annotationBrokenBy marks a driver pod broken for the boot ID it names.
	annotationBrokenBy = "sim.gpufleet.dev/module-in-use-at-boot"
	// ModuleInUseMessage is what the NVIDIA driver container prints.
	ModuleInUseMessage = "Stopping NVIDIA persistence daemon...\nUnloading NVIDIA driver kernel modules...\n" +
		"nvidia_uvm           1875968  2\nnvidia              56807424  113 nvidia_uvm\n" +
		"Could not unload NVIDIA driver kernel modules, driver is in use\n"
)

// moduleInUse plays the armed node's driver pods (see AnnotationModuleInUse).
func (s *simInit) moduleInUse(ctx context.Context, n *corev1.Node, pods []any) error {
	armed := n.Annotations[AnnotationModuleInUse]
	boot := n.Status.NodeInfo.BootID
	for _, o := range pods {
		p := o.(*corev1.Pod)
		if p.DeletionTimestamp != nil || p.Labels[labelComponent] != "driver" {
			continue
		}
		broken, isBroken := p.Annotations[annotationBrokenBy]
		switch {
		case isBroken && broken != boot:
			// Rebooted: the pod's containers start again, with the module free.
			err := s.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("restarting driver pod %s/%s after the reboot: %w", p.Namespace, p.Name, err)
			}
		case isBroken && p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].LastTerminationState.Terminated == nil:
			// kwok started it (not Ready): now it fails as the driver does.
			if err := s.reportModuleInUse(ctx, p); err != nil {
				return err
			}
		case !isBroken && armed != "" && armed == boot && !podReady(p):
			// Keep kwok from making it Ready; the status follows once kwok
			// has started it (a status written earlier would be replaced).
			patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:"true",%q:%q}}}`, AnnotationNeverReady, annotationBrokenBy, boot)
			if _, err := s.client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("arming driver pod %s/%s: %w", p.Namespace, p.Name, err)
			}
		}
	}
	return nil
}

func (s *simInit) reportModuleInUse(ctx context.Context, p *corev1.Pod) error {
	now := metav1.Now()
	statuses := make([]corev1.ContainerStatus, 0, len(p.Status.ContainerStatuses))
	for i, cs := range p.Status.ContainerStatuses {
		if i == 0 {
			cs.Ready, cs.Started, cs.RestartCount = false, ptr.To(false), cs.RestartCount+1
			cs.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff",
				Message: "back-off 10s restarting failed container=" + cs.Name + " pod=" + p.Name}}
			cs.LastTerminationState = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: 1, Reason: "Error", Message: ModuleInUseMessage, StartedAt: now, FinishedAt: now}}
		}
		statuses = append(statuses, cs)
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"containerStatuses": statuses}})
	if err != nil {
		return err
	}
	if _, err := s.client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("reporting the module in use on driver pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil
}
