// Package devcluster runs a real local Kubernetes control plane — etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler — with kwok
// simulating GPU nodes. The integration tests and `gpufleet dev` both use it.
//
// The binaries are built from the Go module proxy by `make tools` into bin/;
// nothing is downloaded from anywhere else.
package devcluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

//go:embed stages/node.yaml
var nodeStages string

//go:embed stages/pod.yaml
var podStages string

// Binaries the cluster needs in its bin directory.
var Binaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"}

// Label and annotation keys the simulation understands.
const (
	// LabelKubelet set to "stopped" makes kwok stop managing the node: its
	// lease expires and the node lifecycle controller marks it NotReady;
	// its pods are no longer touched (deleted pods stay Terminating).
	LabelKubelet = "sim.gpufleet.dev/kubelet"
	// LabelFrozen (any value) stops kwok from writing the node's status, so
	// injected conditions persist while the lease is still renewed.
	LabelFrozen = "sim.gpufleet.dev/frozen"
	// AnnotationRunFor on a pod (a Go duration) makes it complete after that long.
	AnnotationRunFor = "sim.gpufleet.dev/run-for"
	// AnnotationTerminateAfter on a pod (a Go duration) delays its removal after deletion.
	AnnotationTerminateAfter = "sim.gpufleet.dev/terminate-after"
	// AnnotationNeverReady "true" on a pod keeps it Running but not Ready.
	AnnotationNeverReady = "sim.gpufleet.dev/never-ready"
	// UnhealthyNodePrefix: pods on nodes whose name starts with it never
	// become Ready (a node whose GPU stack cannot come up).
	UnhealthyNodePrefix = "unhealthy-"
)

// LargeCluster are the options for hundreds of simulated nodes or more:
// longer node leases, or their renewals alone take the CPU the scenarios
// measure, and on 2 cores late renewals make the node lifecycle controller
// mark nodes NotReady and their pods not Ready — which kwok, unlike a
// kubelet, never reports Ready again once the node is back.
var LargeCluster = Options{NodeLeaseDuration: 40 * time.Second, NodeMonitorGracePeriod: 60 * time.Second,
	StartTimeout: 3 * time.Minute}

// Options configure a local cluster. The zero value is usable.
type Options struct {
	// BinDir holds the binaries; default $GPUFLEET_BIN_DIR, else bin/ at the
	// root of the gpufleet source tree found above the working directory.
	BinDir string
	// NodeLeaseDuration is the simulated kubelets' lease duration (kwok
	// renews every quarter of it). Default 8s.
	NodeLeaseDuration time.Duration
	// NodeMonitorGracePeriod is how long the node lifecycle controller waits
	// for a heartbeat before marking a node NotReady. Default 10s.
	NodeMonitorGracePeriod time.Duration
	// StartTimeout bounds the whole start-up. Default 90s.
	StartTimeout time.Duration
	// Logf receives progress messages; nil is silent.
	Logf func(format string, args ...any)
}

// Cluster is a running local control plane.
type Cluster struct {
	// Dir holds data, logs, certificates and the kubeconfig; removed by Stop.
	Dir string
	// Kubeconfig is the path of an admin kubeconfig.
	Kubeconfig string
	// Config is the admin (system:masters) REST config.
	Config *rest.Config
	// Client is an admin clientset.
	Client kubernetes.Interface
	// APIServerURL is the https URL of the API server.
	APIServerURL string

	pki   *pki
	procs []*process
	// stopSim ends the in-process simulation loops (siminit.go,
	// simdeviceplugin.go), which run with simCtx.
	stopSim  context.CancelFunc
	simCtx   context.Context
	stopOnce sync.Once
	// devicePluginOnce starts the simulated device plugin with the first
	// device-plugin node.
	devicePluginOnce sync.Once
	simPlugins       *simDevicePlugin // set by the first
	logf             func(string, ...any)
	etcdURL          string
	// simClock is the simulated hosts' clock (nil: the wall clock; tests).
	simClock func() time.Time
}

// Start starts a cluster and waits until every part is healthy. On error
// everything started so far is stopped and removed.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	opts = withDefaults(opts)
	binDir, err := resolveBinDir(opts.BinDir)
	if err != nil {
		return nil, err
	}
	if err := checkBinaries(binDir); err != nil {
		return nil, err
	}
	removeStaleDirs()
	dir, err := os.MkdirTemp("", "gpufleet-devcluster-")
	if err != nil {
		return nil, fmt.Errorf("creating cluster dir: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		return nil, fmt.Errorf("writing owner pid: %w", err)
	}
	c := &Cluster{Dir: dir, logf: opts.Logf}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()

	began := time.Now()
	if err := c.startEtcd(ctx, binDir); err != nil {
		return nil, err
	}
	if err := c.startAPIServer(ctx, binDir); err != nil {
		return nil, err
	}
	if err := c.startComponents(ctx, binDir, opts); err != nil {
		return nil, err
	}
	if err := c.waitServiceAccounts(ctx); err != nil {
		return nil, err
	}
	// The simulated DRA driver's DeviceClass; AddNodes publishes the slices.
	if err := c.ensureGPUDeviceClass(ctx); err != nil {
		return nil, err
	}
	simCtx, stopSim := context.WithCancel(context.Background())
	c.stopSim, c.simCtx = stopSim, simCtx
	if err := c.startSimInit(simCtx); err != nil {
		return nil, fmt.Errorf("starting the simulated init containers: %w", err)
	}
	if err := c.startSimComputeDomains(simCtx); err != nil {
		return nil, fmt.Errorf("starting the simulated ComputeDomain driver: %w", err)
	}
	c.logf("local cluster ready in %s (%s)", time.Since(began).Round(100*time.Millisecond), dir)
	return c, nil
}

func withDefaults(o Options) Options {
	if o.NodeLeaseDuration == 0 {
		o.NodeLeaseDuration = 8 * time.Second
	}
	if o.NodeMonitorGracePeriod == 0 {
		o.NodeMonitorGracePeriod = 10 * time.Second
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 90 * time.Second
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	return o
}

// Stop ends every process the cluster started and removes its directory.
// It is safe to call more than once.
func (c *Cluster) Stop() {
	c.stopOnce.Do(func() {
		if c.stopSim != nil {
			c.stopSim()
		}
		// Reverse start order: clients first, etcd last.
		for i := len(c.procs) - 1; i >= 0; i-- {
			c.procs[i].stop(10 * time.Second)
		}
		if c.Dir != "" {
			_ = os.RemoveAll(c.Dir)
		}
	})
}

// Process names, as used in logs and errors.
const (
	procEtcd      = "etcd"
	procAPIServer = "kube-apiserver"
	procKCM       = "kube-controller-manager"
	procScheduler = "kube-scheduler"
	procKwok      = "kwok"
)

// ProcessCPU is the CPU time each control-plane process (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler, kwok) has used
// so far, by name: what a benchmark reads to say which part of the local
// cluster was busy.
func (c *Cluster) ProcessCPU() map[string]time.Duration {
	out := make(map[string]time.Duration, len(c.procs))
	for _, p := range c.procs {
		out[p.name] += p.cpu()
	}
	return out
}

func (c *Cluster) start(name, binDir string, args ...string) (*process, error) {
	p, err := startProcess(name, filepath.Join(binDir, name), args, c.Dir)
	if err != nil {
		return nil, err
	}
	c.procs = append(c.procs, p)
	return p, nil
}

func (c *Cluster) startEtcd(ctx context.Context, binDir string) error {
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	client, peer := "http://"+hostPort(ports[0]), "http://"+hostPort(ports[1])
	p, err := c.start(procEtcd, binDir,
		"--name=devcluster",
		"--data-dir="+filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls="+client,
		"--advertise-client-urls="+client,
		"--listen-peer-urls="+peer,
		"--initial-advertise-peer-urls="+peer,
		"--initial-cluster=devcluster="+peer,
		"--unsafe-no-fsync=true", // a throw-away cluster: durability is not needed, speed is
		"--quota-backend-bytes=8589934592",
		"--log-level=warn",
	)
	if err != nil {
		return err
	}
	c.etcdURL = client
	return p.waitHealthy(ctx, &http.Client{Timeout: 2 * time.Second}, client+"/health")
}

func (c *Cluster) startAPIServer(ctx context.Context, binDir string) error {
	var err error
	if c.pki, err = newPKI(filepath.Join(c.Dir, "pki")); err != nil {
		return err
	}
	serving, err := c.pki.serving("apiserver",
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		[]net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.96.0.1")})
	if err != nil {
		return err
	}
	saKey, saPub, err := c.pki.serviceAccountKey()
	if err != nil {
		return err
	}
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	c.APIServerURL = "https://" + hostPort(ports[0])
	p, err := c.start(procAPIServer, binDir,
		"--etcd-servers="+c.etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		// The default endpoint reconciler refuses loopback addresses; nothing
		// in the local cluster reaches the API server through its Service.
		"--endpoint-reconciler-type=none",
		"--secure-port="+strconv.Itoa(ports[0]),
		"--tls-cert-file="+serving.CertFile,
		"--tls-private-key-file="+serving.KeyFile,
		"--client-ca-file="+c.pki.caFile(),
		"--service-account-key-file="+saPub,
		"--service-account-signing-key-file="+saKey,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--authorization-mode=Node,RBAC",
		"--service-cluster-ip-range=10.96.0.0/16",
		"--allow-privileged=true",
		"--profiling=false",
		"--cert-dir="+filepath.Join(c.Dir, "apiserver-certs"),
		"--max-requests-inflight=800",
		"--max-mutating-requests-inflight=400",
		// Dynamic Resource Allocation with device taints needs no
		// --feature-gates or --runtime-config here or in the scheduler and
		// controller-manager: in v1.37 resource.k8s.io/v1 (DeviceClass,
		// ResourceSlice, ResourceClaim(Template), DeviceTaintRule) is
		// served by default, DynamicResourceAllocation is GA and locked on,
		// and DRADeviceTaints (the scheduler honours taints) and
		// DRADeviceTaintRules (the DeviceTaintRule API, the scheduler's
		// watch of it and its RBAC) went GA, on by default, in 1.37
		// (pkg/features/kube_features.go). TestResourceAPIServesDeviceTaintRules
		// and TestDeviceTaintRuleIsolatesOneGPU check this.
	)
	if err != nil {
		return err
	}
	admin, err := c.pki.client("admin", "gpufleet-admin", "system:masters")
	if err != nil {
		return err
	}
	c.Config = &rest.Config{
		Host:            c.APIServerURL,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.pki.caPEM(), CertData: admin.CertPEM, KeyData: admin.KeyPEM},
		QPS:             200,
		Burst:           400,
	}
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	c.Kubeconfig = filepath.Join(c.Dir, "kubeconfig")
	if err := c.writeKubeconfig(c.Kubeconfig, "gpufleet-admin", admin); err != nil {
		return err
	}
	return p.waitHealthy(ctx, c.tlsClient(admin), c.APIServerURL+"/readyz")
}

func (c *Cluster) tlsClient(kp keyPair) *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.pki.caPEM())
	cert, _ := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}},
	}}
}

// componentKubeconfig issues a client certificate for user and writes a
// kubeconfig for it.
func (c *Cluster) componentKubeconfig(file, user string, groups ...string) (string, error) {
	kp, err := c.pki.client(file, user, groups...)
	if err != nil {
		return "", err
	}
	path := filepath.Join(c.Dir, file+".kubeconfig")
	return path, c.writeKubeconfig(path, user, kp)
}

func (c *Cluster) writeKubeconfig(path, user string, kp keyPair) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["gpufleet-dev"] = &clientcmdapi.Cluster{Server: c.APIServerURL, CertificateAuthorityData: c.pki.caPEM()}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: kp.CertPEM, ClientKeyData: kp.KeyPEM}
	cfg.Contexts["gpufleet-dev"] = &clientcmdapi.Context{Cluster: "gpufleet-dev", AuthInfo: user}
	cfg.CurrentContext = "gpufleet-dev"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("writing kubeconfig %s: %w", path, err)
	}
	return nil
}

// KubeconfigFor writes a kubeconfig authenticated as user (with groups),
// for running a component as its own process under its own RBAC (file
// names the kubeconfig in the cluster's directory).
func (c *Cluster) KubeconfigFor(file, user string, groups ...string) (string, error) {
	return c.componentKubeconfig(file, user, groups...)
}

// ConfigFor returns a REST config authenticated as user (with groups), for
// running a component under its own RBAC rather than as admin.
func (c *Cluster) ConfigFor(user string, groups ...string) (*rest.Config, error) {
	kp, err := c.pki.client("user-"+strings.ReplaceAll(user, ":", "-"), user, groups...)
	if err != nil {
		return nil, err
	}
	cfg := rest.CopyConfig(c.Config)
	cfg.CertData, cfg.KeyData = kp.CertPEM, kp.KeyPEM
	return cfg, nil
}

func (c *Cluster) startComponents(ctx context.Context, binDir string, opts Options) error {
	kcmConfig, err := c.componentKubeconfig("controller-manager", "system:kube-controller-manager")
	if err != nil {
		return err
	}
	schedConfig, err := c.componentKubeconfig("scheduler", "system:kube-scheduler")
	if err != nil {
		return err
	}
	// kwok plays every kubelet; it needs more than the Node authorizer grants
	// a single node, so it runs as a cluster admin.
	kwokConfig, err := c.componentKubeconfig("kwok", "kwok", "system:masters")
	if err != nil {
		return err
	}
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	kcm, err := c.start(procKCM, binDir,
		"--kubeconfig="+kcmConfig,
		"--authentication-kubeconfig="+kcmConfig,
		"--authorization-kubeconfig="+kcmConfig,
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(ports[0]),
		"--cert-dir="+filepath.Join(c.Dir, "kcm-certs"),
		"--leader-elect=false",
		"--service-account-private-key-file="+filepath.Join(c.pki.dir, "sa.key"),
		"--root-ca-file="+c.pki.caFile(),
		"--use-service-account-credentials=true",
		"--cluster-signing-cert-file="+c.pki.caFile(),
		"--cluster-signing-key-file="+c.pki.caKeyFile(),
		"--controllers=*",
		"--node-monitor-period=1s",
		"--node-monitor-grace-period="+opts.NodeMonitorGracePeriod.String(),
		"--kube-api-qps=200",
		"--kube-api-burst=400",
		"--concurrent-daemonset-syncs=4",
	)
	if err != nil {
		return err
	}
	sched, err := c.start(procScheduler, binDir,
		"--kubeconfig="+schedConfig,
		"--authentication-kubeconfig="+schedConfig,
		"--authorization-kubeconfig="+schedConfig,
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(ports[1]),
		"--leader-elect=false",
		"--kube-api-qps=200",
		"--kube-api-burst=400",
	)
	if err != nil {
		return err
	}
	kwokCfgPath := filepath.Join(c.Dir, "kwok.yaml")
	if err := os.WriteFile(kwokCfgPath, []byte(kwokConfigYAML()), 0o600); err != nil {
		return fmt.Errorf("writing kwok config: %w", err)
	}
	kwok, err := c.start(procKwok, binDir,
		"--kubeconfig="+kwokConfig,
		"--config="+kwokCfgPath,
		"--manage-nodes-with-label-selector="+LabelKubelet+"!=stopped,type=kwok",
		"--node-lease-duration-seconds="+strconv.Itoa(int(opts.NodeLeaseDuration/time.Second)),
		"--server-address="+hostPort(ports[2]),
		"--cidr=10.244.0.1/16",
		"--node-ip=10.1.0.1",
	)
	if err != nil {
		return err
	}
	insecure := insecureLoopbackClient()
	if err := kcm.waitHealthy(ctx, insecure, "https://"+hostPort(ports[0])+"/healthz"); err != nil {
		return err
	}
	if err := sched.waitHealthy(ctx, insecure, "https://"+hostPort(ports[1])+"/healthz"); err != nil {
		return err
	}
	return kwok.waitHealthy(ctx, &http.Client{Timeout: 2 * time.Second}, "http://"+hostPort(ports[2])+"/healthz")
}

func kwokConfigYAML() string {
	return `apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  nodePlayStageParallelism: 8
  podPlayStageParallelism: 8
  nodeLeaseParallelism: 8
---
` + nodeStages + "\n---\n" + podStages
}

// waitServiceAccounts waits for the service-account controller, so pods can
// be created in the default namespace right away.
func (c *Cluster) waitServiceAccounts(ctx context.Context) error {
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		for _, p := range c.procs {
			if p.name == procKCM {
				return p.failure(fmt.Errorf("default service account never appeared: %w", err))
			}
		}
		return err
	}
	return nil
}

// RestartAPIServer stops and restarts kube-apiserver with the same flags,
// for chaos tests. Clients reconnect on their own.
func (c *Cluster) RestartAPIServer(ctx context.Context) error {
	for i, p := range c.procs {
		if p.name != procAPIServer {
			continue
		}
		p.stop(10 * time.Second)
		np, err := startProcess(p.name, p.cmd.Path, p.cmd.Args[1:], c.Dir)
		if err != nil {
			return err
		}
		c.procs[i] = np
		admin := keyPair{CertPEM: c.Config.CertData, KeyPEM: c.Config.KeyData}
		return np.waitHealthy(ctx, c.tlsClient(admin), c.APIServerURL+"/readyz")
	}
	return errors.New("kube-apiserver is not part of this cluster")
}

// BinDir is the directory holding the control-plane binaries and the
// pinned tools: $GPUFLEET_BIN_DIR, else bin/ at the source root.
func BinDir() (string, error) { return resolveBinDir("") }

// resolveBinDir finds the directory holding the control-plane binaries.
func resolveBinDir(dir string) (string, error) {
	if dir == "" {
		dir = os.Getenv("GPUFLEET_BIN_DIR")
	}
	if dir != "" {
		return filepath.Abs(dir)
	}
	root, err := SourceRoot()
	if err != nil {
		return "", fmt.Errorf("finding the control-plane binaries: set GPUFLEET_BIN_DIR or run from the gpufleet source tree (%w)", err)
	}
	return filepath.Join(root, "bin"), nil
}

// SourceRoot returns the root of the gpufleet source tree that contains the
// working directory.
func SourceRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		data, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && strings.HasPrefix(string(data), "module github.com/gpufleet/gpufleet\n") {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no gpufleet go.mod above %s", wd)
		}
	}
}

// ResultsDir is where benchmarks write their reports: dir when given,
// else results/ in the source tree; it is created.
func ResultsDir(dir string) (string, error) {
	if dir == "" {
		root, err := SourceRoot()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(root, "results")
	}
	return dir, os.MkdirAll(dir, 0o755)
}

// MissingBinariesError says which binaries are missing and how to build them.
type MissingBinariesError struct {
	Dir     string
	Missing []string
}

func (e *MissingBinariesError) Error() string {
	return fmt.Sprintf("local cluster binaries missing in %s: %s; build them with `make tools` (or `hack/build-tools.sh controlplane`) from the gpufleet source root",
		e.Dir, strings.Join(e.Missing, ", "))
}

func checkBinaries(dir string) error {
	var missing []string
	for _, b := range Binaries {
		if st, err := os.Stat(filepath.Join(dir, b)); err != nil || st.Mode()&0o111 == 0 {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return &MissingBinariesError{Dir: dir, Missing: missing}
	}
	return nil
}

// removeStaleDirs deletes the directories of earlier clusters whose owner
// process is gone (a test binary that was killed cannot clean up after
// itself; its child processes were killed with it).
func removeStaleDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "gpufleet-devcluster-*"))
	for _, d := range dirs {
		data, err := os.ReadFile(filepath.Join(d, "owner.pid"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(d)
		}
	}
}
