#!/usr/bin/env bash
# Builds gpufleet's container image as an OCI archive, without a container
# engine, a daemon or a registry (make image): the host's Go cross-compiles
# the static binaries (gpufleet, the node agent's own gpufleet-agent and
# cmd/nsenter) for each platform, and hack/tools/image
# (go-containerregistry) puts them on an empty base with the
# CA certificates and the nonroot user (65532). The root Containerfile
# describes the same image for `docker build` / `podman build`.
#
# Environment (the Makefile sets the first three):
#   VERSION    stamped into the binary and the labels (default: git describe)
#   COMMIT     stamped into the binary (default: the short commit)
#   LDFLAGS    the Makefile's -X flags (default: built from VERSION and COMMIT)
#   IMAGE_TAG  the tag in the archive (default: VERSION without a leading "v",
#              which is what the chart's appVersion and kustomize use)
#   PLATFORMS  default "linux/amd64 linux/arm64"
#   OUT        output directory (default: _output/image)
#   SOURCE_DATE_EPOCH  time stamp of the image and its files (default: the
#              commit's time), so the same commit gives the same digests
# Writes $OUT/gpufleet-$IMAGE_TAG.oci.tar.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

version=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
ldflags=${LDFLAGS:-"-X github.com/gpufleet/gpufleet/internal/version.Version=${version} -X github.com/gpufleet/gpufleet/internal/version.Commit=${commit}"}
tag=${IMAGE_TAG:-${version#v}}
platforms=${PLATFORMS:-linux/amd64 linux/arm64}
platforms=${platforms//,/ }
out=${OUT:-$root/_output/image}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}

mkdir -p "$out" "$root/bin"
out=$(cd "$out" && pwd)
stage=$(mktemp -d "$out/.bin-XXXXXX")
trap 'rm -rf "$stage"' EXIT

start=$SECONDS
(cd hack/tools/image && go build -trimpath -o "$root/bin/oci-image" .)

platform_flags=()
for p in $platforms; do
  os=${p%%/*} arch=${p#*/}
  t=$SECONDS
  # -s -w: no symbol table or DWARF (stack traces keep their function names
  # and lines); static: CGO_ENABLED=0.
  # -tags release: the shipped binary has no gpufleet dev / sim and links
  # no local control plane or simulator.
  CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath -buildvcs=false -tags release -ldflags "-s -w $ldflags" \
    -o "$stage/${os}_${arch}/gpufleet" ./cmd/gpufleet
  CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath -buildvcs=false -ldflags "-s -w $ldflags" \
    -o "$stage/${os}_${arch}/gpufleet-agent" ./cmd/gpufleet-agent
  CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath -buildvcs=false -ldflags "-s -w" \
    -o "$stage/${os}_${arch}/nsenter" ./cmd/nsenter
  echo ">> built gpufleet, gpufleet-agent and nsenter for $p in $((SECONDS - t))s" >&2
  platform_flags+=(-platform "$p")
done

archive="$out/gpufleet-$tag.oci.tar"
"$root/bin/oci-image" -out "$archive" -tag "$tag" -bin-dir "$stage" "${platform_flags[@]}" \
  -label "org.opencontainers.image.title=gpufleet" \
  -label "org.opencontainers.image.description=Kubernetes operator for GPU nodes: maintenance scheduling, GPU stack, auto-repair (operator and node agent)" \
  -label "org.opencontainers.image.source=https://github.com/gpufleet/gpufleet" \
  -label "org.opencontainers.image.revision=$revision" \
  -label "org.opencontainers.image.version=$version" \
  -label "org.opencontainers.image.licenses=Apache-2.0" \
  -label "org.opencontainers.image.created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%FT%TZ)"
echo ">> $archive ($(du -h "$archive" | cut -f1), $((SECONDS - start))s); push it with" >&2
echo "   skopeo copy --all oci-archive:$archive:$tag docker://<registry>/gpufleet:$tag" >&2
