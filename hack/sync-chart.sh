#!/usr/bin/env bash
# Copies the generated CRDs and RBAC into the Helm charts (make generate):
# charts/gpufleet installs the CRDs from crds/ (Helm creates them on the
# first install and never upgrades them) and takes the operator's rules from
# files/role.yaml, and the admission policies from files/ too;
# charts/gpufleet-crds renders the same CRDs from its
# files/crds/ as templates, so that `helm upgrade` of that chart upgrades
# them. Both ship exactly what the code declares; make verify fails when the
# copies are stale.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
chart="$root/charts/gpufleet"
crds_chart="$root/charts/gpufleet-crds"
for dir in "$chart/crds" "$crds_chart/files/crds"; do
	mkdir -p "$dir"
	rm -f "$dir"/*.yaml
	cp "$root"/config/crd/bases/*.yaml "$dir/"
done
cp "$root/config/rbac/role.yaml" "$chart/files/role.yaml"
cp "$root/config/agent/agent-own-node.yaml" "$root/config/agent/devicetaintrule-scope.yaml" "$root/config/rbac/operator-pod-label.yaml" "$chart/files/"
