package devcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

// A simulated ComputeDomain workload: NVIDIA's DRA driver runs a
// multi-node NVLink job as a ComputeDomain (resource.nvidia.com/v1beta1);
// while a workload pod of it is prepared on a node, the driver's kubelet
// plugin labels the node LabelComputeDomain=<the ComputeDomain's UID>,
// and removes the label when the last such pod is gone. The simulation
// keeps that label from the worker pods it starts (LabelSimComputeDomain).
const (
	// LabelComputeDomain is the driver's node label.
	LabelComputeDomain = maintenancev1.LabelComputeDomain
	// LabelSimComputeDomain marks a simulated worker pod (value: the
	// ComputeDomain's name).
	LabelSimComputeDomain = "gpufleet.dev/sim-computedomain"
	// annotationSimComputeDomainUID: the ComputeDomain a worker belongs to.
	annotationSimComputeDomainUID = "gpufleet.dev/sim-computedomain-uid"
)

// ComputeDomainGVR is the resource of NVIDIA's ComputeDomains.
var ComputeDomainGVR = schema.GroupVersionResource{Group: "resource.nvidia.com", Version: "v1beta1", Resource: "computedomains"}

// computeDomainCRD is a reduced ComputeDomain CRD with the fields of NVIDIA's
// DRA driver's v1beta1 schema that the simulation and gpufleet read (spec
// immutable, a status subresource with the per-node entries).
const computeDomainCRD = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: computedomains.resource.nvidia.com
spec:
  group: resource.nvidia.com
  names: {kind: ComputeDomain, listKind: ComputeDomainList, plural: computedomains, singular: computedomain}
  scope: Namespaced
  versions:
  - name: v1beta1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [channel]
            x-kubernetes-validations:
            - {rule: "self == oldSelf", message: "A computeDomain.spec is immutable"}
            properties:
              numNodes: {type: integer, minimum: 0, default: 0}
              channel:
                type: object
                required: [resourceClaimTemplate]
                properties:
                  allocationMode: {type: string, enum: [All, Single], default: Single}
                  resourceClaimTemplate:
                    type: object
                    required: [name]
                    properties:
                      name: {type: string}
          status:
            type: object
            properties:
              status: {type: string, enum: [Ready, NotReady], default: NotReady}
              nodes:
                type: array
                x-kubernetes-list-type: map
                x-kubernetes-list-map-keys: [name]
                items:
                  type: object
                  required: [name, ipAddress, cliqueID]
                  properties:
                    name: {type: string}
                    ipAddress: {type: string}
                    cliqueID: {type: string}
                    index: {type: integer}
                    status: {type: string, enum: [Ready, NotReady], default: NotReady}
`

// ensureComputeDomainCRD installs the reduced CRD unless a ComputeDomain
// CRD is there, and waits until it is served.
func (c *Cluster) ensureComputeDomainCRD(ctx context.Context) error {
	cs, err := apiextensionsclient.NewForConfig(c.Config)
	if err != nil {
		return fmt.Errorf("apiextensions client: %w", err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict([]byte(computeDomainCRD), crd); err != nil {
		return fmt.Errorf("decoding the ComputeDomain CRD: %w", err)
	}
	if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating CRD %s: %w", crd.Name, err)
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		got, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // keep polling until served
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
}

// StartComputeDomain creates the ComputeDomain namespace/name (and the
// CRD, if missing) and one worker pod of it on each node, owned by the
// ComputeDomain (a drain evicts them; deleting it deletes them). The
// simulation (Start) labels each node as the driver would once its
// worker runs there. It returns the ComputeDomain's UID.
func (c *Cluster) StartComputeDomain(ctx context.Context, namespace, name string, nodes []string) (types.UID, error) {
	if len(nodes) == 0 {
		return "", fmt.Errorf("ComputeDomain %s/%s: no nodes", namespace, name)
	}
	if err := c.ensureComputeDomainCRD(ctx); err != nil {
		return "", err
	}
	if err := EnsureNamespace(ctx, c.Client, namespace); err != nil {
		return "", err
	}
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return "", err
	}
	cd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
		"metadata": map[string]any{"namespace": namespace, "name": name},
		"spec": map[string]any{"numNodes": int64(0), "channel": map[string]any{
			"resourceClaimTemplate": map[string]any{"name": name + "-channel"}}},
	}}
	got, err := dyn.Resource(ComputeDomainGVR).Namespace(namespace).Create(ctx, cd, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		got, err = dyn.Resource(ComputeDomainGVR).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return "", fmt.Errorf("ComputeDomain %s/%s: %w", namespace, name, err)
	}
	owner := metav1.OwnerReference{APIVersion: "resource.nvidia.com/v1beta1", Kind: "ComputeDomain", Name: name, UID: got.GetUID(),
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}
	for i, node := range nodes {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: namespace, Name: fmt.Sprintf("%s-worker-%d", name, i),
				Labels:          map[string]string{LabelSimComputeDomain: name},
				Annotations:     map[string]string{annotationSimComputeDomainUID: string(got.GetUID())},
				OwnerReferences: []metav1.OwnerReference{owner},
			},
			Spec: corev1.PodSpec{
				NodeName:    node,
				Containers:  []corev1.Container{{Name: "worker", Image: "registry.example/nvlink-job:1"}},
				Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			},
		}
		if _, err := c.Client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return "", fmt.Errorf("worker of ComputeDomain %s/%s on %s: %w", namespace, name, node, err)
		}
	}
	return got.GetUID(), nil
}

// EndComputeDomain ends the workload: its worker pods are deleted (the
// simulation then removes the nodes' labels) and so is the ComputeDomain.
func (c *Cluster) EndComputeDomain(ctx context.Context, namespace, name string) error {
	err := c.Client.CoreV1().Pods(namespace).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)},
		metav1.ListOptions{LabelSelector: LabelSimComputeDomain + "=" + name})
	if err != nil {
		return fmt.Errorf("deleting the workers of ComputeDomain %s/%s: %w", namespace, name, err)
	}
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	if err := dyn.Resource(ComputeDomainGVR).Namespace(namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting ComputeDomain %s/%s: %w", namespace, name, err)
	}
	return nil
}

// startSimComputeDomains keeps LabelComputeDomain on the nodes as NVIDIA's
// kubelet plugin does: set while a live worker pod of a ComputeDomain is
// on the node, removed once none is.
func (c *Cluster) startSimComputeDomains(ctx context.Context) error {
	f := informers.NewSharedInformerFactoryWithOptions(c.Client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = LabelSimComputeDomain
	}))
	podInf := f.Core().V1().Pods().Informer()
	const byNode = "node"
	if err := podInf.AddIndexers(cache.Indexers{byNode: func(obj any) ([]string, error) {
		if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" {
			return []string{p.Spec.NodeName}, nil
		}
		return nil, nil
	}}); err != nil {
		return err
	}
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	enqueue := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" {
			queue.Add(p.Spec.NodeName)
		}
	}
	if _, err := podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, n any) { enqueue(n) }, DeleteFunc: enqueue}); err != nil {
		return err
	}
	sync := func(ctx context.Context, node string) error {
		objs, err := podInf.GetIndexer().ByIndex(byNode, node)
		if err != nil {
			return err
		}
		var uids []string
		for _, o := range objs {
			p := o.(*corev1.Pod)
			if p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
				uids = append(uids, p.Annotations[annotationSimComputeDomainUID])
			}
		}
		sort.Strings(uids)
		var want *string // nil: no label
		if len(uids) > 0 {
			want = &uids[0] // the driver allows one ComputeDomain per node
		}
		n, err := c.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if cur, ok := n.Labels[LabelComputeDomain]; (want == nil && !ok) || (want != nil && ok && cur == *want) {
			return nil
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]*string{LabelComputeDomain: want}}})
		if err != nil {
			return err
		}
		_, err = c.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	}
	go podInf.RunWithContext(ctx)
	runNodeLoop(ctx, queue, []cache.InformerSynced{podInf.HasSynced}, sync, func(node string, err error) {
		c.logf("simulated ComputeDomain label of %s: %v", node, err)
	}, 1)
	return nil
}
