// Command scalereport gathers what `make bench-scale` measured into one
// report, results/scale-<N/1000>k.{json,md}: the operator at rest
// (rest-<N>.json), the maintenance rollout (scale-<N>.json), the GPU stack
// (gpustack-<G>.json: the ClusterPolicy to ready and a driver upgrade, at
// -gpustack-nodes), the GPU fault burst (burst-<N>.json), the node
// agents' load (agentload-*.json) and the decision cores' benchmark lines
// (bench-scale.txt). A part that did not run is left out and named.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	dir := flag.String("dir", "results", "directory of the reports")
	nodes := flag.Int("nodes", 10000, "the fleet size of the run (SCALE_NODES)")
	stackNodes := flag.Int("gpustack-nodes", 0, "the fleet size of the GPU stack part (GPUSTACK_NODES; 0: -nodes)")
	flag.Parse()
	if *stackNodes == 0 {
		*stackNodes = *nodes
	}
	if err := run(*dir, *nodes, *stackNodes); err != nil {
		fmt.Fprintln(os.Stderr, "scalereport:", err)
		os.Exit(1)
	}
}

// report is what scale-<k>k.json holds: each part as its benchmark wrote it.
type report struct {
	Nodes       int               `json:"nodes"`
	Rest        json.RawMessage   `json:"operatorAtRest,omitempty"`
	Maintenance json.RawMessage   `json:"maintenanceRollout,omitempty"`
	GPUStack    json.RawMessage   `json:"gpuStack,omitempty"`
	FaultBurst  json.RawMessage   `json:"gpuFaultBurst,omitempty"`
	Agents      json.RawMessage   `json:"agentLoad,omitempty"`
	Cores       map[string]string `json:"decisionCores,omitempty"`
	Missing     []string          `json:"missing,omitempty"`
}

func run(dir string, nodes, stackNodes int) error {
	r := report{Nodes: nodes, Cores: map[string]string{}}
	read := func(part, name string) json.RawMessage {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			r.Missing = append(r.Missing, part+" ("+name+")")
			return nil
		}
		return data
	}
	r.Rest = read("operator at rest", fmt.Sprintf("rest-%d.json", nodes))
	r.Maintenance = read("maintenance rollout", fmt.Sprintf("scale-%d.json", nodes))
	r.GPUStack = read("GPU stack", fmt.Sprintf("gpustack-%d.json", stackNodes))
	r.FaultBurst = read("GPU fault burst", fmt.Sprintf("burst-%d.json", nodes))
	if agents, _ := filepath.Glob(filepath.Join(dir, "agentload-*.json")); len(agents) > 0 {
		sort.Strings(agents)
		r.Agents = read("agent load", filepath.Base(agents[len(agents)-1]))
	} else {
		r.Missing = append(r.Missing, "agent load (agentload-*.json)")
	}
	if f, err := os.Open(filepath.Join(dir, "bench-scale.txt")); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if fields := strings.Fields(sc.Text()); len(fields) > 2 && strings.HasPrefix(fields[0], "Benchmark") &&
				!strings.HasPrefix(fields[0], "BenchmarkOperatorMemory") && !strings.HasPrefix(fields[0], "BenchmarkScaleRollout") &&
				!strings.HasPrefix(fields[0], "BenchmarkAgentAPILoad") && !strings.HasPrefix(fields[0], "BenchmarkClusterPolicyScale") &&
				!strings.HasPrefix(fields[0], "BenchmarkGPUFaultBurst") {
				r.Cores[fields[0]] = strings.Join(fields[2:], " ")
			}
		}
		_ = f.Close()
	} else {
		r.Missing = append(r.Missing, "decision cores (bench-scale.txt)")
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	base := filepath.Join(dir, fmt.Sprintf("scale-%dk", nodes/1000))
	if err := os.WriteFile(base+".json", append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.WriteFile(base+".md", []byte(markdown(dir, r, stackNodes)), 0o644)
}

// markdown puts the parts' own markdown reports one after the other, with
// the decision cores' lines first.
func markdown(dir string, r report, stackNodes int) string {
	var s strings.Builder
	fmt.Fprintf(&s, "# gpufleet at %d nodes\n\n", r.Nodes)
	if len(r.Missing) > 0 {
		fmt.Fprintf(&s, "Not measured in this run: %s.\n\n", strings.Join(r.Missing, "; "))
	}
	if len(r.Cores) > 0 {
		s.WriteString("## Decision cores (one pass)\n\n| benchmark | result |\n|---|---|\n")
		names := make([]string, 0, len(r.Cores))
		for n := range r.Cores {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			fmt.Fprintf(&s, "| %s | %s |\n", n, r.Cores[n])
		}
		s.WriteString("\n")
	}
	for _, part := range []struct{ title, file string }{
		{"Operator at rest", fmt.Sprintf("rest-%d.md", r.Nodes)},
		{"Maintenance rollout", fmt.Sprintf("scale-%d.md", r.Nodes)},
		{fmt.Sprintf("GPU stack (%d nodes)", stackNodes), fmt.Sprintf("gpustack-%d.md", stackNodes)},
		{"GPU fault burst", fmt.Sprintf("burst-%d.md", r.Nodes)},
	} {
		if data, err := os.ReadFile(filepath.Join(dir, part.file)); err == nil {
			fmt.Fprintf(&s, "## %s\n\n%s\n", part.title, demote(string(data)))
		}
	}
	if agents, _ := filepath.Glob(filepath.Join(dir, "agentload-*.md")); len(agents) > 0 {
		sort.Strings(agents)
		if data, err := os.ReadFile(agents[len(agents)-1]); err == nil {
			fmt.Fprintf(&s, "## Node agents\n\n%s\n", demote(string(data)))
		}
	}
	return s.String()
}

// demote turns a part's headings into subheadings.
func demote(md string) string {
	lines := strings.Split(md, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "#") {
			lines[i] = "##" + l
		}
	}
	return strings.Join(lines, "\n")
}
