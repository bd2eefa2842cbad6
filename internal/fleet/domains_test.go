package fleet

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
	"github.com/gpufleet/gpufleet/internal/testobj"
)

const (
	cliqueLabel = "nvidia.com/gpu.clique"
	trainUID    = "0b6c1f0e-5c3a-4d1e-9a57-2f1d6f6f2a01"
	evalUID     = "7d0e2c7a-3b9b-4c55-8c0f-6e4d1b1c9f02"
)

func inDomain(d string) testobj.NodeOption { return testobj.Labels(map[string]string{cliqueLabel: d}) }

func runs(uid string) testobj.NodeOption {
	return testobj.Labels(map[string]string{LabelComputeDomain: uid})
}

func domainsConfig() *maintenancev1.MaintenanceOperatorConfig {
	return &maintenancev1.MaintenanceOperatorConfig{
		ObjectMeta: metav1.ObjectMeta{Namespace: "gpufleet-system", Name: maintenancev1.DefaultConfigName},
		Spec:       maintenancev1.MaintenanceOperatorConfigSpec{Domains: &maintenancev1.MaintenanceDomains{NodeLabel: cliqueLabel}},
	}
}

func computeDomain(ns, name, uid string) *metav1.PartialObjectMetadata {
	return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)}}
}

// domainsSnapshot: rack-1 is split across pool-a and pool-b, has a node in
// maintenance (disrupted), one waiting for it, and ComputeDomain ml/train
// on two nodes; rack-2 runs a ComputeDomain whose name is unknown (its
// UID is shown); gpu-006 has an empty domain label and, with cpu-000 and
// gpu-005, is in no domain.
func domainsSnapshot() *Snapshot {
	return &Snapshot{
		Nodes: []*corev1.Node{
			node("gpu-000", "pool-a", stack(4), inDomain("rack-1"), runs(trainUID)),
			node("gpu-001", "pool-a", stack(4), inDomain("rack-1"), runs(trainUID), cordoned),
			node("gpu-002", "pool-b", stack(4), inDomain("rack-1")),
			node("gpu-003", "pool-b", stack(4), inDomain("rack-2"), runs(evalUID)),
			node("gpu-004", "pool-b", stack(4), inDomain("rack-2"), notReady),
			node("gpu-005", "pool-c", stack(4)),
			node("gpu-006", "pool-c", stack(4), inDomain("")),
			node("cpu-000", "", func(n *corev1.Node) { n.Status.Capacity, n.Status.Allocatable = nil, nil }),
		},
		Pods: []*corev1.Pod{gpuPod("ml", "train-0", "gpu-000", 8), gpuPod("ml", "eval-0", "gpu-003", 4)},
		Maintenances: []*maintenancev1.NodeMaintenance{
			nm("upgrade-1", "gpu-001", "gpu-operator.gpufleet.dev", maintenancev1.PhaseReady, "", 20*time.Minute),
			nm("upgrade-2", "gpu-002", "gpu-operator.gpufleet.dev", maintenancev1.PhasePending, "domain rack-1: waiting to co-schedule with gpu-001", 5*time.Minute),
		},
		Config:         domainsConfig(),
		ComputeDomains: []*metav1.PartialObjectMetadata{computeDomain("ml", "train", trainUID)},
		Unavailable:    map[Kind]string{},
	}
}

func TestDomains(t *testing.T) {
	train := ComputeDomainRef{UID: trainUID, Name: "ml/train"}
	eval := ComputeDomainRef{UID: evalUID}
	rack1 := Domain{Name: "rack-1", Nodes: 3, Pools: []string{"pool-a", "pool-b"}, ReadyForWork: 2, InMaintenance: 1, PendingMaintenance: 1,
		Disrupted: true, GPUs: 24, GPUsInUse: 8, ComputeDomains: []ComputeDomainUse{{ComputeDomainRef: train, Nodes: 2}}}
	rack2 := Domain{Name: "rack-2", Nodes: 2, Pools: []string{"pool-b"}, ReadyForWork: 1, GPUs: 16, GPUsInUse: 4,
		ComputeDomains: []ComputeDomainUse{{ComputeDomainRef: eval, Nodes: 1}}}
	none := Domain{Name: "", Nodes: 3, Pools: []string{"pool-c", ""}, ReadyForWork: 3, GPUs: 16}
	tests := map[string]struct {
		snap        func() *Snapshot
		filter      Filter
		wantRows    []string // node@domain
		wantLabel   string
		wantDomains []Domain
		wantCD      map[string]*ComputeDomainRef
	}{
		"without a config: by name, no domains, the labels ignored": {
			snap: func() *Snapshot {
				s := domainsSnapshot()
				s.Config = nil
				return s
			},
			wantRows: []string{"cpu-000@", "gpu-000@", "gpu-001@", "gpu-002@", "gpu-003@", "gpu-004@", "gpu-005@", "gpu-006@"},
			wantCD:   map[string]*ComputeDomainRef{},
		},
		"a config without spec.domains: as without a config": {
			snap: func() *Snapshot {
				s := domainsSnapshot()
				s.Config.Spec.Domains = nil
				return s
			},
			wantRows: []string{"cpu-000@", "gpu-000@", "gpu-001@", "gpu-002@", "gpu-003@", "gpu-004@", "gpu-005@", "gpu-006@"},
			wantCD:   map[string]*ComputeDomainRef{},
		},
		"with domains: grouped by domain, nodes in no domain (or an empty label) last": {
			snap:        domainsSnapshot,
			wantRows:    []string{"gpu-000@rack-1", "gpu-001@rack-1", "gpu-002@rack-1", "gpu-003@rack-2", "gpu-004@rack-2", "cpu-000@", "gpu-005@", "gpu-006@"},
			wantLabel:   cliqueLabel,
			wantDomains: []Domain{rack1, rack2, none},
			wantCD:      map[string]*ComputeDomainRef{"gpu-000": &train, "gpu-001": &train, "gpu-003": &eval},
		},
		"the ComputeDomains' names unknown: their UIDs": {
			snap: func() *Snapshot {
				s := domainsSnapshot()
				s.ComputeDomains = nil
				return s
			},
			wantRows:  []string{"gpu-000@rack-1", "gpu-001@rack-1", "gpu-002@rack-1", "gpu-003@rack-2", "gpu-004@rack-2", "cpu-000@", "gpu-005@", "gpu-006@"},
			wantLabel: cliqueLabel,
			wantDomains: func() []Domain {
				r1 := rack1
				r1.ComputeDomains = []ComputeDomainUse{{ComputeDomainRef: ComputeDomainRef{UID: trainUID}, Nodes: 2}}
				return []Domain{r1, rack2, none}
			}(),
			wantCD: map[string]*ComputeDomainRef{"gpu-000": {UID: trainUID}, "gpu-001": {UID: trainUID}, "gpu-003": &eval},
		},
		"one pool: a domain split across pools is summarised in full": {
			snap:        domainsSnapshot,
			filter:      Filter{Pools: []string{"pool-b"}},
			wantRows:    []string{"gpu-002@rack-1", "gpu-003@rack-2", "gpu-004@rack-2"},
			wantLabel:   cliqueLabel,
			wantDomains: []Domain{rack1, rack2},
			wantCD:      map[string]*ComputeDomainRef{"gpu-003": &eval},
		},
		"by state: ordered within each domain": {
			snap:        domainsSnapshot,
			filter:      Filter{SortBy: SortByState},
			wantRows:    []string{"gpu-001@rack-1", "gpu-000@rack-1", "gpu-002@rack-1", "gpu-004@rack-2", "gpu-003@rack-2", "cpu-000@", "gpu-005@", "gpu-006@"},
			wantLabel:   cliqueLabel,
			wantDomains: []Domain{rack1, rack2, none},
			wantCD:      map[string]*ComputeDomainRef{"gpu-000": &train, "gpu-001": &train, "gpu-003": &eval},
		},
		"problems only: the domains of the nodes left": {
			snap:        domainsSnapshot,
			filter:      Filter{Problems: true},
			wantRows:    []string{"gpu-001@rack-1", "gpu-004@rack-2"},
			wantLabel:   cliqueLabel,
			wantDomains: []Domain{rack1, rack2},
			wantCD:      map[string]*ComputeDomainRef{"gpu-001": &train},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := Build(tc.snap(), now)
			if err := tc.filter.Apply(f); err != nil {
				t.Fatal(err)
			}
			var rows []string
			cds := map[string]*ComputeDomainRef{}
			for _, r := range f.Rows {
				rows = append(rows, r.Node+"@"+r.Domain)
				if r.ComputeDomain != nil {
					cds[r.Node] = r.ComputeDomain
				}
			}
			if d := cmp.Diff(tc.wantRows, rows); d != "" {
				t.Errorf("rows (-want +got):\n%s", d)
			}
			if f.DomainLabel != tc.wantLabel {
				t.Errorf("domain label %q, want %q", f.DomainLabel, tc.wantLabel)
			}
			if d := cmp.Diff(tc.wantDomains, f.Domains); d != "" {
				t.Errorf("domains (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.wantCD, cds); d != "" {
				t.Errorf("ComputeDomains (-want +got):\n%s", d)
			}
		})
	}
}

func TestWorkloadCell(t *testing.T) {
	tests := map[string]struct {
		uses []ComputeDomainUse
		want string
	}{
		"none":    {nil, "-"},
		"named":   {[]ComputeDomainUse{{ComputeDomainRef: ComputeDomainRef{UID: trainUID, Name: "ml/train"}, Nodes: 18}}, "ComputeDomain ml/train on 18 node(s)"},
		"unnamed": {[]ComputeDomainUse{{ComputeDomainRef: ComputeDomainRef{UID: evalUID}, Nodes: 1}}, "ComputeDomain " + evalUID + " on 1 node(s)"},
		"two": {[]ComputeDomainUse{{ComputeDomainRef: ComputeDomainRef{Name: "ml/a"}, Nodes: 9}, {ComputeDomainRef: ComputeDomainRef{Name: "ml/b"}, Nodes: 9}},
			"ComputeDomain ml/a on 9 node(s), ml/b on 9 node(s)"},
	}
	for name, tc := range tests {
		if got := WorkloadCell(tc.uses); got != tc.want {
			t.Errorf("%s: %q, want %q", name, got, tc.want)
		}
	}
}

// TestDomainLabelsWithoutConfigChangeNothing: without spec.domains, nodes
// labelled with a domain and a ComputeDomain print exactly as unlabelled
// ones, in every format.
func TestDomainLabelsWithoutConfigChangeNothing(t *testing.T) {
	plain := fleetSnapshot()
	labelled := fleetSnapshot()
	for i, n := range labelled.Nodes {
		n.Labels[cliqueLabel] = fmt.Sprintf("rack-%d", i%3)
		n.Labels[LabelComputeDomain] = trainUID
	}
	labelled.Config = domainsConfig()
	labelled.Config.Spec.Domains = nil
	labelled.ComputeDomains = []*metav1.PartialObjectMetadata{computeDomain("ml", "train", trainUID)}
	for _, output := range []string{OutputTable, OutputWide, OutputJSON, OutputYAML} {
		var want, got bytes.Buffer
		if err := Write(&want, &want, Build(plain, now), output, now); err != nil {
			t.Fatal(err)
		}
		if err := Write(&got, &got, Build(labelled, now), output, now); err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(want.String(), got.String()); d != "" {
			t.Errorf("-o %q differs (-without labels +with):\n%s", output, d)
		}
	}
}

func TestDomainsGolden(t *testing.T) {
	for name, output := range map[string]string{"status-domains.golden": OutputTable, "status-domains-wide.golden": OutputWide, "status-domains.json.golden": OutputJSON} {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			if err := Write(&out, &out, Build(domainsSnapshot(), now), output, now); err != nil {
				t.Fatal(err)
			}
			golden(t, name, out.Bytes())
		})
	}
}

func TestExplainShowsTheDomain(t *testing.T) {
	tests := map[string]struct {
		snap     *Snapshot
		node     string
		want     []string
		dontWant []string
	}{
		"a node of a domain running a ComputeDomain": {
			snap: domainsSnapshot(), node: "gpu-001",
			want: []string{"\nDomain: rack-1\n", "\nComputeDomain: ml/train (its workload runs on the node: label resource.nvidia.com/computeDomain)\n"},
		},
		"a node in no domain":  {snap: domainsSnapshot(), node: "gpu-005", dontWant: []string{"Domain:"}},
		"without spec.domains": {snap: func() *Snapshot { s := domainsSnapshot(); s.Config = nil; return s }(), node: "gpu-001", dontWant: []string{"Domain:"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			st, err := Explain(tc.snap, tc.node, now)
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if err := WriteStory(&out, st, now); err != nil {
				t.Fatal(err)
			}
			// Each line with its runs of blanks as one space.
			var lines []string
			for _, l := range strings.Split(out.String(), "\n") {
				lines = append(lines, strings.Join(strings.Fields(l), " "))
			}
			flat := strings.Join(lines, "\n")
			for _, w := range tc.want {
				if !strings.Contains(flat, w) {
					t.Errorf("the story lacks %q:\n%s", w, out.String())
				}
			}
			for _, w := range tc.dontWant {
				if strings.Contains(flat, w) {
					t.Errorf("the story has %q:\n%s", w, out.String())
				}
			}
		})
	}
}

func TestConfigUnreadable(t *testing.T) {
	gr := schema.GroupResource{Group: maintenancev1.GroupVersion.Group, Resource: "maintenanceoperatorconfigs"}
	tests := map[string]struct {
		err     error
		wantWhy string
		wantErr bool
	}{
		"read":                    {err: nil},
		"no config named default": {err: apierrors.NewNotFound(gr, "default")},
		"the CRD not installed":   {err: &meta.NoKindMatchError{GroupKind: schema.GroupKind{Group: gr.Group, Kind: "MaintenanceOperatorConfig"}}},
		"forbidden":               {err: apierrors.NewForbidden(gr, "default", errors.New("no")), wantWhy: "forbidden to you by RBAC; nodes are not grouped by NVLink domain"},
		"another error":           {err: apierrors.NewServiceUnavailable("etcd"), wantErr: true},
	}
	for name, tc := range tests {
		why, err := ConfigUnreadable(tc.err)
		if why != tc.wantWhy || (err != nil) != tc.wantErr {
			t.Errorf("%s: (%q, %v), want (%q, error %t)", name, why, err, tc.wantWhy, tc.wantErr)
		}
	}
}
