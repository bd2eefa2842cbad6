package devtest

import (
	"bufio"
	"os"
	"os/exec"
	"regexp"
	"sync"
	"testing"
	"time"
)

// fleetViewURL is how `gpufleet ui` says where it listens.
var fleetViewURL = regexp.MustCompile(`the fleet view is on (http://\S+/)`)

// StartFleetView runs `bin ui` against kubeconfig on a free loopback port
// and returns the page's URL and the process's pid once it listens (its
// caches synced); it fails tb when that takes longer than within. The
// process's output goes to tb's log; stop interrupts it and waits for it
// to end (at tb's cleanup at the latest).
func StartFleetView(tb testing.TB, bin, kubeconfig string, within time.Duration) (url string, pid int, stop func()) {
	tb.Helper()
	cmd := exec.Command(bin, "ui", "--kubeconfig", kubeconfig, "--address", "127.0.0.1:0")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("gpufleet ui: %v", err)
	}
	found := make(chan string, 1)
	read := make(chan struct{})
	go func() {
		defer close(read)
		lines := bufio.NewScanner(stderr)
		for lines.Scan() {
			tb.Log("gpufleet ui: ", lines.Text())
			if m := fleetViewURL.FindStringSubmatch(lines.Text()); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = cmd.Process.Signal(os.Interrupt)
			<-read // the output is read to its end before Wait closes it
			_ = cmd.Wait()
		})
	}
	tb.Cleanup(stop)
	select {
	case url = <-found:
		return url, cmd.Process.Pid, stop
	case <-time.After(within):
		tb.Fatalf("gpufleet ui did not start within %s", within)
	}
	return "", 0, stop
}
