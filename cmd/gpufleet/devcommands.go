//go:build !release

package main

import "github.com/spf13/cobra"

// devCommands are the development commands: gpufleet dev (the local
// cluster with simulated GPU nodes) and gpufleet sim (fault injection into
// it). The released binary, built with the release tag (make image), has
// neither, and links no local control plane or simulator
// (TestReleaseBinaryLinksNoDevelopmentCode).
func devCommands() []*cobra.Command { return []*cobra.Command{newDevCommand(), newSimCommand()} }
