#!/usr/bin/env bash
# Writes the API reference, docs/reference/api/<group>-<version>.md, one
# page per API package under api/, with crd-ref-docs (make docs; pinned in
# hack/tools/crd-ref-docs, configured by docs/reference/crd-ref-docs.yaml).
# One page per group-version, because crd-ref-docs links a type by its name
# alone and two versions of nvidia.com define the same names (State,
# LicensingConfigSpec); its --output-mode group would also write both
# versions of nvidia.com to one file, the second over the first. A link to
# a type of another package (nvidia.com/v1alpha1 uses nvidia.com/v1's) is
# then pointed at that package's page.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=docs/reference/api
rm -rf "$out"
mkdir -p "$out"

pages=()
for dir in $(cd api && find . -name '*.go' -not -name 'zz_generated*' -printf '%h\n' | sort -u); do
  dir=${dir#./}
  gv=$(sed -n 's|^// +groupName=||p' api/"$dir"/*.go | head -n1)
  [ -n "$gv" ] || { echo "api/$dir: no +groupName marker" >&2; exit 1; }
  page="$out/$gv-$(basename "$dir").md"
  "${CRD_REF_DOCS:-bin/crd-ref-docs}" --config docs/reference/crd-ref-docs.yaml --source-path "api/$dir" \
    --renderer markdown --output-mode single --output-path "$page" --log-level ERROR
  pages+=("$page")
done

# anchors PAGE: the anchors of a page's package and type headings
# (GitHub's: lower case, dots and slashes dropped).
anchors() { sed -n 's/^##\(##\)\{0,1\} \(.*\)$/\2/p' "$1" | tr -d './' | tr 'A-Z' 'a-z'; }

for page in "${pages[@]}"; do
  for a in $(grep -o '](#[a-z0-9-]*)' "$page" | sed 's/^](#//; s/)$//' | sort -u); do
    anchors "$page" | grep -qx -- "$a" && continue
    target=""
    for other in "${pages[@]}"; do
      if [ "$other" != "$page" ] && anchors "$other" | grep -qx -- "$a"; then
        target=$(basename "$other")
        break
      fi
    done
    [ -n "$target" ] || { echo "$page: no page has a heading for #$a" >&2; exit 1; }
    sed -i "s|](#$a)|]($target#$a)|g" "$page"
  done
done
