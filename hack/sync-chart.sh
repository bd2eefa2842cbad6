#!/usr/bin/env bash
# Copies the generated CRDs and RBAC into the Helm chart (make generate):
# the chart installs the CRDs from crds/ and takes the operator's rules from
# files/role.yaml, so it ships exactly what the code declares. make verify
# fails when the copies are stale.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
chart="$root/charts/gpufleet"
rm -f "$chart"/crds/*.yaml
cp "$root"/config/crd/bases/*.yaml "$chart/crds/"
cp "$root/config/rbac/role.yaml" "$chart/files/role.yaml"
