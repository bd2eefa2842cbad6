package chaos

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/agent"
	"github.com/gpufleet/gpufleet/internal/devcluster"
	"github.com/gpufleet/gpufleet/internal/devcluster/devtest"
)

var agentBinaries = flag.String("chaos.agent-binaries", "gpufleet-agent,gpufleet",
	"comma-separated agent builds to measure, one run each (BenchmarkAgentMemory): gpufleet-agent (cmd/gpufleet-agent, what the DaemonSet runs) "+
		"or gpufleet (`gpufleet agent` of the one binary)")

// BenchmarkAgentMemory measures the node agent's memory as it runs on a GPU
// node: the binary built as the image builds it (static, -trimpath, -s -w)
// runs as its own process with the agent's identity and RBAC
// (config/agent/rbac.yaml) against the local cluster of 8 GPU nodes, for
// one node, reading a kernel log (a FIFO, /dev/kmsg's record format) and a
// simulated dcgm-exporter (the node's simulated GPUs, over HTTP, read every
// 5 s). During 70 s: an XID 48 on GPU 1 at 5 s, an uncorrectable ECC count
// on GPU 3 from 20 s to 60 s, three NodeRepairs of the node (dry runs
// without a pending action: nothing runs on this machine's host). The agent
// must have written both GPUFault records and its node's GPUProblem
// condition, or the run fails (an idle agent's figures would mean
// nothing). Reports VmRSS after 20 s and 70 s, VmHWM, and RssAnon/RssFile
// (the Go heap and stacks / the binary's pages) from /proc/PID/status.
// Target: under 30 MB RSS.
func BenchmarkAgentMemory(b *testing.B) {
	ctx := context.Background()
	env, _ := startEnv(b, devcluster.Options{}, 8, 2)
	devtest.InstallAgentRBAC(b, env.Kube)
	kubeconfig, err := env.KubeconfigFor("agent", "system:serviceaccount:"+ns+":gpufleet-agent",
		"system:serviceaccounts", "system:serviceaccounts:"+ns, "system:authenticated")
	if err != nil {
		b.Fatal(err)
	}
	for i, which := range strings.Split(*agentBinaries, ",") {
		node := fmt.Sprintf("gpu-%03d", i)
		bin, args := buildAgent(b, which)
		m := measureAgent(ctx, b, env, kubeconfig, node, bin, args)
		b.ReportMetric(m.rss/1024, "MB-rss-"+which)
		b.ReportMetric(m.hwm/1024, "MB-peak-rss-"+which)
		b.ReportMetric(m.anon/1024, "MB-anon-"+which)
		b.Logf("%s (%s, %.1f MB): VmRSS %.1f MB after 20 s, %.1f MB after 70 s, VmHWM %.1f MB; RssAnon %.1f MB, RssFile %.1f MB",
			strings.Join(append([]string{filepath.Base(bin)}, args...), " "), node, m.binMB,
			m.rss20/1024, m.rss/1024, m.hwm/1024, m.anon/1024, m.file/1024)
	}
}

// buildAgent builds which (gpufleet-agent or gpufleet) as hack/image.sh
// does and returns it with the arguments that make it the agent.
func buildAgent(tb testing.TB, which string) (string, []string) {
	tb.Helper()
	pkg, args := "./cmd/gpufleet-agent", []string(nil)
	switch which {
	case "gpufleet-agent":
	case "gpufleet":
		pkg, args = "./cmd/gpufleet", []string{"agent"}
	default:
		tb.Fatalf("-chaos.agent-binaries: unknown build %q (gpufleet-agent or gpufleet)", which)
	}
	root, err := devcluster.SourceRoot()
	if err != nil {
		tb.Fatal(err)
	}
	bin := filepath.Join(tb.TempDir(), which)
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, pkg)
	cmd.Dir, cmd.Env = root, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("building %s: %v\n%s", pkg, err, out)
	}
	return bin, args
}

type agentMemory struct {
	binMB                       float64
	rss20, rss, hwm, anon, file float64 // KiB
}

func measureAgent(ctx context.Context, b *testing.B, env *devcluster.Env, kubeconfig, node, bin string, args []string) agentMemory {
	b.Helper()
	// The simulated dcgm-exporter: the node's simulated GPUs as the
	// exporter shows them, read from the node at each scrape.
	dcgm := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := &corev1.Node{}
		if err := env.Kube.Get(r.Context(), client.ObjectKey{Name: node}, n); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		h, err := devcluster.ReadSimGPUHost(n)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = fmt.Fprint(w, h.DCGMMetrics())
	}))
	defer dcgm.Close()
	// The kernel log: a FIFO the agent follows as it follows /dev/kmsg.
	kmsg := filepath.Join(b.TempDir(), "kmsg")
	if err := syscall.Mkfifo(kmsg, 0o600); err != nil {
		b.Fatal(err)
	}
	kmsgW, err := os.OpenFile(kmsg, os.O_RDWR, 0) // RDWR: does not wait for the reader
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = kmsgW.Close() }()
	boot, err := agent.ReadBootTime("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}

	cmd := exec.Command(bin, append(args, "--kubeconfig", kubeconfig, "--node-name", node, "--kmsg-path", kmsg,
		"--dcgm-url", dcgm.URL+"/metrics", "--dcgm-interval", "5s", "--pod-resources-socket", "")...)
	logs := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	var waitErr error
	exited := make(chan struct{})
	go func() { waitErr = cmd.Wait(); close(exited) }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	began := time.Now()
	at := func(d time.Duration) {
		select {
		case <-exited:
			b.Fatalf("the agent exited: %v\n%s", waitErr, logs.String())
		case <-time.After(time.Until(began.Add(d))):
		}
	}

	for i := range 3 {
		nr := &repairv1.NodeRepair{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("agentmem-%s-%d", node, i)},
			// A dry run: even were an action pending, none would run here.
			Spec: repairv1.NodeRepairSpec{NodeName: node, Policy: "agentmem", DryRun: true,
				Actions: []repairv1.Action{repairv1.ActionRestartKubelet, repairv1.ActionReboot},
				Fault: repairv1.Fault{Rule: "kubelet", ConditionType: "Ready", Status: "False", Reason: "KubeletNotReady",
					Since: metav1.Now()}},
		}
		if err := env.Kube.Create(ctx, nr); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = env.Kube.Delete(context.Background(), nr) })
	}
	at(5 * time.Second)
	usec := time.Since(boot).Microseconds()
	gpu1 := devcluster.SimGPU(node, 1)
	lines := append([]string{fmt.Sprintf("4,1,%d,-;NVRM: GPU at PCI:%s: %s", usec, strings.TrimSuffix(gpu1.PCIBusID, ".0"), gpu1.UUID)},
		devcluster.KmsgXID(2, usec, gpu1, 48)...)
	if _, err := fmt.Fprint(kmsgW, strings.Join(lines, "\n")+"\n"); err != nil {
		b.Fatal(err)
	}
	at(20 * time.Second)
	var m agentMemory
	m.rss20, _, _, _ = agentStatus(cmd.Process.Pid)
	if err := env.SetGPUState(ctx, node, 3, func(s *devcluster.SimGPUState) { s.VolatileDBE = 2 }); err != nil {
		b.Fatal(err)
	}
	at(60 * time.Second)
	if err := env.SetGPUState(ctx, node, 3, func(s *devcluster.SimGPUState) { s.VolatileDBE = 0 }); err != nil {
		b.Fatal(err)
	}
	at(70 * time.Second)
	m.rss, m.hwm, m.anon, m.file = agentStatus(cmd.Process.Pid)
	if st, err := os.Stat(bin); err == nil {
		m.binMB = float64(st.Size()) / 1e6
	}
	checkAgentWrote(ctx, b, env, node, logs.String())
	return m
}

// checkAgentWrote fails b unless the agent recorded GPU 1's XID and GPU 3's
// ECC errors and set its node's GPUProblem condition.
func checkAgentWrote(ctx context.Context, b *testing.B, env *devcluster.Env, node, logs string) {
	b.Helper()
	err := wait.PollUntilContextTimeout(ctx, time.Second, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		var faults repairv1.GPUFaultList
		if err := env.Kube.List(ctx, &faults); err != nil {
			return false, err
		}
		seen := map[string]bool{}
		for _, f := range faults.Items {
			if f.Spec.NodeName == node {
				seen[f.Spec.GPU.PCIBusID] = true
			}
		}
		n := &corev1.Node{}
		if err := env.Kube.Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
			return false, err
		}
		cond := false
		for _, c := range n.Status.Conditions {
			cond = cond || c.Type == repairv1.ConditionGPUProblem
		}
		return seen[devcluster.SimGPU(node, 1).PCIBusID] && seen[devcluster.SimGPU(node, 3).PCIBusID] && cond, nil
	})
	if err != nil {
		b.Fatalf("the agent of %s did not record GPU 1's XID, GPU 3's ECC errors and the GPUProblem condition: %v\n%s", node, err, logs)
	}
}

// agentStatus reads VmRSS, VmHWM, RssAnon and RssFile (KiB) of a process.
func agentStatus(pid int) (rss, hwm, anon, file float64) {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		var v float64
		_, _ = fmt.Sscan(f[1], &v)
		switch f[0] {
		case "VmRSS:":
			rss = v
		case "VmHWM:":
			hwm = v
		case "RssAnon:":
			anon = v
		case "RssFile:":
			file = v
		}
	}
	return rss, hwm, anon, file
}

// lockedBuffer collects a process's output for the test to read at any
// time.
type lockedBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
