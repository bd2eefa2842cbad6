//go:build image

package image

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestNsenterEntersNamespaces runs the image's /usr/bin/nsenter as the node
// agent does (--target PID --mount --uts --ipc --net --pid -- PROGRAM) into
// a process with its own mount, UTS and PID namespaces, standing in for the
// host's PID 1: the program runs with that process's mounts (a tmpfs only
// it has), host name and PID numbering, and nsenter exits with the
// program's status. Entering namespaces needs root (CAP_SYS_ADMIN), as the
// agent's pod has.
func TestNsenterEntersNamespaces(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("entering namespaces needs root (CAP_SYS_ADMIN): run make test-image as root")
	}
	nsenter := extract(t, "/usr/bin/nsenter")

	// The target: a shell in new namespaces that mounts a tmpfs (private,
	// so the caller's mount namespace never sees it), writes a marker and
	// sleeps.
	dir := t.TempDir()
	mnt, ready := filepath.Join(dir, "mnt"), filepath.Join(dir, "ready")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	script := `mount --make-rprivate / && mount -t tmpfs gpufleet-test "$1" && echo inside > "$1/marker" && hostname gpufleet-ns-test && : > "$2" && exec sleep 120`
	target := exec.Command("sh", "-c", script, "sh", mnt, ready)
	target.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS | syscall.CLONE_NEWPID | syscall.CLONE_NEWIPC}
	var targetOut bytes.Buffer
	target.Stdout, target.Stderr = &targetOut, &targetOut
	if err := target.Start(); err != nil {
		t.Fatalf("starting a process in new namespaces: %v", err)
	}
	t.Cleanup(func() {
		_ = target.Process.Kill()
		_ = target.Wait()
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		// The ready file is written inside the new mount namespace but
		// outside the tmpfs, so the caller sees it.
		if _, err := os.Stat(ready); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the target process never got ready: %s", targetOut.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(mnt, "marker")); err == nil {
		t.Fatal("the target's tmpfs is visible outside its mount namespace: the test would prove nothing")
	}

	pid := strconv.Itoa(target.Process.Pid)
	run := func(args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(nsenter, append([]string{"--target", pid, "--mount", "--uts", "--ipc", "--net", "--pid", "--"}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				return string(out), exit.ExitCode()
			}
			t.Fatalf("nsenter %v: %v", args, err)
		}
		return string(out), 0
	}

	out, code := run("sh", "-c", `cat "$1/marker"; hostname; echo "$$"`, "sh", mnt)
	fields := strings.Fields(out)
	if code != 0 || len(fields) != 3 {
		t.Fatalf("nsenter exited %d: %q", code, out)
	}
	if fields[0] != "inside" {
		t.Errorf("the program did not see the target's mounts: marker %q", fields[0])
	}
	if fields[1] != "gpufleet-ns-test" {
		t.Errorf("the program's host name is %q, not the target's", fields[1])
	}
	// The target's shell is PID 1 of its namespace (exec'd into sleep);
	// the program is a later, small PID there, not its PID outside.
	if n, err := strconv.Atoi(fields[2]); err != nil || n <= 1 || n > 100 {
		t.Errorf("the program's PID is %q, not one of the target's PID namespace", fields[2])
	}

	if _, code := run("sh", "-c", "exit 7"); code != 7 {
		t.Errorf("nsenter exited %d for a program that exited 7", code)
	}
	if out, code := run("gpufleet-no-such-program"); code != 127 {
		t.Errorf("nsenter exited %d for a program that does not exist, want 127: %s", code, out)
	}
	if out, code := run(); code != 1 || !strings.Contains(out, "no program") {
		t.Errorf("nsenter without a program exited %d: %s", code, out)
	}
}
