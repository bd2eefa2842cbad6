package devcluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// process is one control-plane binary started by the cluster. Its output
// goes to a log file in the cluster's directory; it runs in its own process
// group and receives SIGKILL if the process that started it dies (so a test
// binary that panics leaves no orphan behind).
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	logFile *os.File
	done    chan struct{}
	waitErr error
}

func startProcess(name, binary string, args []string, dir string) (*process, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("creating log for %s: %w", name, err)
	}
	cmd := exec.Command(binary, args...)
	cmd.Stdout = f
	cmd.Stderr = f
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("starting %s (%s): %w", name, binary, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, logFile: f, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop asks the process to terminate, then kills its whole process group if
// it is still there after the grace period.
func (p *process) stop(grace time.Duration) {
	if p.exited() {
		return
	}
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
}

// logTail returns the last n lines of the process's log.
func (p *process) logTail(n int) string {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(log %s unreadable: %v)", p.logPath, err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// failure describes why a part did not come up, with the tail of its log.
func (p *process) failure(reason error) error {
	state := "still running"
	if p.exited() {
		state = fmt.Sprintf("exited: %v", p.waitErr)
	}
	return fmt.Errorf("%s did not become healthy (%s): %w\n--- last lines of %s ---\n%s",
		p.name, state, reason, p.logPath, p.logTail(30))
}

// waitHealthy polls url until it answers 200, the process exits or the
// context ends. client may carry client certificates.
func (p *process) waitHealthy(ctx context.Context, client *http.Client, url string) error {
	lastErr := errors.New("no answer yet")
	for {
		if p.exited() {
			return p.failure(lastErr)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return fmt.Errorf("health request for %s: %w", p.name, err)
		}
		resp, err := client.Do(req)
		if err == nil {
			var body bytes.Buffer
			_, _ = body.ReadFrom(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			lastErr = fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, lastLines(body.String(), 5))
		} else {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			return p.failure(fmt.Errorf("%w (last: %w)", ctx.Err(), lastErr))
		case <-p.done:
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "; ")
}

// insecureLoopbackClient talks to components that serve self-signed
// certificates on loopback (controller-manager, scheduler health ports).
func insecureLoopbackClient() *http.Client {
	return &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, //nolint:gosec // loopback health checks only
	}
}

// freePorts reserves n distinct free TCP ports on 127.0.0.1.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("reserving a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func hostPort(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// cpu is the user+system CPU time the process has used.
func (p *process) cpu() time.Duration { return CPUTimeOf(p.cmd.Process.Pid) }

// CPUTimeOf is the user+system CPU time process pid has used (Linux; 0
// where /proc cannot be read).
func CPUTimeOf(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) <= 12 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}
