// Package version carries the build's version, stamped by the Makefile with
// -ldflags "-X github.com/gpufleet/gpufleet/internal/version.Version=...".
package version

import (
	"fmt"
	"runtime"
)

// Version and Commit are set at build time.
var (
	Version = "dev"
	Commit  = "unknown"
)

// String is the human-readable version line.
func String() string {
	return fmt.Sprintf("gpufleet %s (commit %s, %s)", Version, Commit, runtime.Version())
}
