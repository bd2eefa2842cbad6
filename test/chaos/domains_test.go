package chaos

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/operator"
)

var (
	domainsCount       = flag.Int("domains.count", 8, "NVLink domains (BenchmarkNVLinkDomainRollout)")
	domainsPerDomain   = flag.Int("domains.per-domain", 18, "nodes per NVLink domain")
	domainsMaxParallel = flag.Int("domains.max-parallel", 18, "MaintenanceOperatorConfig maxParallelOperations, both runs")
	domainsUpgrade     = flag.Float64("domains.upgrade-seconds", 2, "simulated driver upgrade: seconds from a NodeMaintenance seen Ready to its deletion")
	domainsInterleave  = flag.Bool("domains.interleave", true, "node names interleave the domains (gpu-000 in rack-0, gpu-001 in rack-1, …); "+
		"false: consecutive names share a domain, so the node-by-node order (creation time, then node name) already goes domain by domain")
	domainsHeld = flag.Bool("domains.held", false, "create every object while maxParallelOperations is 0 and raise it once the operator has written a wait reason on each "+
		"(requests queued before a maintenance window opens): the scheduler then sees all of them in its first pass; the rollout time counts from the raise")
	domainsMaxDisrupted = flag.String("domains.max-disrupted", "", "spec.domains.maxDisruptedDomains of the second run (an integer or a percentage; empty: unset)")
	domainsReport       = flag.String("domains.report", "", "directory for domains-<nodes>.{json,md} (default: results/ in the source tree)")
)

// domainsRequestor is the simulated driver-upgrade requestor.
const domainsRequestor = "driver-upgrade.example.com"

// domainRun is one rollout of BenchmarkNVLinkDomainRollout.
type domainRun struct {
	Name string `json:"name"`
	// Domains is the config's spec.domains (nil: node by node).
	Domains *maintenancev1.MaintenanceDomains `json:"domains,omitempty"`
	// RolloutSeconds: first NodeMaintenance created to the last one seen
	// deleted.
	RolloutSeconds float64 `json:"rolloutSeconds"`
	// DomainInterruptions: times a domain went from no node in
	// maintenance (a NodeMaintenance past Pending) to one, from this
	// benchmark's own watch; by domain too.
	DomainInterruptions         int            `json:"domainInterruptions"`
	DomainInterruptionsByDomain map[string]int `json:"domainInterruptionsByDomain"`
	// OperatorDomainInterruptions: the increase of the operator's
	// gpufleet_maintenance_domain_interruptions_total (counted only with
	// spec.domains).
	OperatorDomainInterruptions int `json:"operatorDomainInterruptions"`
	// DomainDisruptedSeconds: the time domains had a node in maintenance,
	// summed over the domains.
	DomainDisruptedSeconds float64 `json:"domainDisruptedSeconds"`
	// DomainWindows: per domain, when its first node went into
	// maintenance and its last came out, in seconds from the first object
	// created.
	DomainWindows map[string][2]float64 `json:"domainWindows"`
	// Jobs: one multi-node job (a ComputeDomain with a worker on each
	// node) per domain. An interruption is a worker evicted while the job
	// ran on all its nodes; the job restarts (its workers are created
	// again) once no node of its domain is in maintenance and the evicted
	// workers are gone.
	JobInterruptions      int            `json:"jobInterruptions"`
	JobInterruptionsByJob map[string]int `json:"jobInterruptionsByJob"`
	WorkerEvictions       int            `json:"workerEvictions"`
	JobRestarts           int            `json:"jobRestarts"`
	// JobDownSeconds: from a job's interruption to its restart, summed
	// over the jobs and interruptions.
	JobDownSeconds      float64            `json:"jobDownSeconds"`
	JobDownSecondsByJob map[string]float64 `json:"jobDownSecondsByJob"`
	// Limits seen by this watch and by the independent checker.
	MaxNodesInMaintenance int `json:"maxNodesInMaintenance"`
	MaxDisruptedDomains   int `json:"maxDisruptedDomains"`
	CheckerMaxInProgress  int `json:"checkerMaxInProgress"`
	// WaitReasonRewrites: changes of a Pending object's wait reason.
	WaitReasonRewrites int `json:"waitReasonRewrites"`
	Violations         int `json:"violations"`
	// Operator API requests during the rollout, and per maintenance.
	Requests          map[string]int `json:"requests"`
	RequestsPerObject float64        `json:"requestsPerMaintenance"`
}

type domainsReportData struct {
	Commit     string         `json:"commit"`
	Date       string         `json:"date"`
	Parameters map[string]any `json:"parameters"`
	// LoadAverage: the machine's 1/5/15-minute load when the report was written.
	LoadAverage string      `json:"loadAverage"`
	Runs        []domainRun `json:"runs"`
	// RolloutRatio: the rollout time with spec.domains over node by node.
	RolloutRatio float64 `json:"rolloutRatio"`
}

// BenchmarkNVLinkDomainRollout: a driver upgrade of every node of
// -domains.count NVLink domains of -domains.per-domain kwok nodes
// (labelled nvidia.com/gpu.clique=rack-N), each domain running a
// multi-node job (a simulated ComputeDomain with a worker on each of its
// nodes, which keeps NVIDIA's driver label on them). A simulated upgrade
// requestor, as NVIDIA's k8s-operator-libs in requestor mode, creates one
// NodeMaintenance per node, all at once, and deletes each
// -domains.upgrade-seconds after it is Ready; a job restarts once no node
// of its domain is in maintenance. The same rollout runs twice on the same
// cluster and the same operator process (the real binary): node by node
// (maxParallelOperations -domains.max-parallel, no spec.domains), then with
// spec.domains (nodeLabel nvidia.com/gpu.clique, coSchedule default) and
// the same maxParallelOperations (-domains.max-disrupted sets its
// maxDisruptedDomains). -domains.held creates the objects under
// maxParallelOperations 0 and raises it once the operator has seen them
// all. It reports domain and job interruptions, the jobs' time down,
// rollout time and requests per maintenance of each run in
// results/domains-<nodes>[-held][-max-disrupted-N].{json,md}; it fails on
// a broken limit (the chaos test's checker), a rollout or job restart that
// does not finish, and, with spec.domains and a domain that fits the node
// budget, a count of domain interruptions other than one per domain.
func BenchmarkNVLinkDomainRollout(b *testing.B) {
	ctx := context.Background()
	domains, per, mpo := *domainsCount, *domainsPerDomain, *domainsMaxParallel
	if domains < 1 || per < 1 || mpo < 1 {
		b.Fatalf("-domains.count, -domains.per-domain and -domains.max-parallel must be positive")
	}
	nodes := domains * per
	upgrade := time.Duration(*domainsUpgrade * float64(time.Second))
	specs := domainNodes(domains, per, *domainsInterleave)
	nodesOf := map[string][]string{}
	for _, s := range specs {
		d := s.Labels[devcluster.LabelGPUClique]
		nodesOf[d] = append(nodesOf[d], s.Name)
	}

	// Built first: the source tree may change while the scenario runs.
	bin := buildOperator(b)
	scheme, _ := operator.Scheme()
	env, err := devcluster.NewEnv(ctx, largeCluster, specs, ns, scheme)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(env.Stop)
	kubeconfig, err := env.OperatorKubeconfig(ctx)
	if err != nil {
		b.Fatal(err)
	}
	jobs := map[string]*domainJob{}
	for d, members := range nodesOf {
		j := &domainJob{name: "job-" + d, domain: d, nodes: members}
		jobs[j.name] = j
		if _, err := env.StartComputeDomain(ctx, workloadNamespace, j.name, j.nodes); err != nil {
			b.Fatal(err)
		}
	}
	waitJobsRunning(ctx, b, env, nodes)

	addr, err := freeAddr()
	if err != nil {
		b.Fatal(err)
	}
	op := &operatorProcess{bin: bin, kubeconfig: kubeconfig, dir: b.TempDir(), metricsAddr: addr}
	op.startWith(b, "maintenance")
	defer op.kill()
	waitOperatorSettled(b, op)
	runs := []domainRun{domainRollout(ctx, b, env, op, "node by node", nil, jobs, nodes, mpo, upgrade)}
	byDomain := &maintenancev1.MaintenanceDomains{NodeLabel: devcluster.LabelGPUClique}
	second := "with spec.domains"
	if *domainsMaxDisrupted != "" {
		byDomain.MaxDisruptedDomains = ptr.To(intstr.Parse(*domainsMaxDisrupted))
		second += " (maxDisruptedDomains " + *domainsMaxDisrupted + ")"
	}
	runs = append(runs, domainRollout(ctx, b, env, op, second, byDomain, jobs, nodes, mpo, upgrade))

	rep := domainsReportData{
		Commit: gitCommit(), Date: time.Now().UTC().Format(time.RFC3339), LoadAverage: loadAverage(),
		Parameters: map[string]any{"domains": domains, "nodesPerDomain": per, "nodes": nodes, "maxParallelOperations": mpo,
			"upgradeSeconds": upgrade.Seconds(), "interleaved": *domainsInterleave, "held": *domainsHeld, "maxDisruptedDomains": *domainsMaxDisrupted, "requestor": domainsRequestor,
			"drainSpec": "force, deleteEmptyDir, timeoutSeconds 0", "capabilities": "maintenance", "domainLabel": devcluster.LabelGPUClique},
		Runs: runs,
	}
	if runs[0].RolloutSeconds > 0 {
		rep.RolloutRatio = runs[1].RolloutSeconds / runs[0].RolloutSeconds
	}
	md := rep.markdown()
	b.Log("\n" + md)
	name := fmt.Sprintf("domains-%d", nodes)
	if !*domainsInterleave {
		name += "-consecutive"
	}
	if *domainsHeld {
		name += "-held"
	}
	if *domainsMaxDisrupted != "" {
		name += "-max-disrupted-" + strings.TrimSuffix(*domainsMaxDisrupted, "%")
	}
	b.Logf("report: %s.{json,md}", writeReport(b, reportDir(b, *domainsReport), name, rep, md))
	for i, r := range runs {
		suffix := []string{"-node-by-node", "-domains"}[i]
		b.ReportMetric(float64(r.DomainInterruptions), "domain-interruptions"+suffix)
		b.ReportMetric(float64(r.JobInterruptions), "job-interruptions"+suffix)
		b.ReportMetric(r.RolloutSeconds, "s-rollout"+suffix)
	}
	b.ReportMetric(rep.RolloutRatio, "rollout-ratio")

	// Co-scheduled, a domain that fits the node budget goes into
	// maintenance whole: once per rollout.
	if d := runs[1]; mpo >= per && d.DomainInterruptions != domains {
		b.Errorf("with spec.domains: %d domain interruptions, want %d (one per domain): %v", d.DomainInterruptions, domains, d.DomainInterruptionsByDomain)
	}
	if d := runs[1]; d.OperatorDomainInterruptions != d.DomainInterruptions {
		// Reported, not failed: the operator counts from its cache when it
		// schedules, the watch when it sees the status.
		b.Logf("with spec.domains: the operator counted %d domain interruptions, the watch %d", d.OperatorDomainInterruptions, d.DomainInterruptions)
	}
}

// domainNodes returns domains×per GPU nodes gpu-000 … in one pool,
// labelled into the domains by devcluster.InDomains: with interleave node
// gpu-i is in domain i mod domains, else consecutive nodes share one.
func domainNodes(domains, per int, interleave bool) []devcluster.NodeSpec {
	specs := devcluster.GPUNodes(domains*per, 1)
	if !interleave {
		devcluster.InDomains(specs, domains)
		return specs
	}
	// InDomains puts consecutive specs together: order them so that the
	// k-th node of domain d is gpu-(k·domains+d).
	byDomain := make([]devcluster.NodeSpec, 0, len(specs))
	for d := range domains {
		for k := range per {
			byDomain = append(byDomain, specs[k*domains+d])
		}
	}
	devcluster.InDomains(byDomain, domains)
	return byDomain
}

// domainJob is the multi-node job of one domain.
type domainJob struct {
	name, domain string
	nodes        []string
	// Guarded by the domainWatch's mu.
	interrupted   bool
	downSince     time.Time
	evicted       map[types.UID]bool
	terminating   map[string]bool // worker pods deleted, not yet gone
	interruptions int
	evictions     int
	restarts      int
	down          time.Duration
}

// domainWatch follows the NodeMaintenance objects, the nodes' domain
// labels and the jobs' workers with its own informers (no operator
// code), counts domain and job interruptions, and restarts interrupted
// jobs.
type domainWatch struct {
	mu       sync.Mutex
	domainOf map[string]string          // node -> domain
	inMaint  map[string]map[string]bool // node -> objects in maintenance on it
	perDom   map[string]int             // domain -> nodes in maintenance
	since    map[string]time.Time       // domain -> disrupted since
	firstIn  map[string]time.Time       // domain -> first node in maintenance
	lastOut  map[string]time.Time       // domain -> last node out of maintenance
	disrupt  time.Duration
	interr   map[string]int
	maxNodes int
	maxDoms  int
	lastGone time.Time
	jobs     map[string]*domainJob
	errs     []string
}

func newDomainWatch(jobs map[string]*domainJob) *domainWatch {
	for _, j := range jobs {
		j.interrupted, j.evicted, j.terminating = false, map[types.UID]bool{}, map[string]bool{}
		j.interruptions, j.evictions, j.restarts, j.down = 0, 0, 0, 0
	}
	return &domainWatch{domainOf: map[string]string{}, inMaint: map[string]map[string]bool{}, perDom: map[string]int{},
		since: map[string]time.Time{}, firstIn: map[string]time.Time{}, lastOut: map[string]time.Time{}, interr: map[string]int{}, jobs: jobs}
}

// run starts the informers and returns once they are synced.
func (w *domainWatch) run(ctx context.Context, b *testing.B, env *devcluster.Env) {
	inf := informers.NewSharedInformerFactory(env.Client, 0)
	nodeInf := inf.Core().V1().Nodes().Informer()
	_, _ = nodeInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.onNode(o.(*corev1.Node)) },
		UpdateFunc: func(_, o any) { w.onNode(o.(*corev1.Node)) },
	})
	podInf := informers.NewSharedInformerFactoryWithOptions(env.Client, 0, informers.WithNamespace(workloadNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = devcluster.LabelSimComputeDomain })).Core().V1().Pods().Informer()
	_, _ = podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.onWorker(o.(*corev1.Pod), false) },
		UpdateFunc: func(_, o any) { w.onWorker(o.(*corev1.Pod), false) },
		DeleteFunc: func(o any) {
			if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			if p, ok := o.(*corev1.Pod); ok {
				w.onWorker(p, true)
			}
		},
	})
	dInf := dynamicinformer.NewDynamicSharedInformerFactory(dynamic.NewForConfigOrDie(env.Config), 0)
	nmInf := dInf.ForResource(nmGVR).Informer()
	_, _ = nmInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.onNM(o, false) },
		UpdateFunc: func(_, o any) { w.onNM(o, false) },
		DeleteFunc: func(o any) { w.onNM(o, true) },
	})
	go nodeInf.RunWithContext(ctx)
	go podInf.RunWithContext(ctx)
	go nmInf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), nodeInf.HasSynced, podInf.HasSynced, nmInf.HasSynced) {
		b.Fatal("the domain watch's caches never synced")
	}
}

func (w *domainWatch) onNode(n *corev1.Node) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if d := n.Labels[devcluster.LabelGPUClique]; d != "" {
		w.domainOf[n.Name] = d
	}
}

func (w *domainWatch) onNM(o any, gone bool) {
	u, ok := o.(*unstructured.Unstructured)
	if t, isTomb := o.(cache.DeletedFinalStateUnknown); isTomb {
		u, ok = t.Obj.(*unstructured.Unstructured)
	}
	if !ok {
		return
	}
	key := u.GetNamespace() + "/" + u.GetName()
	node, _, _ := unstructured.NestedString(u.Object, "spec", "nodeName")
	reason := readyReason(u)
	inMaint := !gone && reason != "" && reason != "Pending"
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if gone {
		w.lastGone = now
	}
	keys := w.inMaint[node]
	if inMaint == keys[key] {
		return
	}
	d, wasIn := w.domainOf[node], len(keys) > 0
	if inMaint {
		if keys == nil {
			keys = map[string]bool{}
			w.inMaint[node] = keys
		}
		keys[key] = true
	} else {
		delete(keys, key)
	}
	isIn := len(keys) > 0
	if d != "" && isIn != wasIn {
		if isIn {
			if w.perDom[d] == 0 {
				w.interr[d]++
				w.since[d] = now
			}
			if _, ok := w.firstIn[d]; !ok {
				w.firstIn[d] = now
			}
			w.perDom[d]++
		} else {
			w.perDom[d]--
			if w.perDom[d] == 0 {
				w.disrupt += now.Sub(w.since[d])
				w.lastOut[d] = now
			}
		}
	}
	n, doms := 0, 0
	for _, k := range w.inMaint {
		if len(k) > 0 {
			n++
		}
	}
	for _, c := range w.perDom {
		if c > 0 {
			doms++
		}
	}
	w.maxNodes, w.maxDoms = max(w.maxNodes, n), max(w.maxDoms, doms)
}

// onWorker: a worker deleted (only drains delete them) is an eviction;
// the first while its job runs interrupts the job.
func (w *domainWatch) onWorker(p *corev1.Pod, gone bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	j := w.jobs[p.Labels[devcluster.LabelSimComputeDomain]]
	if j == nil || (!gone && p.DeletionTimestamp == nil) {
		return
	}
	if gone {
		delete(j.terminating, p.Name)
	} else {
		j.terminating[p.Name] = true
	}
	if j.evicted[p.UID] {
		return
	}
	j.evicted[p.UID] = true
	j.evictions++
	if !j.interrupted {
		j.interrupted, j.downSince = true, time.Now()
		j.interruptions++
	}
}

// restartJobs restarts, every 200 ms until ctx ends, each interrupted job
// whose domain has no node in maintenance and whose evicted workers are
// gone (their names are reused).
func (w *domainWatch) restartJobs(ctx context.Context, env *devcluster.Env) {
	for ctx.Err() == nil {
		w.mu.Lock()
		var ready []*domainJob
		for _, j := range w.jobs {
			if j.interrupted && w.perDom[j.domain] == 0 && len(j.terminating) == 0 {
				ready = append(ready, j)
			}
		}
		w.mu.Unlock()
		for _, j := range ready {
			if _, err := env.StartComputeDomain(ctx, workloadNamespace, j.name, j.nodes); err != nil {
				if ctx.Err() == nil {
					w.mu.Lock()
					w.errs = append(w.errs, fmt.Sprintf("restarting %s: %v", j.name, err))
					w.mu.Unlock()
				}
				continue
			}
			w.mu.Lock()
			j.interrupted = false
			j.restarts++
			j.down += time.Since(j.downSince)
			w.mu.Unlock()
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// setDomainConfig creates or updates the MaintenanceOperatorConfig.
func setDomainConfig(ctx context.Context, b *testing.B, env *devcluster.Env, maxParallel int, domains *maintenancev1.MaintenanceDomains) {
	cfg := &maintenancev1.MaintenanceOperatorConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: maintenancev1.DefaultConfigName}}
	err := env.Kube.Get(ctx, client.ObjectKeyFromObject(cfg), cfg)
	if client.IgnoreNotFound(err) != nil {
		b.Fatal(err)
	}
	cfg.Spec.MaxParallelOperations, cfg.Spec.Domains = ptr.To(intstr.FromInt32(int32(maxParallel))), domains
	if err != nil {
		err = env.Kube.Create(ctx, cfg)
	} else {
		err = env.Kube.Update(ctx, cfg)
	}
	if err != nil {
		b.Fatal(err)
	}
}

// domainRollout runs one rollout under maxParallelOperations mpo and
// domains: the requestor's objects for every node at once (with
// -domains.held under maxParallelOperations 0, then raised), each deleted
// upgrade after it is Ready; it returns when every object is gone and
// every job runs again.
func domainRollout(ctx context.Context, b *testing.B, env *devcluster.Env, op *operatorProcess, name string, domains *maintenancev1.MaintenanceDomains,
	jobs map[string]*domainJob, nodes, mpo int, upgrade time.Duration) domainRun {
	setDomainConfig(ctx, b, env, map[bool]int{true: 0, false: mpo}[*domainsHeld], domains)
	waitOperatorSettled(b, op)
	addr := op.metricsAddr
	watchCtx, stopWatch := context.WithCancel(ctx)
	w := newDomainWatch(jobs)
	w.run(watchCtx, b, env)
	var restarter sync.WaitGroup
	restarter.Go(func() { w.restartJobs(watchCtx, env) })
	defer restarter.Wait()
	defer stopWatch()

	chk := newChecker(env.Cluster, env.Kube, "", mpo, nodes)
	var upgrades sync.WaitGroup
	chk.onReady = func(key string) {
		upgrades.Add(1)
		time.AfterFunc(upgrade, func() {
			defer upgrades.Done()
			namespace, objName, _ := strings.Cut(key, "/")
			nm := &maintenancev1.NodeMaintenance{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: objName}}
			if err := env.Kube.Delete(ctx, nm); client.IgnoreNotFound(err) != nil {
				b.Errorf("requestor deleting %s: %v", key, err)
			}
		})
	}
	checkCtx, stopChecker := context.WithCancel(ctx)
	defer stopChecker()
	go chk.run(checkCtx)

	fams, err := scrape(addr)
	if err != nil {
		b.Fatal(err)
	}
	before, opBefore := apiRequests(fams), counterValue(fams, "gpufleet_maintenance_domain_interruptions_total")
	// The requestor lists the nodes (by name) and asks for maintenance of
	// each, as NVIDIA's upgrade requestor does with the nodes that need
	// the new driver.
	nodeList, err := env.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	began := time.Now()
	for _, n := range nodeList.Items {
		nm := &maintenancev1.NodeMaintenance{
			ObjectMeta: metav1.ObjectMeta{Namespace: workloadNamespace, Name: "upgrade-" + n.Name},
			Spec: maintenancev1.NodeMaintenanceSpec{RequestorID: domainsRequestor, NodeName: n.Name, Cordon: ptr.To(true),
				DrainSpec: &maintenancev1.DrainSpec{Force: true, DeleteEmptyDir: true, TimeoutSeconds: ptr.To[int32](0)}},
		}
		if err := env.Kube.Create(ctx, nm); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("%s: %d NodeMaintenance objects created in %s", name, len(nodeList.Items), time.Since(began).Round(time.Millisecond))
	if *domainsHeld {
		// Every object is Pending with a wait reason: the operator has
		// seen them all.
		err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, false, func(context.Context) (bool, error) {
			chk.mu.Lock()
			defer chk.mu.Unlock()
			waiting := 0
			for _, st := range chk.nms {
				if !st.inProgress && st.message != "" {
					waiting++
				}
			}
			return waiting == nodes, nil
		})
		if err != nil {
			b.Fatalf("%s: the operator did not write a wait reason on every held object within 2m", name)
		}
		began = time.Now()
		setDomainConfig(ctx, b, env, mpo, domains)
		b.Logf("%s: maxParallelOperations raised from 0 to %d", name, mpo)
	}
	bound := 5*time.Minute + time.Duration(nodes)*(upgrade+2*time.Second)
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, bound, false, func(context.Context) (bool, error) {
		chk.mu.Lock()
		defer chk.mu.Unlock()
		return len(chk.readySeen) == nodes && len(chk.nms) == 0, nil
	})
	if err != nil {
		b.Fatalf("%s: rollout not done within %s: %d/%d objects Ready once", name, bound, chk.readyCount(), nodes)
	}
	upgrades.Wait()
	w.mu.Lock()
	end := w.lastGone
	w.mu.Unlock()
	if end.Before(began) {
		end = time.Now()
	}
	fams, err = scrape(addr)
	if err != nil {
		b.Fatal(err)
	}
	run := domainRun{Name: name, Domains: domains, RolloutSeconds: end.Sub(began).Seconds(),
		Requests:                    diffCounts(before, apiRequests(fams)),
		OperatorDomainInterruptions: int(counterValue(fams, "gpufleet_maintenance_domain_interruptions_total") - opBefore)}
	run.RequestsPerObject = float64(sum(run.Requests)) / float64(nodes)

	// Every job runs again before the figures are taken (and before the
	// next rollout).
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, j := range w.jobs {
			if j.interrupted {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		b.Fatalf("%s: jobs not restarted within 3m after the rollout", name)
	}
	stopWatch()
	restarter.Wait()
	waitJobsRunning(ctx, b, env, nodes)
	stopChecker()
	chk.final(ctx, b, nodes)

	w.mu.Lock()
	run.DomainInterruptionsByDomain, run.JobInterruptionsByJob = w.interr, map[string]int{}
	for _, c := range w.interr {
		run.DomainInterruptions += c
	}
	run.DomainDisruptedSeconds = w.disrupt.Seconds()
	run.DomainWindows, run.JobDownSecondsByJob = map[string][2]float64{}, map[string]float64{}
	for d, in := range w.firstIn {
		run.DomainWindows[d] = [2]float64{in.Sub(began).Seconds(), w.lastOut[d].Sub(began).Seconds()}
	}
	run.MaxNodesInMaintenance, run.MaxDisruptedDomains = w.maxNodes, w.maxDoms
	for _, j := range w.jobs {
		run.JobInterruptionsByJob[j.name] = j.interruptions
		run.JobInterruptions += j.interruptions
		run.WorkerEvictions += j.evictions
		run.JobRestarts += j.restarts
		run.JobDownSeconds += j.down.Seconds()
		run.JobDownSecondsByJob[j.name] = j.down.Seconds()
	}
	for _, e := range w.errs {
		b.Error(e)
	}
	w.mu.Unlock()
	run.CheckerMaxInProgress = chk.maxInProgress
	chk.mu.Lock()
	run.WaitReasonRewrites = chk.waitRewrites
	chk.mu.Unlock()
	run.Violations = len(chk.violations())
	for _, v := range chk.violations() {
		b.Errorf("%s: %s", name, v)
	}
	if run.MaxNodesInMaintenance > mpo {
		b.Errorf("%s: %d nodes in maintenance at once, limit %d", name, run.MaxNodesInMaintenance, mpo)
	}
	b.Logf("%s: %.1f s, %d domain interruptions (operator: %d), %d job interruptions, %d worker evictions, max %d nodes in maintenance",
		name, run.RolloutSeconds, run.DomainInterruptions, run.OperatorDomainInterruptions, run.JobInterruptions, run.WorkerEvictions, run.MaxNodesInMaintenance)
	return run
}

// waitJobsRunning waits until every node runs a live worker and carries
// the driver's ComputeDomain label.
func waitJobsRunning(ctx context.Context, b *testing.B, env *devcluster.Env, nodes int) {
	var running, labelled int
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := env.Client.CoreV1().Pods(workloadNamespace).List(ctx, metav1.ListOptions{LabelSelector: devcluster.LabelSimComputeDomain})
		if err != nil {
			return false, nil //nolint:nilerr // retried
		}
		running = 0
		if len(pods.Items) != nodes { // an evicted worker not yet gone
			return false, nil
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		list, err := env.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: devcluster.LabelComputeDomain})
		if err != nil {
			return false, nil //nolint:nilerr // retried
		}
		labelled = len(list.Items)
		return running == nodes && labelled == nodes, nil
	})
	if err != nil {
		b.Fatalf("jobs not running: %d/%d workers running, %d/%d nodes labelled %s", running, nodes, labelled, nodes, devcluster.LabelComputeDomain)
	}
}

// counterValue sums a counter family's series.
func counterValue(fams map[string]*dto.MetricFamily, name string) float64 {
	v := 0.0
	if f := fams[name]; f != nil {
		for _, m := range f.GetMetric() {
			v += m.GetCounter().GetValue()
		}
	}
	return v
}

func (r domainsReportData) markdown() string {
	var s strings.Builder
	p := r.Parameters
	layout := "node names interleave the domains (gpu-000 in rack-0, gpu-001 in rack-1, …)"
	if p["interleaved"] == false {
		layout = "consecutive node names share a domain"
	}
	created, from := "created at once", "first object created"
	if p["held"] == true {
		created = "created at once while maxParallelOperations was 0, which was raised once the operator had written a wait reason on each (requests queued before a window opens)"
		from = "maxParallelOperations raised"
	}
	fmt.Fprintf(&s, "# gpufleet NVLink domain rollout (%s, %s)\n\n", r.Commit, r.Date)
	fmt.Fprintf(&s, "Parameters: %v domains × %v kwok nodes (%s=rack-N; %s), one multi-node job per domain (a ComputeDomain with a worker on each node), "+
		"a driver upgrade of every node: one NodeMaintenance per node, %s (cordon; drain %v), each deleted %v s after it is Ready; "+
		"a job restarts once no node of its domain is in maintenance. maxParallelOperations %v in both runs; the operator is the real binary in its own process "+
		"(capabilities %v), the same process and cluster for both runs. Load average at the end: %s.\n\n",
		p["domains"], p["nodesPerDomain"], p["domainLabel"], layout, created, p["drainSpec"], p["upgradeSeconds"], p["maxParallelOperations"], p["capabilities"], r.LoadAverage)
	fmt.Fprintf(&s, "| figure |")
	for _, run := range r.Runs {
		fmt.Fprintf(&s, " %s |", run.Name)
	}
	fmt.Fprintf(&s, "\n|---|%s\n", strings.Repeat("---|", len(r.Runs)))
	row := func(name string, f func(domainRun) string) {
		fmt.Fprintf(&s, "| %s |", name)
		for _, run := range r.Runs {
			fmt.Fprintf(&s, " %s |", f(run))
		}
		fmt.Fprintf(&s, "\n")
	}
	row("domain interruptions (watch; fewest–most per domain)", func(d domainRun) string {
		vals := slices.Collect(maps.Values(d.DomainInterruptionsByDomain))
		if len(vals) == 0 {
			return "0"
		}
		return fmt.Sprintf("%d (%d–%d)", d.DomainInterruptions, slices.Min(vals), slices.Max(vals))
	})
	row("gpufleet_maintenance_domain_interruptions_total increase", func(d domainRun) string {
		if d.Domains == nil {
			return fmt.Sprintf("%d (counted only with spec.domains)", d.OperatorDomainInterruptions)
		}
		return fmt.Sprint(d.OperatorDomainInterruptions)
	})
	row("job interruptions / worker evictions / job restarts", func(d domainRun) string {
		return fmt.Sprintf("%d / %d / %d", d.JobInterruptions, d.WorkerEvictions, d.JobRestarts)
	})
	row("job time down, summed over the jobs", func(d domainRun) string { return fmt.Sprintf("%.1f s", d.JobDownSeconds) })
	row("domain time disrupted, summed over the domains", func(d domainRun) string { return fmt.Sprintf("%.1f s", d.DomainDisruptedSeconds) })
	row("rollout: "+from+" to last object deleted", func(d domainRun) string { return fmt.Sprintf("%.1f s", d.RolloutSeconds) })
	row(fmt.Sprintf("max nodes in maintenance (limit %v; watch / checker)", p["maxParallelOperations"]), func(d domainRun) string {
		return fmt.Sprintf("%d / %d", d.MaxNodesInMaintenance, d.CheckerMaxInProgress)
	})
	row("max domains disrupted at once", func(d domainRun) string { return fmt.Sprint(d.MaxDisruptedDomains) })
	row("checker violations", func(d domainRun) string { return fmt.Sprint(d.Violations) })
	row("operator requests / per maintenance", func(d domainRun) string {
		return fmt.Sprintf("%d / %.1f", sum(d.Requests), d.RequestsPerObject)
	})
	row("changes of a Pending object's wait reason", func(d domainRun) string { return fmt.Sprint(d.WaitReasonRewrites) })
	fmt.Fprintf(&s, "\nRollout time with spec.domains / node by node: %.2f.\n", r.RolloutRatio)
	for _, run := range r.Runs {
		fmt.Fprintf(&s, "\n%s, each domain in maintenance (first node in – last node out, s from %s; job down):", run.Name, from)
		for _, d := range slices.Sorted(maps.Keys(run.DomainWindows)) {
			win := run.DomainWindows[d]
			fmt.Fprintf(&s, " %s %.1f–%.1f (%.1f s);", d, win[0], win[1], run.JobDownSecondsByJob["job-"+d])
		}
		fmt.Fprintf(&s, "\n")
	}
	for _, run := range r.Runs {
		fmt.Fprintf(&s, "\n%s, requests: %s\n", run.Name, formatCounts(run.Requests))
	}
	return s.String()
}
