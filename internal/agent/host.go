package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"

	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// Runner runs a command in the host's namespaces.
type Runner interface {
	Run(ctx context.Context, name string, args ...string) (string, error)
}

// ExecRunner runs commands with os/exec.
type ExecRunner struct{}

// Run implements Runner.
func (ExecRunner) Run(ctx context.Context, name string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
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

// Execute implements Executor. With the context's logger it logs each
// host action before running it (a reboot may not return) and its outcome
// (the error includes the command's output, trimmed).
func (h HostExecutor) Execute(ctx context.Context, node *corev1.Node, a repairv1.Action, gpus []repairv1.GPURef) error {
	log := crlog.FromContext(ctx).WithValues("node", klog.KObj(node), "action", a)
	ctx = crlog.IntoContext(ctx, log)
	began := h.now()
	if err := h.execute(ctx, node, a, gpus); err != nil {
		log.Error(err, "host action failed", "duration", h.now().Sub(began))
		return err
	}
	log.Info("host action done", "duration", h.now().Sub(began))
	return nil
}

func (h HostExecutor) execute(ctx context.Context, node *corev1.Node, a repairv1.Action, gpus []repairv1.GPURef) error {
	switch a {
	case repairv1.ActionRestartKubelet:
		return h.restart(ctx, "kubelet")
	case repairv1.ActionRestartContainerRuntime:
		return h.restart(ctx, runtimeUnit(node))
	case repairv1.ActionRestartNTP:
		for _, unit := range []string{"chronyd", "ntpd", "systemd-timesyncd"} {
			if _, err := h.host(ctx, "systemctl", "cat", unit); err == nil {
				return h.restart(ctx, unit)
			}
		}
		return fmt.Errorf("no NTP unit (chronyd, ntpd, systemd-timesyncd) on this host")
	case repairv1.ActionDeleteBrokenSandbox:
		return h.deleteBrokenSandboxes(ctx)
	case repairv1.ActionRestartFabricManager, repairv1.ActionRestartPersistenced, repairv1.ActionRestartDCGM:
		return h.restartGPUUnit(ctx, a)
	case repairv1.ActionResetGPU:
		return h.resetGPUs(ctx, gpus)
	case repairv1.ActionReboot:
		crlog.FromContext(ctx).Info("running host action")
		return h.systemctl(ctx, "reboot")
	case repairv1.ActionValidateGPU:
		return h.validateGPUs(ctx, gpus, ValidationLevel(ctx))
	case repairv1.ActionRestartGPUStackPods:
		return fmt.Errorf("%s is run by gpufleet's repair controller, not the node agent", a)
	default:
		return fmt.Errorf("unknown action %q", a)
	}
}

// GPUServiceUnits are the systemd units of the node's GPU services, by the
// action that restarts them: the first of each list the host has (NVIDIA's
// packages name the DCGM host engine nvidia-dcgm; older ones dcgm).
var GPUServiceUnits = map[repairv1.Action][]string{
	repairv1.ActionRestartFabricManager: {"nvidia-fabricmanager"},
	repairv1.ActionRestartPersistenced:  {"nvidia-persistenced"},
	repairv1.ActionRestartDCGM:          {"nvidia-dcgm", "dcgm"},
}

// restartGPUUnit restarts the GPU service of action a; a host without it
// is an error (the rule asked for a service the node does not run).
func (h HostExecutor) restartGPUUnit(ctx context.Context, a repairv1.Action) error {
	units := GPUServiceUnits[a]
	for _, unit := range units {
		if _, err := h.host(ctx, "systemctl", "cat", unit); err == nil {
			return h.restart(ctx, unit)
		}
	}
	return fmt.Errorf("no %s unit on this host", strings.Join(units, " or "))
}

// GPUHolderUnits are the host's services that keep GPUs open; a GPU
// reset needs them stopped (NVIDIA: "nvidia-smi -r" requires that no
// process uses the GPU, the persistence daemon, DCGM and Fabric Manager
// included).
var GPUHolderUnits = []string{"nvidia-persistenced", "nvidia-dcgm", "nvidia-fabricmanager"}

// resetGPUs resets the GPUs with nvidia-smi. It refuses, before changing
// anything, when a GPU is not named by its PCI address or still runs
// compute processes; it stops the active GPUHolderUnits, resets each GPU
// (one failing does not keep the others from being reset) and starts the
// units it stopped again, whatever the resets did.
func (h HostExecutor) resetGPUs(ctx context.Context, gpus []repairv1.GPURef) (err error) {
	if len(gpus) == 0 {
		return errors.New("no GPU to reset (the repair names none)")
	}
	log := crlog.FromContext(ctx)
	for _, g := range gpus {
		if g.PCIBusID == "" {
			return fmt.Errorf("cannot reset %s: no PCI bus ID", g.Describe())
		}
		out, err := h.host(ctx, "nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader", "-i", g.PCIBusID)
		if err != nil {
			return fmt.Errorf("listing the processes on GPU %s: %w", g.PCIBusID, err)
		}
		if pids := strings.Fields(out); len(pids) > 0 {
			return fmt.Errorf("GPU %s is in use by processes %s: not reset", g.PCIBusID, strings.Join(pids, ", "))
		}
	}
	var stopped []string
	defer func() {
		for _, u := range stopped {
			log.Info("running host action", "unit", u, "step", "start")
			err = errors.Join(err, h.systemctl(ctx, "start", u))
		}
	}()
	for _, u := range GPUHolderUnits {
		if out, err := h.host(ctx, "systemctl", "is-active", u); err != nil || strings.TrimSpace(out) != "active" {
			continue
		}
		log.Info("running host action", "unit", u, "step", "stop")
		if err := h.systemctl(ctx, "stop", u); err != nil {
			return err
		}
		stopped = append(stopped, u)
	}
	var errs []error
	for _, g := range gpus {
		log.Info("running host action", "gpu", g.PCIBusID, "step", "reset")
		if _, err := h.host(ctx, "nvidia-smi", "--gpu-reset", "-i", g.PCIBusID); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// healthQuery is what the Health validation asks nvidia-smi of one GPU.
const healthQuery = "pci.bus_id,ecc.errors.uncorrected.volatile.total,retired_pages.pending,remapped_rows.failure"

// validateGPUs proves that each GPU works, read-only: Health asks the
// driver about that exact GPU (it answers, no uncorrectable ECC error since
// the reset, no retired page pending, no failed row remap); Diagnostic
// then runs DCGM's quick diagnostic on it (dcgmi diag -r 1). Every GPU is
// validated; the errors name each one that failed.
func (h HostExecutor) validateGPUs(ctx context.Context, gpus []repairv1.GPURef, level repairv1.GPUValidationLevel) error {
	if len(gpus) == 0 {
		return errors.New("no GPU to validate (the repair names none)")
	}
	log := crlog.FromContext(ctx)
	var errs []error
	for _, g := range gpus {
		if g.PCIBusID == "" {
			errs = append(errs, fmt.Errorf("cannot validate %s: no PCI bus ID", g.Describe()))
			continue
		}
		log.Info("running host action", "gpu", g.PCIBusID, "step", "validate", "level", level)
		out, err := h.host(ctx, "nvidia-smi", "--query-gpu="+healthQuery, "--format=csv,noheader,nounits", "-i", g.PCIBusID)
		if err != nil {
			errs = append(errs, fmt.Errorf("GPU %s: the driver does not answer for it: %w", g.PCIBusID, err))
			continue
		}
		if err := GPUHealth(out); err != nil {
			errs = append(errs, fmt.Errorf("GPU %s: %w", g.PCIBusID, err))
			continue
		}
		if level != repairv1.GPUValidationDiagnostic {
			continue
		}
		idx, err := h.host(ctx, "nvidia-smi", "--query-gpu=index", "--format=csv,noheader", "-i", g.PCIBusID)
		if err != nil {
			errs = append(errs, fmt.Errorf("GPU %s: its index: %w", g.PCIBusID, err))
			continue
		}
		out, err = h.host(ctx, "dcgmi", "diag", "-r", "1", "-i", strings.TrimSpace(idx))
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("GPU %s: DCGM diagnostic (dcgmi diag -r 1) failed: %w (%s)", g.PCIBusID, err, lastLines(out, 3)))
		case strings.Contains(out, "Fail"):
			errs = append(errs, fmt.Errorf("GPU %s: DCGM diagnostic (dcgmi diag -r 1) reports a failure: %s", g.PCIBusID, lastLines(out, 3)))
		}
	}
	return errors.Join(errs...)
}

// GPUHealth reads nvidia-smi's answer to the health query (CSV, no
// header, no units; "[N/A]" where the GPU has no such feature): an error
// says what is wrong.
func GPUHealth(csv string) error {
	fields := strings.Split(strings.TrimSpace(csv), ",")
	if len(fields) != 4 || strings.TrimSpace(fields[0]) == "" {
		return fmt.Errorf("unexpected answer from nvidia-smi: %q", strings.TrimSpace(csv))
	}
	for i := range fields {
		fields[i] = strings.TrimSpace(fields[i])
	}
	var problems []string
	for _, v := range fields[1:] {
		// nvidia-smi's placeholders ([N/A], [Not Supported], …) mean no
		// value, but one that says the GPU needs a reset.
		if strings.EqualFold(v, "[GPU requires reset]") {
			return errors.New("nvidia-smi says the GPU requires a reset")
		}
	}
	if v := fields[1]; !strings.HasPrefix(v, "[") && v != "0" {
		problems = append(problems, "uncorrectable ECC errors since the reset: "+v)
	}
	if strings.EqualFold(fields[2], "Yes") {
		problems = append(problems, "retired pages pending")
	}
	if strings.EqualFold(fields[3], "Yes") {
		problems = append(problems, "a row remap failed")
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, ", "))
	}
	return nil
}

// lastLines is the last n lines of s, on one line.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

func (h HostExecutor) restart(ctx context.Context, unit string) error {
	crlog.FromContext(ctx).Info("running host action", "unit", unit)
	return h.systemctl(ctx, "restart", unit)
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
		crlog.FromContext(ctx).Info("running host action", "sandbox", id)
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
		cmd := name + " " + strings.Join(args, " ")
		if o := trimOutput(out); o != "" {
			return out, fmt.Errorf("%s: %w: %s", cmd, err, o)
		}
		return out, fmt.Errorf("%s: %w", cmd, err)
	}
	return out, nil
}

// maxOutput bounds the command output an error carries.
const maxOutput = 1024

// trimOutput returns a command's output without surrounding space, and
// only its last maxOutput bytes (where the error usually is).
func trimOutput(out string) string {
	out = strings.TrimSpace(out)
	if len(out) <= maxOutput {
		return out
	}
	return "…" + strings.ToValidUTF8(out[len(out)-maxOutput:], "")
}
