package maintenance

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// poolMemo remembers the pools of each node between scheduling passes,
// keyed by the node's resourceVersion and the pools' selectors: matching
// every node against every pool's selector was a third of a pass at
// 10,000 nodes and 16 pools, for labels that rarely change. A pass
// computes the pools of the nodes that changed since the last one.
type poolMemo struct {
	selectors string // poolsKey of the config the entries were computed for
	nodes     map[string]*memoPools
	pass      uint64
	// computed counts the nodes whose pools were matched (not remembered).
	computed int
}

type memoPools struct {
	resourceVersion string
	pools           []string
	pass            uint64 // the last pass that saw the node
}

// begin starts a pass under cfg: a config whose pools differ forgets
// every node.
func (m *poolMemo) begin(cfg *Config) {
	if key := cfg.poolsKey(); key != m.selectors || m.nodes == nil {
		m.selectors, m.nodes = key, map[string]*memoPools{}
	}
	m.pass++
}

// of returns the pools of n under the config of the pass.
func (m *poolMemo) of(cfg *Config, n *corev1.Node) []string {
	e := m.nodes[n.Name]
	if e == nil {
		e = &memoPools{}
		m.nodes[n.Name] = e
	}
	if e.pass == 0 || e.resourceVersion != n.ResourceVersion || n.ResourceVersion == "" {
		e.resourceVersion, e.pools = n.ResourceVersion, cfg.PoolsOf(n.Labels)
		m.computed++
	}
	e.pass = m.pass
	return e.pools
}

// end forgets the nodes the pass did not see (deleted ones).
func (m *poolMemo) end(seen int) {
	if len(m.nodes) <= seen {
		return
	}
	for name, e := range m.nodes {
		if e.pass != m.pass {
			delete(m.nodes, name)
		}
	}
}

// poolsKey identifies the pools' names and selectors.
func (c Config) poolsKey() string {
	var b strings.Builder
	for _, p := range c.pools {
		b.WriteString(p.name)
		b.WriteByte(0)
		b.WriteString(p.selector.String())
		b.WriteByte(0)
	}
	return b.String()
}
