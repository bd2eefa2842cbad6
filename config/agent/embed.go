// Package agent holds the node agent's deployment manifests.
package agent

import _ "embed"

// RBAC is rbac.yaml: the agent's ServiceAccount, ClusterRole and binding.
//
//go:embed rbac.yaml
var RBAC []byte

// DaemonSet is daemonset.yaml.
//
//go:embed daemonset.yaml
var DaemonSet []byte

// AgentOwnNode is agent-own-node.yaml: the admission policy (and its
// binding) that lets each agent write its own node's objects only.
//
//go:embed agent-own-node.yaml
var AgentOwnNode []byte

// DeviceTaintRuleScope is devicetaintrule-scope.yaml: the admission policy
// (and its binding) that refuses a DeviceTaintRule naming no pool.
//
//go:embed devicetaintrule-scope.yaml
var DeviceTaintRuleScope []byte
