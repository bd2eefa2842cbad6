package chaos

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"

	"github.com/gpufleet/gpufleet/internal/apirequest"
	"github.com/gpufleet/gpufleet/internal/devcluster"
)

// kubectlBaseline is what a plain shell loop does without any scheduler:
// `kubectl drain --ignore-daemonsets --delete-emptydir-data --force` then
// `kubectl uncordon` of every node, `parallel` nodes at a time (a worker
// pool, as `xargs -P`), with bin/kubectl as the cluster's admin. A node an
// admin had cordoned before is drained but left cordoned, as gpufleet does.
type kubectlBaseline struct {
	Seconds  float64        `json:"seconds"`
	Parallel int            `json:"parallel"`
	Nodes    int            `json:"nodes"`
	Requests map[string]int `json:"requests"` // "VERB resource" as kubectl -v=6 logs them
	// Retries: drains that failed and were run again.
	Retries int `json:"retries"`
}

// kubectlRequest matches client-go's request log at -v=6:
// "Response" verb="GET" url="https://…/api/v1/nodes/gpu-001" status="200 OK".
var kubectlRequest = regexp.MustCompile(`verb="([A-Z]+)" url="([^"]+)"`)

func runKubectlBaseline(b *testing.B, env *devcluster.Env, nodes []string, parallel int, adminCordoned string) kubectlBaseline {
	dir, err := devcluster.BinDir()
	if err != nil {
		b.Fatal(err)
	}
	kubectl := filepath.Join(dir, "kubectl")
	cacheDir := b.TempDir()
	res := kubectlBaseline{Parallel: parallel, Nodes: len(nodes), Requests: map[string]int{}}
	var mu sync.Mutex
	run := func(args ...string) error {
		args = append([]string{"--kubeconfig", env.Kubeconfig, "--cache-dir", cacheDir, "-v=6"}, args...)
		cmd := exec.Command(kubectl, args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		counts := map[string]int{}
		var other strings.Builder // what kubectl said besides its requests
		sc := bufio.NewScanner(&stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if m := kubectlRequest.FindStringSubmatch(sc.Text()); m != nil {
				counts[describeURL(m[1], m[2])]++
			} else if !strings.Contains(sc.Text(), "round_trippers.go") && !strings.Contains(sc.Text(), "loader.go") {
				other.WriteString(sc.Text() + "\n")
			}
		}
		mu.Lock()
		for k, v := range counts {
			res.Requests[k] += v
		}
		mu.Unlock()
		if err != nil {
			return fmt.Errorf("kubectl %v: %w\n%s", args[5:], err, tail(other.String(), 3000))
		}
		return nil
	}
	// As a person running the loop would, a drain that fails is run again
	// (kubectl drain resumes where it was), at most ten times: with many
	// drains at once the API server's retries of conflicting budget
	// updates run out and kubectl stops with a 409 (500 nodes, 49 at a
	// time: 377 failed drains, one of them three times in a row).
	drainNode := func(node string) error {
		var err error
		for range 10 {
			if err = run("drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout=10m"); err == nil {
				return nil
			}
			mu.Lock()
			res.Retries++
			mu.Unlock()
			b.Logf("baseline: drain of %s failed, running it again: %s", node, firstLine(err.Error()))
		}
		return err
	}
	work := make(chan string)
	errs := make(chan error, len(nodes))
	var wg sync.WaitGroup
	began := time.Now()
	for range parallel {
		wg.Go(func() {
			for node := range work {
				if err := drainNode(node); err != nil {
					errs <- err
					continue
				}
				if node == adminCordoned {
					continue
				}
				if err := run("uncordon", node); err != nil {
					errs <- err
				}
			}
		})
	}
	for _, node := range nodes {
		work <- node
	}
	close(work)
	wg.Wait()
	res.Seconds = time.Since(began).Seconds()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return res
}

// respreadWorkloads deletes the workload pods so that their ReplicaSets
// create them again on all schedulable nodes, spread as at the start, and
// waits until all are running and the old ones gone: the next rollout
// starts from the same distribution as the baseline did.
func respreadWorkloads(b *testing.B, env *devcluster.Env, pods int) {
	ctx := context.Background()
	// One DeleteCollection of thousands of pods can outlast the API server's
	// request timeout (seen at 500 nodes: "stream error … INTERNAL_ERROR");
	// what it deleted stays deleted, so asking again finishes the rest.
	attempt := 0
	err := retry.OnError(wait.Backoff{Steps: 5, Duration: 2 * time.Second, Factor: 1}, func(error) bool { return true }, func() error {
		attempt++
		err := env.Client.CoreV1().Pods(workloadNamespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		if err != nil {
			b.Logf("respread: deleting the workload pods (attempt %d): %v", attempt, err)
		}
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, 10*time.Minute, false, func(ctx context.Context) (bool, error) {
		list, err := env.Client.CoreV1().Pods(workloadNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // retried
		}
		running := 0
		for i := range list.Items {
			p := &list.Items[i]
			if p.DeletionTimestamp != nil {
				return false, nil
			}
			if p.Status.Phase == corev1.PodRunning && p.Spec.NodeName != "" {
				running++
			}
		}
		return running == pods && len(list.Items) == pods, nil
	})
	if err != nil {
		b.Fatalf("workload pods not running again after the baseline: %v", err)
	}
}

// podSpread returns the fewest and most workload pods on a schedulable node.
func podSpread(b *testing.B, env *devcluster.Env) (lo, hi int) {
	ctx := context.Background()
	list, err := env.Client.CoreV1().Pods(workloadNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	nodes, err := env.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	per := map[string]int{}
	for i := range nodes.Items {
		if !nodes.Items[i].Spec.Unschedulable {
			per[nodes.Items[i].Name] = 0
		}
	}
	for i := range list.Items {
		if n, ok := per[list.Items[i].Spec.NodeName]; ok {
			per[list.Items[i].Spec.NodeName] = n + 1
		}
	}
	lo = -1
	for _, n := range per {
		if lo < 0 || n < lo {
			lo = n
		}
		hi = max(hi, n)
	}
	return lo, hi
}

// describeURL names a logged request as the operator's requests are named
// ("GET nodes", "POST pods/eviction").
func describeURL(method, url string) string {
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		return method + " " + url
	}
	verb, resource := apirequest.Describe(req)
	return verb + " " + resource
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
