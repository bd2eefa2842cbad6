package agent

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// Runner runs a command in the host's namespaces.
type Runner interface {
	Run(ctx context.Context, name string, args ...string) (string, error)
}

// HostExecutor runs actions on the real host: systemd units through
// nsenter into PID 1's namespaces, crictl for sandboxes.
type HostExecutor struct{ Runner Runner }

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
		out, err := h.host(ctx, "crictl", "pods", "--state", "NotReady", "-q")
		if err != nil {
			return err
		}
		for _, id := range strings.Fields(out) {
			if _, err := h.host(ctx, "crictl", "rmp", "-f", id); err != nil {
				return err
			}
		}
		return nil
	case repairv1.ActionReboot:
		return h.systemctl(ctx, "reboot")
	default:
		return fmt.Errorf("unknown action %q", a)
	}
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
