#!/usr/bin/env bash
# Builds the release artifacts of VERSION (make release VERSION=v0.2.0) into
# _output/release/$VERSION/:
#   gpufleet-X.Y.Z.oci.tar  the image, linux/amd64 and linux/arm64 (hack/image.sh),
#                           tagged X.Y.Z (VERSION without its "v")
#   gpufleet-X.Y.Z.tgz      the Helm chart, version and appVersion X.Y.Z, so its
#                           image is ghcr.io/gpufleet/gpufleet:X.Y.Z by default
#   install.yaml            kustomize build config/default with the same image
#   SHA256SUMS              sha256sum of the three
# The working tree is not changed (make set-version stamps it).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

version=${VERSION:-}
if ! [[ $version =~ ^v?(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$ ]]; then
  echo "release: VERSION=$version is not a semantic version (vX.Y.Z[-pre]); e.g. make release VERSION=v0.2.0" >&2
  exit 2
fi
semver=${version#v}
out=${OUT:-$root/_output/release/$version}
helm=${HELM:-$root/bin/helm}
[ -x "$helm" ] || { echo "release: $helm not built: run make helm" >&2; exit 1; }
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  echo "release: warning: the working tree has uncommitted changes; the artifacts are built from it, labelled with HEAD $(git rev-parse --short HEAD)" >&2
fi

start=$SECONDS
rm -rf "$out"
mkdir -p "$out"
out=$(cd "$out" && pwd)

VERSION=$version IMAGE_TAG=$semver OUT=$out hack/image.sh

helm_home=$(mktemp -d)
trap 'rm -rf "$helm_home"' EXIT
HELM_CACHE_HOME=$helm_home/cache HELM_CONFIG_HOME=$helm_home/config HELM_DATA_HOME=$helm_home/data \
  "$helm" package charts/gpufleet charts/gpufleet-crds --version "$semver" --app-version "$semver" --destination "$out" >&2

go run ./hack/installyaml -tag "$semver" > "$out/install.yaml"

(cd "$out" && sha256sum -- *.oci.tar *.tgz install.yaml > SHA256SUMS)
echo ">> release $version in $out ($((SECONDS - start))s):" >&2
(cd "$out" && ls -l --block-size=K -- * >&2)
