#!/usr/bin/env bash
# Stamps a release version into the tree (make set-version VERSION=v0.2.0):
# the chart's version and appVersion (so its image tag, which defaults to
# appVersion) and the image tag of config/default, both X.Y.Z without the
# "v". Commit the result with the release.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=${VERSION:-}
if ! [[ $version =~ ^v?(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$ ]]; then
  echo "set-version: VERSION=$version is not a semantic version (vX.Y.Z[-pre])" >&2
  exit 2
fi
semver=${version#v}
chart=$root/charts/gpufleet/Chart.yaml
kust=$root/config/default/kustomization.yaml
grep -q '^version: ' "$chart" && grep -q '^appVersion: ' "$chart" && grep -q '^  newTag: ' "$kust" || {
  echo "set-version: $chart or $kust lost the lines it edits (version:, appVersion:, newTag:)" >&2
  exit 1
}
crds_chart=$root/charts/gpufleet-crds/Chart.yaml
grep -q '^version: ' "$crds_chart" && grep -q '^appVersion: ' "$crds_chart" || {
  echo "set-version: $crds_chart lost the lines it edits (version:, appVersion:)" >&2
  exit 1
}
sed -i -E "s/^version: .*/version: $semver/; s/^appVersion: .*/appVersion: \"$semver\"/" "$chart" "$crds_chart"
sed -i -E "s/^  newTag: .*/  newTag: $semver/" "$kust"
echo "charts/gpufleet/Chart.yaml, charts/gpufleet-crds/Chart.yaml and config/default/kustomization.yaml: $semver" >&2
