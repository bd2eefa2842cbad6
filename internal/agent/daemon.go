package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/gpufault"
)

// The agent's permissions are its own ClusterRole, config/agent/rbac.yaml
// (and the chart's agent.yaml): no +kubebuilder:rbac markers here, so the
// operator's generated role does not carry what only the agent does
// (patching node status, creating GPUFault records). The local cluster,
// which runs the simulated agents inside the operator's process, binds that
// role to the operator's test identity too (devcluster.OperatorConfig).

// Options configure the agent.
type Options struct {
	// NodeName is the agent's node: it runs the actions of this node's
	// NodeRepairs only, and watches this node's objects only. Empty:
	// every node (the simulation, InProcess).
	NodeName string
	// Namespace is the operator's, where the NodeMaintenance objects that
	// hold the node for a reboot or a GPU reset are ("": any namespace).
	Namespace string
	// Executor runs the actions on the host.
	Executor Executor
	// GPUs, if set, shows the node's GPUs: the agent runs the GPU monitor
	// (GPUFault records, the GPUProblem condition). A source with a
	// Start(ctx) method is started with the agent; one with an Events
	// channel makes the monitor look again when it fires.
	GPUs GPUSource
	// Clock defaults to the real clock.
	Clock clock.PassiveClock
	// Logger is the agent's logger (zero: controller-runtime's global
	// logger, which cli.SetupLogging sets).
	Logger logr.Logger
	// Workers is how many NodeRepairs, and how many nodes' GPUs, the agent
	// handles at once (default 1; InProcess: 4).
	Workers int
}

// eventSource is a GPUSource that learns of news by itself.
type eventSource interface {
	Events() <-chan struct{}
}

// startable is a GPUSource that runs beside the agent until ctx ends.
type startable interface {
	Start(ctx context.Context) error
}

// Daemon is the node agent at work: watch caches of its node, its node's
// NodeRepairs and GPUFault records and the repair policies (without
// managed fields: it runs on every node and must stay small), and two
// work queues — NodeRepair names for Agent (the pending actions), node
// names for GPUMonitor — fed by the watches and by the GPU source.
//
// It is built on client-go alone (REST clients with the agent's own
// scheme, informers, work queues), not on controller-runtime's manager:
// controller-runtime links client-go's whole clientset and initialises
// every API group, which more than doubled the agent's memory on each
// node (BenchmarkAgentMemory in test/chaos).
type Daemon struct {
	opts     Options
	api      *kubeAPI
	informer struct {
		nodes, repairs, faults, policies cache.SharedIndexInformer
		// slices: nil when the API server serves no DRA.
		slices cache.SharedIndexInformer
	}
	actions workqueue.TypedRateLimitingInterface[string]
	gpus    workqueue.TypedRateLimitingInterface[string]
	agent   *Agent
	monitor *GPUMonitor
}

// New builds the agent of opts.NodeName (every node if empty) against cfg.
// Start runs it.
func New(cfg *rest.Config, opts Options) (*Daemon, error) {
	if opts.Executor == nil {
		return nil, errors.New("agent: no executor")
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = crlog.Log
	}
	opts.Workers = max(opts.Workers, 1)
	scheme, err := newScheme()
	if err != nil {
		return nil, err
	}
	codecs := serializer.NewCodecFactory(scheme).WithoutConversion()
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("agent: HTTP client: %w", err)
	}
	restFor := func(gv schema.GroupVersion, apiPath string) (rest.Interface, error) {
		c := rest.CopyConfig(cfg)
		c.GroupVersion, c.APIPath, c.NegotiatedSerializer = &gv, apiPath, codecs
		if c.UserAgent == "" {
			c.UserAgent = "gpufleet-agent"
		}
		return rest.RESTClientForConfigAndClient(c, httpClient)
	}
	d := &Daemon{opts: opts, api: &kubeAPI{}}
	if d.api.core, err = restFor(corev1.SchemeGroupVersion, "/api"); err != nil {
		return nil, err
	}
	if d.api.repair, err = restFor(repairv1.GroupVersion, "/apis"); err != nil {
		return nil, err
	}
	if d.api.maintenance, err = restFor(maintenancev1.GroupVersion, "/apis"); err != nil {
		return nil, err
	}
	// The agent's node and its node's repair objects only (the CRDs make
	// spec.nodeName selectable); every node for the simulation.
	var byName, byNode fields.Selector
	if opts.NodeName != "" {
		byName = fields.OneTermEqualSelector("metadata.name", opts.NodeName)
		byNode = fields.OneTermEqualSelector("spec.nodeName", opts.NodeName)
	}
	d.informer.nodes = newInformer(d.api.core, "nodes", &corev1.Node{}, byName)
	d.informer.repairs = newInformer(d.api.repair, "noderepairs", &repairv1.NodeRepair{}, byNode)
	d.informer.faults = newInformer(d.api.repair, "gpufaults", &repairv1.GPUFault{}, byNode)
	if err := d.informer.faults.AddIndexers(cache.Indexers{indexNode: nodeIndexer}); err != nil {
		return nil, err
	}
	d.informer.policies = newInformer(d.api.repair, "noderepairpolicies", &repairv1.NodeRepairPolicy{}, nil)
	d.api.nodes, d.api.repairs = d.informer.nodes.GetStore(), d.informer.repairs.GetStore()
	d.api.faults, d.api.policies = d.informer.faults.GetStore(), d.informer.policies.GetStore()
	if opts.GPUs != nil {
		// The DRA driver's device taints are a GPU source too.
		resource, err := restFor(resourcev1.SchemeGroupVersion, "/apis")
		if err != nil {
			return nil, err
		}
		served, err := groupVersionServed(d.api.core, resourcev1.SchemeGroupVersion)
		if err != nil {
			return nil, err
		}
		if served {
			d.informer.slices = newInformer(resource, "resourceslices", &resourcev1.ResourceSlice{}, byNode)
			if err := d.informer.slices.AddIndexers(cache.Indexers{indexNode: nodeIndexer}); err != nil {
				return nil, err
			}
			d.api.slices = d.informer.slices.GetStore()
		} else {
			opts.Logger.Info("the API server serves no DRA (resource.k8s.io/v1): device taints are not read")
		}
	}

	d.agent = &Agent{Client: d.api, NodeName: opts.NodeName, Namespace: opts.Namespace, Executor: opts.Executor, Clock: opts.Clock}
	d.actions = newQueue("repair-agent")
	if err := d.watchRepairs(); err != nil {
		return nil, err
	}
	if opts.GPUs != nil {
		d.monitor = &GPUMonitor{Client: d.api, Source: opts.GPUs, Clock: opts.Clock, NodeName: opts.NodeName}
		d.gpus = newQueue("gpu-monitor")
		if err := d.watchGPUs(); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// InProcess is the agent of every node for simulated clusters (the dev
// command and the tests), where no agent DaemonSet runs: it runs the
// pending actions of all NodeRepairs with exec and, when exec is also a
// GPUSource (the simulated host is), the GPU monitor of every node. Add it
// to the operator's manager (it is a Runnable). clk nil = the real clock.
func InProcess(cfg *rest.Config, exec Executor, clk clock.PassiveClock) (*Daemon, error) {
	opts := Options{Executor: exec, Clock: clk, Workers: 4}
	if src, ok := exec.(GPUSource); ok {
		opts.GPUs = src
	}
	return New(cfg, opts)
}

func newInformer(c rest.Interface, resource string, obj runtime.Object, field fields.Selector) cache.SharedIndexInformer {
	lw := cache.NewFilteredListWatchFromClient(c, resource, metav1.NamespaceAll, func(o *metav1.ListOptions) {
		if field != nil {
			o.FieldSelector = field.String()
		}
	})
	inf := cache.NewSharedIndexInformer(lw, obj, 0, cache.Indexers{})
	_ = inf.SetTransform(func(o any) (any, error) { // only fails once started
		if m, ok := o.(metav1.Object); ok {
			m.SetManagedFields(nil)
		}
		return o, nil
	})
	return inf
}

// groupVersionServed asks the API server whether it serves gv (a 404 says
// it does not; another error is returned).
func groupVersionServed(core rest.Interface, gv schema.GroupVersion) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := core.Get().AbsPath("/apis", gv.Group, gv.Version).Do(ctx).Error()
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	default:
		return false, fmt.Errorf("agent: asking whether the API server serves %s: %w", gv, err)
	}
}

func newQueue(name string) workqueue.TypedRateLimitingInterface[string] {
	return workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: name})
}

// handler calls add for created and deleted objects of type T, and
// changed for updates (nil: every update). Deleted objects whose last
// state is unknown are passed as their last known state.
func handler[T any](add func(*T), changed func(o, n *T) bool) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			if t, ok := o.(*T); ok {
				add(t)
			}
		},
		UpdateFunc: func(o, n any) {
			ot, ok1 := o.(*T)
			nt, ok2 := n.(*T)
			if ok1 && ok2 && (changed == nil || changed(ot, nt)) {
				add(nt)
			}
		},
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if t, ok := o.(*T); ok {
				add(t)
			}
		},
	}
}

// watchRepairs queues the NodeRepairs of the agent's node(s) that wait for
// an action.
func (d *Daemon) watchRepairs() error {
	_, err := d.informer.repairs.AddEventHandler(handler(func(nr *repairv1.NodeRepair) {
		if (d.opts.NodeName == "" || nr.Spec.NodeName == d.opts.NodeName) && nr.Status.Pending != nil {
			d.actions.Add(nr.Name)
		}
	}, nil))
	return err
}

// watchGPUs queues a node for the GPU monitor when the node changed in a
// way the monitor must see (gpuNodeChanged), when one of its GPUFault
// records changed (gpuFaultChanged), when a policy's XID classes changed
// (the agent's node, or every node), and when the GPU source says so.
func (d *Daemon) watchGPUs() error {
	mine := func(node string) bool { return d.opts.NodeName == "" || node == d.opts.NodeName }
	if _, err := d.informer.nodes.AddEventHandler(handler(func(n *corev1.Node) {
		if mine(n.Name) {
			d.gpus.Add(n.Name)
		}
	}, gpuNodeChanged)); err != nil {
		return err
	}
	if _, err := d.informer.faults.AddEventHandler(handler(func(f *repairv1.GPUFault) {
		if mine(f.Spec.NodeName) {
			d.gpus.Add(f.Spec.NodeName)
		}
	}, gpuFaultChanged)); err != nil {
		return err
	}
	if d.informer.slices != nil {
		if _, err := d.informer.slices.AddEventHandler(handler(func(s *resourcev1.ResourceSlice) {
			if s.Spec.NodeName != nil && mine(*s.Spec.NodeName) {
				d.gpus.Add(*s.Spec.NodeName)
			}
		}, gpufault.DeviceTaintsChanged)); err != nil {
			return err
		}
	}
	_, err := d.informer.policies.AddEventHandler(handler(func(*repairv1.NodeRepairPolicy) {
		if d.opts.NodeName != "" {
			d.gpus.Add(d.opts.NodeName)
			return
		}
		for _, name := range d.informer.nodes.GetStore().ListKeys() {
			d.gpus.Add(name)
		}
	}, xidClassesChanged))
	return err
}

// Start runs the agent until ctx ends: the watches, the GPU source, and
// the workers once the watch caches are filled. It returns when the
// workers have finished (at most 30 s after ctx ended: an action in
// progress, such as a reboot, may not return).
func (d *Daemon) Start(ctx context.Context) error {
	log := d.opts.Logger.WithName("agent")
	if d.opts.NodeName != "" {
		log = log.WithValues("node", d.opts.NodeName)
	}
	ctx = crlog.IntoContext(ctx, log)
	var bg sync.WaitGroup
	defer bg.Wait()
	synced := []cache.InformerSynced{d.informer.nodes.HasSynced, d.informer.repairs.HasSynced, d.informer.faults.HasSynced, d.informer.policies.HasSynced}
	for _, inf := range []cache.SharedIndexInformer{d.informer.nodes, d.informer.repairs, d.informer.faults, d.informer.policies, d.informer.slices} {
		if inf != nil {
			bg.Go(func() { inf.RunWithContext(ctx) })
		}
	}
	if d.informer.slices != nil {
		synced = append(synced, d.informer.slices.HasSynced)
	}
	defer d.actions.ShutDown()
	if d.gpus != nil {
		defer d.gpus.ShutDown()
		if s, ok := d.opts.GPUs.(startable); ok {
			bg.Go(func() {
				if err := s.Start(ctx); err != nil {
					log.Error(err, "GPU source stopped")
				}
			})
		}
		if es, ok := d.opts.GPUs.(eventSource); ok && d.opts.NodeName != "" {
			bg.Go(func() {
				for {
					select {
					case <-ctx.Done():
						return
					case <-es.Events():
						d.gpus.Add(d.opts.NodeName)
					}
				}
			})
		}
	}
	if !cache.WaitForNamedCacheSyncWithContext(ctx, synced...) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("agent: the watch caches did not fill")
	}
	log.Info("agent started", "workers", d.opts.Workers, "gpuMonitor", d.monitor != nil)
	var workers sync.WaitGroup
	for range d.opts.Workers {
		workers.Go(func() {
			work(ctx, d.actions, log.WithValues("controller", "repair-agent"), "NodeRepair", func(ctx context.Context, name string) (time.Duration, error) {
				return 0, d.agent.Reconcile(ctx, name)
			})
		})
		if d.gpus != nil {
			workers.Go(func() { work(ctx, d.gpus, log.WithValues("controller", "gpu-monitor"), "Node", d.monitor.Reconcile) })
		}
	}
	<-ctx.Done()
	d.actions.ShutDown()
	if d.gpus != nil {
		d.gpus.ShutDown()
	}
	done := make(chan struct{})
	go func() { workers.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		log.Info("stopping without waiting any longer for the work in progress")
	}
	return nil
}

// work takes keys from q until it shuts down: an error is retried with the
// queue's backoff (and logged), a requeue after is honoured, success
// forgets the key's failures.
func work(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], log logr.Logger, kind string,
	reconcile func(context.Context, string) (time.Duration, error)) {
	for {
		key, shutdown := q.Get()
		if shutdown {
			return
		}
		l := log.WithValues(kind, key)
		after, err := reconcile(crlog.IntoContext(ctx, l), key)
		switch {
		case err != nil:
			l.Error(err, "will retry")
			q.AddRateLimited(key)
		case after > 0:
			q.Forget(key)
			q.AddAfter(key, after)
		default:
			q.Forget(key)
		}
		q.Done(key)
	}
}
