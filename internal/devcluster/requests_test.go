package devcluster_test

import (
	"os"
	"testing"

	"github.com/gpufleet/gpufleet/internal/devcluster"
)

func TestFormatCountsLine(t *testing.T) {
	if got := devcluster.FormatCountsLine(map[string]int{"WATCH nodes": 2, "GET pods": 1}, "none"); got != "GET pods 1, WATCH nodes 2" {
		t.Errorf("got %q", got)
	}
	if got := devcluster.FormatCountsLine(nil, "none"); got != "none" {
		t.Errorf("no counts: got %q, want none", got)
	}
}

// TestCPUTimeOf: this process has used CPU; a process that does not exist
// has none.
func TestCPUTimeOf(t *testing.T) {
	sum := 0
	for tries := 0; devcluster.CPUTimeOf(os.Getpid()) == 0; tries++ {
		if tries == 1000 {
			t.Fatal("this process's CPU time reads 0")
		}
		for i := range 1 << 20 { // burn a little CPU until a tick counts
			sum += i
		}
	}
	_ = sum
	if got := devcluster.CPUTimeOf(1 << 30); got != 0 {
		t.Errorf("a process that does not exist: %s", got)
	}
}
