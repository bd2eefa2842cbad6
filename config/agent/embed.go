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
