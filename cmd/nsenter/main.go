// Command nsenter runs a program in the namespaces of another process: the
// part of util-linux's nsenter(1) that the node agent uses to run the host's
// own tools (systemctl, crictl, nvidia-smi) from its container,
//
//	nsenter --target 1 --mount --uts --ipc --net --pid -- systemctl restart kubelet
//
// The image ships it as /usr/bin/nsenter next to /gpufleet, so the agent
// needs nothing installed in the image: the programs it runs are the host's,
// found in the host's mount namespace (the agent's pod has hostPID, is
// privileged and runs as root). It is written in Go so that the image stays
// FROM scratch (a static binary, no libc, no shell).
//
// Options: -t/--target PID, -m/--mount, -u/--uts, -i/--ipc, -n/--net,
// -p/--pid, then the program and its arguments (after "--" or the first
// non-option). The exit status is the program's (128+n when killed by
// signal n, 127 when it is not found, 126 when it cannot run); nsenter's own
// errors exit with 1, like util-linux's.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// namespace is one kind of namespace that nsenter can enter.
type namespace struct {
	file string // under /proc/<pid>/ns/
	flag int    // CLONE_NEW*
}

// The order in which util-linux enters them: the mount namespace last but
// for time, so that /proc/<pid>/ns/* are all opened in the caller's.
var (
	ipcNS   = namespace{"ipc", unix.CLONE_NEWIPC}
	utsNS   = namespace{"uts", unix.CLONE_NEWUTS}
	netNS   = namespace{"net", unix.CLONE_NEWNET}
	pidNS   = namespace{"pid", unix.CLONE_NEWPID}
	mountNS = namespace{"mnt", unix.CLONE_NEWNS}
	order   = []namespace{ipcNS, utsNS, netNS, pidNS, mountNS}
)

// request is a parsed command line.
type request struct {
	target int
	enter  map[namespace]bool
	argv   []string
}

func main() {
	req, err := parse(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "nsenter: %v\nusage: nsenter --target PID [--mount] [--uts] [--ipc] [--net] [--pid] [--] PROGRAM [ARG...]\n", err)
		os.Exit(1)
	}
	code, err := run(req)
	if err != nil {
		fmt.Fprintf(os.Stderr, "nsenter: %v\n", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func parse(args []string) (request, error) {
	req := request{enter: map[namespace]bool{}}
	short := map[string]namespace{"-m": mountNS, "-u": utsNS, "-i": ipcNS, "-n": netNS, "-p": pidNS,
		"--mount": mountNS, "--uts": utsNS, "--ipc": ipcNS, "--net": netNS, "--pid": pidNS}
	target := ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			req.argv = args[i+1:]
			i = len(args)
		case a == "-t" || a == "--target":
			if i+1 == len(args) {
				return req, fmt.Errorf("%s needs a PID", a)
			}
			i++
			target = args[i]
		case strings.HasPrefix(a, "--target="):
			target = strings.TrimPrefix(a, "--target=")
		case strings.HasPrefix(a, "-") && a != "-":
			ns, ok := short[a]
			if !ok {
				return req, fmt.Errorf("unsupported option %q", a)
			}
			req.enter[ns] = true
		default:
			req.argv = args[i:]
			i = len(args)
		}
	}
	if target == "" {
		return req, errors.New("--target is required")
	}
	pid, err := strconv.Atoi(target)
	if err != nil || pid <= 0 {
		return req, fmt.Errorf("bad PID %q", target)
	}
	req.target = pid
	if len(req.enter) == 0 {
		return req, errors.New("no namespace to enter")
	}
	if len(req.argv) == 0 {
		return req, errors.New("no program to run")
	}
	return req, nil
}

// run enters the namespaces on this goroutine's thread and runs the
// program as its child, which inherits them. The thread stays locked: it no
// longer shares the process's namespaces, and the process exits after.
func run(req request) (int, error) {
	runtime.LockOSThread()
	var fds []int
	var kinds []namespace
	for _, ns := range order {
		if !req.enter[ns] {
			continue
		}
		p := fmt.Sprintf("/proc/%d/ns/%s", req.target, ns.file)
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return 0, fmt.Errorf("cannot open %s: %w", p, err)
		}
		fds = append(fds, fd)
		kinds = append(kinds, ns)
	}
	for i, ns := range kinds {
		if ns == mountNS {
			// The kernel refuses to change the mount namespace of a
			// thread that shares its root and working directory with
			// others (every thread of a Go program does).
			if err := unix.Unshare(unix.CLONE_FS); err != nil {
				return 0, fmt.Errorf("unshare(CLONE_FS): %w", err)
			}
		}
		if err := unix.Setns(fds[i], ns.flag); err != nil {
			return 0, fmt.Errorf("reassociate to namespace 'ns/%s' failed: %w", ns.file, err)
		}
		_ = unix.Close(fds[i])
	}
	// Looked up in the entered mount namespace: the host's PATH directories.
	cmd := exec.Command(req.argv[0], req.argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), nil
		}
		return exit.ExitCode(), nil
	}
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(os.Stderr, "nsenter: failed to execute %s: %v\n", req.argv[0], err)
		return 127, nil
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "nsenter: failed to execute %s: %v\n", req.argv[0], err)
		return 126, nil
	}
	return 0, nil
}
