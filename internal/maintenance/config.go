package maintenance

import (
	"errors"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	maintenancev1 "github.com/gpufleet/gpufleet/api/maintenance/v1alpha1"
)

// Config is a MaintenanceOperatorConfig read for the planner: limits,
// calendar and the pools' node selectors.
type Config struct {
	Limits Limits
	pools  []poolSelector
	// domainLabel names a node's domain (spec.domains.nodeLabel; "": none).
	domainLabel string
	// WaitForComputeDomains: spec.domains.waitForComputeDomains.
	WaitForComputeDomains bool
	// Generation of the object it was read from (0: no object, defaults).
	Generation int64
}

type poolSelector struct {
	name     string
	selector labels.Selector
}

// CompileConfig reads a config spec (nil: the defaults). Every problem the
// schema could not catch is reported, naming the field; a config with an
// error must not be applied.
func CompileConfig(spec *maintenancev1.MaintenanceOperatorConfigSpec) (Config, error) {
	if spec == nil {
		return Config{}, nil
	}
	var errs []error
	c := Config{Limits: Limits{
		MaxParallelOperations: spec.MaxParallelOperations, MaxUnavailable: spec.MaxUnavailable,
		UrgentScope: spec.UrgentMaintenance,
	}}
	// Percentages resolve within [0, total], so any total shows a bad value.
	if _, _, err := ResolveLimits(c.Limits, 100); err != nil {
		errs = append(errs, err)
	}
	cal, err := CompileCalendar(spec.MaintenanceWindows, spec.MaintenanceExclusions)
	if err != nil {
		errs = append(errs, err)
	}
	c.Limits.Calendar = cal
	seen := map[string]bool{}
	for i, p := range spec.Pools {
		field := fmt.Sprintf("pools[%d] (%s)", i, p.Name)
		if seen[p.Name] {
			errs = append(errs, fmt.Errorf("%s: duplicate pool name", field))
			continue
		}
		seen[p.Name] = true
		sel, err := metav1.LabelSelectorAsSelector(&p.NodeSelector)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: nodeSelector: %w", field, err))
			continue
		}
		pl := PoolLimits{Name: p.Name, MaxParallelOperations: p.MaxParallelOperations, MaxUnavailable: p.MaxUnavailable}
		if _, _, err := ResolveLimits(Limits{MaxParallelOperations: p.MaxParallelOperations, MaxUnavailable: p.MaxUnavailable}, 100); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", field, err))
			continue
		}
		c.pools = append(c.pools, poolSelector{name: p.Name, selector: sel})
		c.Limits.Pools = append(c.Limits.Pools, pl)
	}
	if d := spec.Domains; d != nil {
		if msgs := validation.IsQualifiedName(d.NodeLabel); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("domains: nodeLabel %q: %s", d.NodeLabel, strings.Join(msgs, "; ")))
		}
		if d.MaxDisruptedDomains != nil {
			if _, err := scaled(*d.MaxDisruptedDomains, 100, true); err != nil {
				errs = append(errs, fmt.Errorf("domains: maxDisruptedDomains: %w", err))
			}
		}
		c.domainLabel = d.NodeLabel
		c.WaitForComputeDomains = d.WaitForComputeDomains
		collect := defaultCollect
		if d.CollectSeconds != nil {
			if *d.CollectSeconds < 0 {
				errs = append(errs, fmt.Errorf("domains: collectSeconds must not be negative, got %d", *d.CollectSeconds))
			}
			collect = time.Duration(*d.CollectSeconds) * time.Second
		}
		c.Limits.Domains = &DomainLimits{MaxDisrupted: d.MaxDisruptedDomains, CoSchedule: d.CoSchedule == nil || *d.CoSchedule, Collect: collect}
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	return c, nil
}

// defaultCollect is spec.domains.collectSeconds when unset (the schema's
// default; a config read before the default was set gets it too).
const defaultCollect = 10 * time.Second

// DomainOf names a node's domain: the value of spec.domains.nodeLabel
// ("" without the label or without spec.domains).
func (c Config) DomainOf(nodeLabels map[string]string) string {
	if c.domainLabel == "" {
		return ""
	}
	return nodeLabels[c.domainLabel]
}

// DomainLabel is spec.domains.nodeLabel ("" without spec.domains).
func (c Config) DomainLabel() string { return c.domainLabel }

// PoolsOf names the pools whose selectors match a node's labels.
func (c Config) PoolsOf(nodeLabels map[string]string) []string {
	var out []string
	for _, p := range c.pools {
		if p.selector.Matches(labels.Set(nodeLabels)) {
			out = append(out, p.name)
		}
	}
	return out
}
