package fleet

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/printers"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	nvidiav1 "github.com/gpufleet/gpufleet/api/nvidia/v1"
	repairv1 "github.com/gpufleet/gpufleet/api/repair/v1alpha1"
)

// Story is one node's story: its row now and what happened to it, newest
// first.
type Story struct {
	metav1.TypeMeta `json:",inline"`
	Row             Row      `json:"row"`
	Entries         []Entry  `json:"entries"`
	Notes           []string `json:"notes,omitempty"`
}

// Entry is one thing that happened to the node or to an object about it.
type Entry struct {
	Time metav1.Time `json:"time"`
	// Object is "Kind namespace/name" or "Kind name".
	Object  string `json:"object"`
	What    string `json:"what"`
	Warning bool   `json:"warning,omitempty"`
}

// ErrUnknownNode is returned by Explain for a node the snapshot lacks.
type ErrUnknownNode struct{ Node string }

func (e *ErrUnknownNode) Error() string { return fmt.Sprintf("node %q not found", e.Node) }

// Explain tells the story of node: its NodeMaintenance objects and their
// phases, its NodeRepairs and their timelines, its GPU faults, its GPU
// stack, its conditions, and the events of all of them (s.Events), newest
// first.
func Explain(s *Snapshot, node string, now time.Time) (*Story, error) {
	var n *corev1.Node
	for _, c := range s.Nodes {
		if c.Name == node {
			n = c
		}
	}
	if n == nil {
		return nil, &ErrUnknownNode{Node: node}
	}
	one := *s
	one.Nodes = []*corev1.Node{n}
	f := Build(&one, now)
	st := &Story{Row: f.Rows[0], Notes: f.Notes}
	st.SetGroupVersionKind(StoryGVK)
	add := func(t metav1.Time, object, what string, warning bool) {
		if !t.IsZero() {
			st.Entries = append(st.Entries, Entry{Time: t, Object: object, What: what, Warning: warning})
		}
	}
	nodeObj := "Node " + n.Name
	add(n.CreationTimestamp, nodeObj, "created", false)
	for _, c := range n.Status.Conditions {
		what := fmt.Sprintf("condition %s=%s", c.Type, c.Status)
		if c.Reason != "" {
			what += " (" + c.Reason + ")"
		}
		if c.Message != "" {
			what += ": " + c.Message
		}
		problem := (c.Type == corev1.NodeReady) != (c.Status == corev1.ConditionTrue)
		add(c.LastTransitionTime, nodeObj, what, problem)
	}
	for _, nm := range s.Maintenances {
		if nm.Spec.NodeName == node {
			maintenanceEntries(nm, add)
		}
	}
	for _, r := range s.Repairs {
		if r.Spec.NodeName == node {
			repairEntries(r, add)
		}
	}
	for _, g := range s.Faults {
		if g.Spec.NodeName == node {
			faultEntries(g, add)
		}
	}
	for _, p := range s.Pods {
		if p.Spec.NodeName != node || nvidiav1.PodComponent(p.Labels) == "" {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				add(c.LastTransitionTime, "Pod "+p.Namespace+"/"+p.Name,
					fmt.Sprintf("GPU stack %s pod Ready=%s", nvidiav1.PodComponent(p.Labels), c.Status), c.Status != corev1.ConditionTrue)
			}
		}
	}
	about := map[string]bool{"Node/" + node: true}
	for _, nm := range s.Maintenances {
		if nm.Spec.NodeName == node {
			about["NodeMaintenance/"+nm.Namespace+"/"+nm.Name] = true
		}
	}
	for _, r := range s.Repairs {
		if r.Spec.NodeName == node {
			about["NodeRepair/"+r.Name] = true
		}
	}
	for _, g := range s.Faults {
		if g.Spec.NodeName == node {
			about["GPUFault/"+g.Name] = true
		}
	}
	for _, e := range s.Events {
		io := e.InvolvedObject
		if !about[io.Kind+"/"+io.Name] && !about[io.Kind+"/"+io.Namespace+"/"+io.Name] {
			continue
		}
		t := eventTime(e)
		obj := e.InvolvedObject.Kind + " " + e.InvolvedObject.Name
		if e.InvolvedObject.Namespace != "" {
			obj = e.InvolvedObject.Kind + " " + e.InvolvedObject.Namespace + "/" + e.InvolvedObject.Name
		}
		what := "event " + e.Reason + ": " + e.Message
		if e.Count > 1 {
			what += fmt.Sprintf(" (×%d)", e.Count)
		}
		add(t, obj, what, e.Type == corev1.EventTypeWarning)
	}
	sort.SliceStable(st.Entries, func(i, j int) bool { return st.Entries[j].Time.Before(&st.Entries[i].Time) })
	return st, nil
}

func eventTime(e *corev1.Event) metav1.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp
	case !e.EventTime.IsZero():
		return metav1.NewTime(e.EventTime.Time)
	case e.Series != nil && !e.Series.LastObservedTime.IsZero():
		return metav1.NewTime(e.Series.LastObservedTime.Time)
	case !e.FirstTimestamp.IsZero():
		return e.FirstTimestamp
	}
	return e.CreationTimestamp
}

type addFunc func(t metav1.Time, object, what string, warning bool)

func maintenanceEntries(nm *maintenancev1.NodeMaintenance, add addFunc) {
	obj := "NodeMaintenance " + nm.Namespace + "/" + nm.Name
	what := "requested by " + nm.Spec.RequestorID
	if len(nm.Spec.AdditionalRequestors) > 0 {
		what += " (and " + strings.Join(nm.Spec.AdditionalRequestors, ", ") + ")"
	}
	var steps []string
	if nm.CordonRequested() {
		steps = append(steps, "cordon")
	}
	if nm.Spec.WaitForPodCompletion != nil {
		steps = append(steps, "wait for pods")
	}
	if nm.Spec.DrainSpec != nil {
		steps = append(steps, "drain")
	}
	if len(steps) > 0 {
		what += ": " + strings.Join(steps, ", ")
	}
	add(nm.CreationTimestamp, obj, what, false)
	if nm.Status.ScheduledTime != nil {
		add(*nm.Status.ScheduledTime, obj, "scheduled", false)
	}
	if nm.Status.WaitForCompletionStartTime != nil {
		add(*nm.Status.WaitForCompletionStartTime, obj, "waiting for pods to complete", false)
	}
	if d := nm.Status.Drain; d != nil && d.StartTime != nil {
		add(*d.StartTime, obj, fmt.Sprintf("drain started: %d of %d pods to evict (now %d%%)", d.EvictionPods, d.TotalPods, d.DrainProgress), false)
	}
	for _, c := range nm.Status.Conditions {
		what := ""
		switch c.Type {
		case maintenancev1.ConditionTypeReady:
			what = "phase " + c.Reason
		default:
			what = fmt.Sprintf("%s=%s", c.Type, c.Status)
			if c.Reason != "" {
				what += " (" + c.Reason + ")"
			}
		}
		if c.Message != "" {
			what += ": " + c.Message
		}
		warning := c.Type != maintenancev1.ConditionTypeReady && c.Status == metav1.ConditionTrue ||
			c.Reason == string(maintenancev1.PhaseRequestorFailed)
		add(c.LastTransitionTime, obj, what, warning)
	}
	if nm.DeletionTimestamp != nil {
		add(*nm.DeletionTimestamp, obj, "deleted: releasing the node", false)
	}
}

func repairEntries(r *repairv1.NodeRepair, add addFunc) {
	obj := "NodeRepair " + r.Name
	f := r.Spec.Fault
	what := fmt.Sprintf("fault %s: %s=%s", dash(f.Rule), f.ConditionType, f.Status)
	if f.Reason != "" {
		what += " (" + f.Reason + ")"
	}
	if f.Message != "" {
		what += ": " + f.Message
	}
	if len(r.Spec.GPUs) > 0 {
		var gpus []string
		for _, g := range r.Spec.GPUs {
			gpus = append(gpus, g.Describe())
		}
		what += "; " + strings.Join(gpus, ", ")
	}
	add(f.Since, obj, what, true)
	created := "repair created"
	switch {
	case r.Spec.DryRun:
		created = "dry run recorded"
	case r.Spec.IgnoreReason != "":
		created = "not repaired: " + r.Spec.IgnoreReason
	case len(r.Spec.Actions) > 0:
		var as []string
		for _, a := range r.Spec.Actions {
			as = append(as, string(a))
		}
		created += ": actions " + strings.Join(as, ", ")
	}
	add(r.CreationTimestamp, obj, created, false)
	for _, t := range r.Status.Timeline {
		what := t.Step + ": " + t.Outcome
		if t.Message != "" {
			what += ": " + t.Message
		}
		add(t.Time, obj, what, strings.Contains(strings.ToLower(t.Outcome), "fail"))
	}
}

func faultEntries(g *repairv1.GPUFault, add addFunc) {
	obj := "GPUFault " + g.Name
	for _, e := range g.Status.Faults {
		what := g.Spec.GPU.Describe() + ": "
		switch {
		case e.Code != 0:
			what += fmt.Sprintf("XID %d", e.Code)
		case e.Counter != "":
			what += e.Counter
		}
		what += " (" + string(e.Class) + ")"
		if e.Meaning != "" {
			what += " " + e.Meaning
		}
		if e.Count > 1 {
			what += fmt.Sprintf(", %d times since %s", e.Count, e.FirstSeen.UTC().Format(time.RFC3339))
		}
		if !e.Active {
			what += ", no longer active"
		}
		add(e.LastSeen, obj, what, e.Class.Repairs() && e.Active)
	}
}

// WriteStoryAs prints the story as text, or as JSON or YAML.
func WriteStoryAs(out io.Writer, st *Story, output string, now time.Time) error {
	switch output {
	case OutputJSON:
		return (&printers.JSONPrinter{}).PrintObj(st, out)
	case OutputYAML:
		return (&printers.YAMLPrinter{}).PrintObj(st, out)
	}
	return WriteStory(out, st, now)
}

// WriteStory prints the story: the node's row, then the entries.
func WriteStory(out io.Writer, st *Story, now time.Time) error {
	r := &st.Row
	tw := printers.GetNewTabWriter(out)
	w := &errWriter{w: tw}
	w.printf("Node:\t%s\n", r.Node)
	w.printf("Pool:\t%s\n", dash(r.Pool))
	if r.Domain != "" {
		w.printf("Domain:\t%s\n", oneLine(r.Domain))
	}
	if r.ComputeDomain != nil {
		w.printf("ComputeDomain:\t%s (its workload runs on the node: label %s)\n", oneLine(r.ComputeDomain.String()), LabelComputeDomain)
	}
	w.printf("State:\t%s\n", r.State)
	if len(r.Problems) > 0 {
		w.printf("Problems:\t%s\n", oneLine(strings.Join(r.Problems, "; ")))
	}
	w.printf("GPUs:\t%d capacity, %d allocatable, %s in use, %s faulty\n", r.GPUs.Capacity, r.GPUs.Allocatable, count(r.GPUs.InUse), count(r.GPUs.Faulty))
	w.printf("GPU stack:\t%s\n", StackCell(r.Stack, true))
	if r.DriverUpgrade != "" {
		w.printf("Driver upgrade:\t%s (node label %s)\n", r.DriverUpgrade, nvidiav1.LabelUpgradeState)
	}
	w.printf("Maintenance:\t%s\n", oneLine(MaintenanceCell(r.Maintenance)))
	w.printf("Repair:\t%s\n", oneLine(RepairCell(r.Repair, now)))
	w.printf("\nStory (newest first):\n")
	w.printf("TIME\tAGE\tOBJECT\tWHAT\n")
	for _, e := range st.Entries {
		mark := ""
		if e.Warning {
			mark = "! "
		}
		w.printf("%s\t%s\t%s\t%s%s\n", e.Time.UTC().Format(time.RFC3339), age(e.Time, now), e.Object, mark, oneLine(e.What))
	}
	if w.err != nil {
		return w.err
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	w = &errWriter{w: out}
	for _, n := range st.Notes {
		w.printf("note: %s\n", n)
	}
	return w.err
}

// errWriter keeps the first write error.
type errWriter struct {
	w   io.Writer
	err error
}

func (w *errWriter) printf(format string, args ...any) {
	if w.err == nil {
		_, w.err = fmt.Fprintf(w.w, format, args...)
	}
}

// oneLine keeps a message on one table line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
