// Command gpufleet-agent is the node agent alone (`gpufleet agent` of the
// gpufleet binary, without the operator, the development cluster and the
// fleet view): the agent DaemonSet runs it on every node, where the one
// gpufleet binary's pages would triple the agent's memory.
package main

import (
	"fmt"
	"os"

	"github.com/gpufleet/gpufleet/internal/agent/agentcmd"
	"github.com/gpufleet/gpufleet/internal/version"
)

func main() {
	cmd := agentcmd.NewCommand("gpufleet-agent")
	cmd.Version = version.String()
	cmd.SetVersionTemplate("{{.Version}}\n")
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	if err := cmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
