package devcluster

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Simulated validation init containers. A GPU stack pod can carry init
// containers named as NVIDIA's GPU Operator names them (driver-validation,
// toolkit-validation, plugin-validation): on a real node each waits until
// that component works on the node (whether a pod of the stack or the host
// provides it) and only then do the pod's containers start. kwok cannot
// look at other objects, so this loop plays that part for the simulated
// kubelets: the pod-create stage leaves a pod with such init containers
// Pending with its init containers running, and once every component they
// validate is Ready on the pod's node (a Ready pod labelled
// app.kubernetes.io/component=<component> there, or the node's
// nvidia.com/gpu.deploy.<component> label not "true": not the stack's to
// run there) the loop annotates the pod AnnotationInitialized; the
// pod-ready stage then starts it as any other pod. It reacts at once,
// where a real validator polls (gpu-operator's every 5 s).
const (
	// AnnotationInitialized marks a pod whose validation init containers
	// have completed.
	AnnotationInitialized = "sim.gpufleet.dev/initialized"
	labelComponent        = "app.kubernetes.io/component"
	deployLabelPrefix     = "nvidia.com/gpu.deploy."
)

// validatedComponent maps a validation init container to the stack
// component (app.kubernetes.io/component value) it waits for.
var validatedComponent = map[string]string{
	"driver-validation":  "driver",
	"toolkit-validation": "container-toolkit",
	"plugin-validation":  "device-plugin",
}

const podsByNode = "node"

// simInit runs the simulated validation init containers until ctx ends.
type simInit struct {
	client kubernetes.Interface
	pods   cache.Indexer
	nodes  cache.Indexer
	queue  workqueue.TypedRateLimitingInterface[string]
}

func (c *Cluster) startSimInit(ctx context.Context) error {
	f := informers.NewSharedInformerFactory(c.Client, 0)
	podInf, nodeInf := f.Core().V1().Pods().Informer(), f.Core().V1().Nodes().Informer()
	if err := podInf.AddIndexers(cache.Indexers{podsByNode: func(obj any) ([]string, error) {
		if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" {
			return []string{p.Spec.NodeName}, nil
		}
		return nil, nil
	}}); err != nil {
		return err
	}
	s := &simInit{client: c.Client, pods: podInf.GetIndexer(), nodes: nodeInf.GetIndexer(),
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())}
	enqueuePod := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" {
			s.queue.Add(p.Spec.NodeName)
		}
	}
	if _, err := podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueuePod, UpdateFunc: func(_, n any) { enqueuePod(n) }, DeleteFunc: enqueuePod,
	}); err != nil {
		return err
	}
	if _, err := nodeInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, n any) { s.queue.Add(n.(*corev1.Node).Name) },
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	// Nodes start their stacks independently, as their kubelets do: at
	// 1,000 nodes one worker held hundreds of pods initialising.
	runNodeLoop(ctx, s.queue, []cache.InformerSynced{podInf.HasSynced, nodeInf.HasSynced}, s.sync, nil, 8)
	return nil
}

// sync completes the validation init containers of the node's pods whose
// components are Ready there.
func (s *simInit) sync(ctx context.Context, node string) error {
	obj, ok, err := s.nodes.GetByKey(node)
	if err != nil || !ok {
		return err
	}
	n := obj.(*corev1.Node)
	if n.Labels[LabelKubelet] == "stopped" {
		return nil // a dead kubelet runs nothing
	}
	objs, err := s.pods.ByIndex(podsByNode, node)
	if err != nil {
		return err
	}
	if err := s.moduleInUse(ctx, n, objs); err != nil {
		return err
	}
	ready := map[string]bool{}
	for _, o := range objs {
		p := o.(*corev1.Pod)
		if p.DeletionTimestamp == nil && podReady(p) {
			ready[p.Labels[labelComponent]] = true
		}
	}
	validated := func(component string) bool {
		return ready[component] || n.Labels[deployLabelPrefix+component] != "true"
	}
	for _, o := range objs {
		p := o.(*corev1.Pod)
		if p.DeletionTimestamp != nil || p.Annotations[AnnotationInitialized] == "true" || !waitsFor(p, validated) {
			continue
		}
		patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:"true"}}}`, AnnotationInitialized)
		_, err := s.client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("completing the init containers of pod %s/%s: %w", p.Namespace, p.Name, err)
		}
	}
	return nil
}

// waitsFor reports whether p has validation init containers and all of
// them pass.
func waitsFor(p *corev1.Pod, validated func(component string) bool) bool {
	gated := false
	for _, c := range p.Spec.InitContainers {
		comp, ok := validatedComponent[c.Name]
		if !ok {
			continue
		}
		gated = true
		if !validated(comp) {
			return false
		}
	}
	return gated
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
