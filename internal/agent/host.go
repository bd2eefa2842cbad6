package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// Runner runs a command in the host's namespaces.
type Runner interface {
	Run(ctx context.Context, name string, args ...string) (string, error)
}

// HostExecutor runs actions on the real host: systemd units through
// nsenter into PID 1's namespaces, crictl for sandboxes.
type HostExecutor struct {
	Runner Runner
	// Clock dates sandboxes (default: the real clock).
	Clock clock.PassiveClock
}

// SandboxGrace: a NotReady sandbox younger than this may be one the
// runtime is still setting up; DeleteBrokenSandbox leaves it alone.
const SandboxGrace = 2 * time.Minute

// Execute implements Executor.
func (h HostExecutor) Execute(ctx context.Context, node *corev1.Node, a repairv1.Action) error {
	switch a {
	case repairv1.ActionRestartKubelet:
		return h.systemctl(ctx, "restart", "kubelet")
	case repairv1.ActionRestartContainerRuntime:
		return h.systemctl(ctx, "restart", runtimeUnit(node))
	case repairv1.ActionRestartNTP:
		for _, unit := range []string{"chronyd", "ntpd", "systemd-timesyncd"} {
			if _, err := h.host(ctx, "systemctl", "cat", unit); err == nil {
				return h.systemctl(ctx, "restart", unit)
			}
		}
		return fmt.Errorf("no NTP unit (chronyd, ntpd, systemd-timesyncd) on this host")
	case repairv1.ActionDeleteBrokenSandbox:
		return h.deleteBrokenSandboxes(ctx)
	case repairv1.ActionReboot:
		return h.systemctl(ctx, "reboot")
	default:
		return fmt.Errorf("unknown action %q", a)
	}
}

// deleteBrokenSandboxes removes the pod sandboxes that have been NotReady
// for longer than SandboxGrace (the kubelet creates fresh ones for pods
// that should still run). Sandboxes being set up are left alone; a
// sandbox that fails to go away does not stop the others.
func (h HostExecutor) deleteBrokenSandboxes(ctx context.Context) error {
	out, err := h.host(ctx, "crictl", "pods", "--state", "NotReady", "-o", "json")
	if err != nil {
		return err
	}
	ids, err := staleSandboxes([]byte(out), h.now(), SandboxGrace)
	if err != nil {
		return err
	}
	var errs []error
	for _, id := range ids {
		if _, err := h.host(ctx, "crictl", "rmp", "-f", id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (h HostExecutor) now() time.Time {
	if h.Clock == nil {
		return time.Now()
	}
	return h.Clock.Now()
}

// staleSandboxes returns the ids in crictl's JSON list of pod sandboxes
// created more than grace before now. createdAt is in nanoseconds since
// the epoch, a string in crictl's protobuf JSON (a number is accepted too).
func staleSandboxes(data []byte, now time.Time, grace time.Duration) ([]string, error) {
	var list struct {
		Items []struct {
			ID        string      `json:"id"`
			CreatedAt json.Number `json:"createdAt"`
		} `json:"items"`
	}
	if err := json.Unmarshal(data, &list); err != nil {
		return nil, fmt.Errorf("reading crictl pods: %w", err)
	}
	var ids []string
	for _, it := range list.Items {
		ns, err := it.CreatedAt.Int64()
		if err != nil || it.ID == "" {
			return nil, fmt.Errorf("reading crictl pods: sandbox %q created at %q", it.ID, it.CreatedAt)
		}
		if now.Sub(time.Unix(0, ns)) >= grace {
			ids = append(ids, it.ID)
		}
	}
	return ids, nil
}

func runtimeUnit(node *corev1.Node) string {
	v := node.Status.NodeInfo.ContainerRuntimeVersion
	switch {
	case strings.HasPrefix(v, "docker://"):
		return "docker"
	case strings.HasPrefix(v, "cri-o://"):
		return "crio"
	default:
		return "containerd"
	}
}

func (h HostExecutor) systemctl(ctx context.Context, args ...string) error {
	_, err := h.host(ctx, "systemctl", args...)
	return err
}

func (h HostExecutor) host(ctx context.Context, name string, args ...string) (string, error) {
	full := append([]string{"--target", "1", "--mount", "--uts", "--ipc", "--net", "--pid", "--", name}, args...)
	out, err := h.Runner.Run(ctx, "nsenter", full...)
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out))
	}
	return out, nil
}
