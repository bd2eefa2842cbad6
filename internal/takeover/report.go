package takeover

import (
	"cmp"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Write prints the plan for people: the same sections in the same order
// every time (a section with nothing in it says "none").
func (p Plan) Write(out io.Writer) error {
	var b strings.Builder
	from, to := p.Operator.Name, "gpufleet"
	if p.Direction.Back {
		from, to = to, from
	}
	fmt.Fprintf(&b, "takeover %s: %s -> %s\n", p.Direction, from, to)
	if p.Own != nil {
		fmt.Fprintf(&b, "gpufleet: %s (%s)\n", p.Own, replicas(p.Own.Replicas))
	}
	if p.Policy != "" {
		fmt.Fprintf(&b, "ClusterPolicy %s, its stack in namespace %s\n", p.Policy, p.StackNamespace)
	}
	if p.GPUCluster != "" {
		fmt.Fprintf(&b, "GPUCluster %s (NVIDIA's DRA driver), its stack in namespace %s\n", p.GPUCluster, p.StackNamespace)
	}

	section(&b, "Stop first")
	for _, w := range p.Stop {
		fmt.Fprintf(&b, "  %s (%s)\n    %s\n", w, replicas(w.Replicas), w.ScaleCommand(0))
	}
	if h := p.StopLease; h != nil {
		fmt.Fprintf(&b, "  wait until lease %s/%s is free (held by %s, renewed until %s)\n",
			h.Namespace, h.Operator.Lease, h.Holder, h.Until.UTC().Format(time.RFC3339))
	}
	if len(p.Stop) == 0 && p.StopLease == nil {
		b.WriteString("  none (stopped)\n")
	}

	section(&b, "Then start")
	for _, w := range p.Start {
		fmt.Fprintf(&b, "  %s (0 replicas)\n    %s\n", w, w.ScaleCommand(w.RestoreReplicas()))
	}
	none(&b, len(p.Start))

	if p.Direction.Operator == GPUOperator {
		title := "Adopted (no restart)"
		if p.Direction.Back {
			title = "Handed back (no restart)"
		}
		daemonSets(&b, title, p.Adopted, false)
		daemonSets(&b, "Restarts", p.Restarts, true)
		if !p.Direction.Back {
			lines(&b, "New DaemonSets", p.New)
			lines(&b, "Blocked", p.Blocked)
		}
	}
	if p.Direction.Operator == MaintenanceOperator {
		section(&b, "NodeMaintenance in flight")
		for _, f := range p.InFlight {
			fin := "no finalizer"
			if len(f.Finalizers) > 0 {
				fin = "finalizers " + strings.Join(f.Finalizers, ", ")
			}
			deleting := ""
			if f.Deleting {
				deleting = ", being deleted"
			}
			fmt.Fprintf(&b, "  %-22s %s (node %s, requestor %s, %s%s)\n", string(f.Phase)+":", f.Key, f.Node, f.Requestor, fin, deleting)
		}
		none(&b, len(p.InFlight))
		if len(p.InFlight) > 0 {
			to := "gpufleet"
			if p.Direction.Back {
				to = p.Operator.Name
			}
			fmt.Fprintf(&b, "  %s continues each from its phase (the Ready condition's reason), with the same finalizer\n", to)
		}
	}
	lines(&b, "Notes", p.Notes)
	lines(&b, "Problems", p.Problems)
	_, err := io.WriteString(out, b.String())
	return err
}

func section(b *strings.Builder, title string) { fmt.Fprintf(b, "\n%s:\n", title) }

func none(b *strings.Builder, n int) {
	if n == 0 {
		b.WriteString("  none\n")
	}
}

func lines(b *strings.Builder, title string, ls []string) {
	section(b, title)
	for _, l := range ls {
		fmt.Fprintf(b, "  - %s\n", l)
	}
	none(b, len(ls))
}

func daemonSets(b *strings.Builder, title string, dss []DaemonSet, why bool) {
	section(b, title)
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	for _, d := range dss {
		line := fmt.Sprintf("  %s\t%s %s\t%d pods", d.Component, cmp.Or(d.Kind, "DaemonSet"), d.Name, d.Pods)
		if why {
			line += "\t" + d.Why
		}
		_, _ = fmt.Fprintln(tw, line) // a strings.Builder does not fail
	}
	_ = tw.Flush() // writes to a strings.Builder, which does not fail
	none(b, len(dss))
}

func replicas(n int32) string {
	if n == 1 {
		return "1 replica"
	}
	return fmt.Sprintf("%d replicas", n)
}
