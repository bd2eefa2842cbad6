// Package chaos runs a NodeMaintenance rollout while the operator process is
// killed with SIGKILL at random moments and the API server is restarted,
// with an independent checker of the safety invariants. `make test` runs a
// short version; `make chaos` the full one.
package chaos

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/operator"
)

var (
	objects          = flag.Int("chaos.objects", 10, "NodeMaintenance objects (one per node)")
	kills            = flag.Int("chaos.kills", 5, "SIGKILLs of the operator during the rollout")
	minGap           = flag.Duration("chaos.min-gap", 2*time.Second, "shortest time between kills")
	maxGap           = flag.Duration("chaos.max-gap", 10*time.Second, "longest time between kills")
	restartAPIServer = flag.Bool("chaos.restart-apiserver", true, "restart kube-apiserver once mid-run")
	seed             = flag.Uint64("chaos.seed", 0, "random seed (0: from the clock; printed)")
)

const (
	ns          = "gpufleet-system"
	maxParallel = 3
	maxUnavail  = 4
	requestor   = "chaos.gpufleet.dev"
	bound       = 5 * time.Minute
	// workloadNamespace holds the simulated workloads; the checker watches
	// every pod eviction there.
	workloadNamespace = "default"
)

func TestRolloutSurvivesKills(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the local cluster (run without -short)")
	}
	ctx := context.Background()
	s := *seed
	if s == 0 {
		s = uint64(time.Now().UnixNano())
	}
	rng := rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15))
	t.Logf("chaos seed %d: %d objects, %d kills every %s–%s, apiserver restart %t", s, *objects, *kills, *minGap, *maxGap, *restartAPIServer)

	bin := buildOperator(t)
	cluster, err := devcluster.Start(ctx, devcluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Stop)
	nodes := *objects + 2
	if err := cluster.AddNodes(ctx, devcluster.GPUNodes(nodes, 3)...); err != nil {
		t.Fatal(err)
	}
	if err := devcluster.InstallCRDs(ctx, cluster.Config); err != nil {
		t.Fatal(err)
	}
	if err := devcluster.EnsureNamespace(ctx, cluster.Client, ns); err != nil {
		t.Fatal(err)
	}
	scheme, _ := operator.Scheme()
	k8s, err := client.New(cluster.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := cluster.OperatorKubeconfig(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// One node cordoned by an admin before the run: it must stay cordoned.
	adminCordoned := "gpu-000"
	if _, err := cluster.Client.CoreV1().Nodes().Patch(ctx, adminCordoned, "application/merge-patch+json",
		[]byte(`{"spec":{"unschedulable":true}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	workload(t, cluster, nodes*3)
	setLimits(t, k8s)

	chk := newChecker(cluster, k8s, adminCordoned, maxParallel, maxUnavail)
	checkCtx, stopChecker := context.WithCancel(ctx)
	go chk.run(checkCtx)

	op := &operatorProcess{bin: bin, kubeconfig: kubeconfig, dir: t.TempDir()}
	op.start(t)
	t.Cleanup(op.kill)

	for i := range *objects {
		nm := &maintenancev1.NodeMaintenance{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("chaos-%03d", i)},
			Spec: maintenancev1.NodeMaintenanceSpec{RequestorID: requestor, NodeName: fmt.Sprintf("gpu-%03d", i),
				DrainSpec: &maintenancev1.DrainSpec{TimeoutSeconds: ptr.To[int32](0)}},
		}
		if err := k8s.Create(ctx, nm); err != nil {
			t.Fatal(err)
		}
	}
	began := time.Now()

	// Requestor: delete each object once it is Ready. Chaos: kill the operator.
	killed := 0
	nextKill := time.Now().Add(gap(rng))
	apiRestarted := !*restartAPIServer
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, bound, true, func(ctx context.Context) (bool, error) {
		if killed < *kills && time.Now().After(nextKill) {
			op.kill()
			killed++
			time.Sleep(time.Duration(rng.IntN(500)) * time.Millisecond)
			op.start(t)
			nextKill = time.Now().Add(gap(rng))
		}
		if !apiRestarted && killed >= *kills/2 {
			apiRestarted = true
			if err := cluster.RestartAPIServer(ctx); err != nil {
				return false, fmt.Errorf("restarting kube-apiserver: %w", err)
			}
			t.Logf("kube-apiserver restarted after %s", time.Since(began).Round(time.Second))
		}
		var list maintenancev1.NodeMaintenanceList
		if err := k8s.List(ctx, &list, client.InNamespace("default")); err != nil {
			return false, nil //nolint:nilerr // the API server may be restarting
		}
		for i := range list.Items {
			nm := &list.Items[i]
			if c := meta.FindStatusCondition(nm.Status.Conditions, "Ready"); c != nil && c.Status == metav1.ConditionTrue && nm.DeletionTimestamp == nil &&
				chk.sawReady(nm.Namespace+"/"+nm.Name) {
				_ = k8s.Delete(ctx, nm)
			}
		}
		return len(list.Items) == 0 && killed >= *kills, nil
	})
	elapsed := time.Since(began)
	stopChecker()
	if err != nil {
		t.Fatalf("rollout not done within %s (%d kills so far): %v; ready seen for %d/%d objects", bound, killed, err, chk.readyCount(), *objects)
	}
	op.kill()
	chk.final(ctx, t, *objects)
	t.Logf("rollout of %d objects done in %s; survived %d SIGKILLs%s; invariants checked on %d events; max in progress %d (limit %d), max held or cordoned %d (limit %d), max NotReady %d; %d informer-order blips not confirmed by fresh reads",
		*objects, elapsed.Round(100*time.Millisecond), killed, map[bool]string{true: " and a kube-apiserver restart", false: ""}[*restartAPIServer],
		chk.events, chk.maxInProgress, maxParallel, chk.maxUnavailable, maxUnavail, chk.notReadySeen, chk.transients)
	for _, v := range chk.violations() {
		t.Error(v)
	}
}

func gap(rng *rand.Rand) time.Duration {
	return *minGap + time.Duration(rng.Int64N(int64(*maxGap-*minGap)+1))
}

// setLimits creates the MaintenanceOperatorConfig with the chaos tests'
// limits (maxParallel, maxUnavail).
func setLimits(t *testing.T, kube client.Client) {
	t.Helper()
	if err := kube.Create(t.Context(), &maintenancev1.MaintenanceOperatorConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"},
		Spec: maintenancev1.MaintenanceOperatorConfigSpec{MaxParallelOperations: ptr.To(intstr.FromInt32(maxParallel)),
			MaxUnavailable: ptr.To(intstr.FromInt32(maxUnavail))},
	}); err != nil {
		t.Fatal(err)
	}
}

// largeCluster is for hundreds of simulated nodes.
var largeCluster = devcluster.LargeCluster

// startEnv starts a cluster with GPU nodes prepared for the operator (CRDs,
// namespace, RBAC) and returns it with a kubeconfig of the operator's
// identity; the cluster stops at cleanup.
func startEnv(tb testing.TB, opts devcluster.Options, nodes, pools int) (*devcluster.Env, string) {
	tb.Helper()
	// The operator runs as its own process; the test's own clients log
	// nothing (and controller-runtime does not warn that they do not).
	ctrl.SetLogger(logr.Discard())
	scheme, _ := operator.Scheme()
	env, err := devcluster.NewEnv(context.Background(), opts, devcluster.GPUNodes(nodes, pools), ns, scheme)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(env.Stop)
	kubeconfig, err := env.OperatorKubeconfig(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	return env, kubeconfig
}

// buildOperator builds the real binary: the operator runs as its own process.
func buildOperator(t testing.TB) string {
	t.Helper()
	root, err := devcluster.SourceRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "gpufleet")
	if out, err := runIn(root, "go", "build", "-o", bin, "./cmd/gpufleet"); err != nil {
		t.Fatalf("building gpufleet: %v\n%s", err, out)
	}
	return bin
}

func runIn(dir, name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	return cmd.CombinedOutput()
}

// workload spreads a Deployment over the nodes, some pods behind a PDB.
func workload(t *testing.T, cluster *devcluster.Cluster, replicas int) {
	t.Helper()
	ctx := t.Context()
	labels := map[string]string{"app": "train"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "train"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(replicas)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{devcluster.AnnotationTerminateAfter: "1s"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "registry.example/train:1"}}},
			},
		},
	}
	if _, err := cluster.Client.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		d, err := cluster.Client.AppsV1().Deployments("default").Get(ctx, "train", metav1.GetOptions{})
		return err == nil && d.Status.ReadyReplicas == int32(replicas), nil
	})
	if err != nil {
		t.Fatalf("workload never ready: %v", err)
	}
}

// operatorProcess is the real gpufleet binary running `operator`.
type operatorProcess struct {
	bin, kubeconfig, dir string
	name                 string   // log file prefix
	extraArgs            []string // e.g. leader election flags
	metricsAddr          string   // serve metrics and pprof here ("" = off)
	env                  []string // added to the environment
	mu                   sync.Mutex
	cmd                  *exec.Cmd
	runs                 int
	logPath              string
}

func (o *operatorProcess) start(t *testing.T) { o.startWith(t, "maintenance") }

func (o *operatorProcess) pid() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.cmd == nil || o.cmd.Process == nil {
		return 0
	}
	return o.cmd.Process.Pid
}

func (o *operatorProcess) startWith(t testing.TB, capabilities string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.runs++
	name := o.name
	if name == "" {
		name = "operator"
	}
	o.logPath = filepath.Join(o.dir, fmt.Sprintf("%s-%02d.log", name, o.runs))
	log, err := os.Create(o.logPath)
	if err != nil {
		t.Fatal(err)
	}
	metrics := []string{"--metrics-bind-address", "0"}
	if o.metricsAddr != "" {
		metrics = []string{"--metrics-bind-address", o.metricsAddr, "--profiling"}
	}
	args := append([]string{"operator", "--kubeconfig", o.kubeconfig, "--namespace", ns,
		"--health-probe-bind-address", "0", "--capabilities", capabilities}, metrics...)
	args = append(args, o.extraArgs...)
	o.cmd = exec.Command(o.bin, args...)
	o.cmd.Env = append(os.Environ(), o.env...)
	o.cmd.Stdout, o.cmd.Stderr = log, log
	o.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := o.cmd.Start(); err != nil {
		t.Fatal(err)
	}
}

// controllersStarted reports whether every controller whose event sources
// this process's log shows starting has started its workers (controller-
// runtime starts them once its caches synced).
func (o *operatorProcess) controllersStarted() bool {
	o.mu.Lock()
	path := o.logPath
	o.mu.Unlock()
	data, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	sources, workers := map[string]bool{}, map[string]bool{}
	for line := range strings.SplitSeq(string(data), "\n") {
		var l struct {
			Msg        string `json:"msg"`
			Controller string `json:"controller"`
		}
		if json.Unmarshal([]byte(line), &l) != nil || l.Controller == "" {
			continue
		}
		switch l.Msg {
		case "Starting EventSource":
			sources[l.Controller] = true
		case "Starting workers":
			workers[l.Controller] = true
		}
	}
	for c := range sources {
		if !workers[c] {
			return false
		}
	}
	return len(workers) > 0
}

// isLeader reports whether this process's log says it acquired the lease.
func (o *operatorProcess) isLeader() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.cmd == nil {
		return false
	}
	data, _ := os.ReadFile(o.logPath)
	return strings.Contains(strings.ToLower(string(data)), "successfully acquired lease")
}

func (o *operatorProcess) kill() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.cmd != nil && o.cmd.Process != nil {
		_ = o.cmd.Process.Signal(syscall.SIGKILL)
		_ = o.cmd.Wait()
		o.cmd = nil
	}
}

// startLargeEnv starts a cluster for thousands of GPU nodes in pools
// (devcluster.GPUNodes): the first of each pool as startEnv does, the
// others created 32 at a time with their ResourceSlices, the kubelet lease
// scaled with the fleet (its renewals are the control plane's load at
// rest). It returns the cluster, the operator's kubeconfig, a client
// without client-side rate limits and the set-up times.
func startLargeEnv(b *testing.B, nodes, pools int) (*devcluster.Env, string, kubernetes.Interface, map[string]any) {
	ctx := context.Background()
	first := min(nodes, max(pools, 1))
	opts := largeCluster
	if lease := time.Duration(nodes/25) * time.Second; lease > opts.NodeLeaseDuration {
		opts.NodeLeaseDuration, opts.NodeMonitorGracePeriod = lease, lease*3/2
	}
	setup := map[string]any{"nodeLeaseSeconds": opts.NodeLeaseDuration.Seconds()}
	began := time.Now()
	env, kubeconfig := startEnv(b, opts, first, pools)
	setup["clusterStartSeconds"] = time.Since(began).Seconds()
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = 2000, 2000
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	specs := devcluster.GPUNodes(nodes, pools)
	began = time.Now()
	createNodes(ctx, b, cs, specs[first:])
	created := time.Since(began)
	setup["nodeCreateSeconds"] = created.Seconds()
	setup["nodesCreatedPerSecond"] = float64(nodes-first) / created.Seconds()
	waitNodesReady(ctx, b, cs, nodes)
	setup["nodesReadySeconds"] = time.Since(began).Seconds()
	b.Logf("%d nodes (%d pools) Ready after %s (created at %.0f/s)", nodes, pools, time.Since(began).Round(time.Second), float64(nodes-first)/created.Seconds())
	return env, kubeconfig, cs, setup
}

// poolsOf returns the pools of specs, sorted.
func poolsOf(specs []devcluster.NodeSpec) []string {
	seen := map[string]bool{}
	for _, s := range specs {
		if s.Pool != "" {
			seen[s.Pool] = true
		}
	}
	return slices.Sorted(maps.Keys(seen))
}
