#!/usr/bin/env bash
# Builds the commands of one control-plane module in one `go build` that compiles the packages
# they share once, into a cache outside the clone keyed by everything that decides the binaries
# (go.mod, go.sum, our own Go sources, the build flags, the Go version), and prints the bin
# directory.
#
# Usage: build.sh [MODULE_DIR]. The module is this folder by default (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, the node's kubelet and kube-proxy, kubectl: the
# Kubernetes the tests run on), or `oldest/` (etcd, kube-apiserver and kubectl of the oldest
# Kubernetes minor the chart supports). A module's commands are its `./cmd/*` folders and the
# `tool` block of its go.mod.
# A second run with the same inputs prints it at once; Go's module and
# build caches (under $HOME) make a rebuild after a small change cost seconds rather than the
# minutes of a first build.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "${1:-$here}"

# shellcheck source-path=SCRIPTDIR source=../../scripts/require-go.sh
. "$here/../../scripts/require-go.sh"
require_go "$(sed -n 's/^go \([0-9.]*\)$/\1/p' go.mod)" "the Kubernetes control plane (make test)"

kube_version=$(sed -n 's#^\tk8s.io/kubernetes \(v[0-9.]*\).*#\1#p' go.mod | head -1)
[ -n "$kube_version" ] || { echo "go.mod does not require k8s.io/kubernetes" >&2; exit 1; }
key=$( { cat go.mod go.sum "$here/build.sh" "$here/../../scripts/require-go.sh"; find cmd -name '*.go' -print0 | sort -z | xargs -0 cat; go env GOVERSION; } | sha256sum | cut -c1-16)
cache=${OUTBOX_CONTROL_PLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay/control-plane}
out="$cache/$kube_version-$key"
# Import paths: our own commands, then the tool block's.
packages=()
for dir in cmd/*/; do packages+=("./${dir%/}"); done
while read -r package; do packages+=("$package"); done < <(sed -n '/^tool (/,/^)/s/^\t\([^ ]*\)$/\1/p' go.mod)
commands=()
for package in "${packages[@]}"; do commands+=("${package##*/}"); done
built() {
  local command
  for command in "${commands[@]}"; do [ -x "$out/bin/$command" ] || return 1; done
}
if built; then
  echo "$out/bin"
  exit 0
fi

major=${kube_version#v}; major=${major%%.*}
minor=${kube_version#v*.}; minor=${minor%%.*}
# Without these, /version and `kubectl version` report v0.0.0.
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  stamp+=" -X ${pkg}.gitVersion=${kube_version} -X ${pkg}.gitMajor=${major} -X ${pkg}.gitMinor=${minor}"
  stamp+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=1970-01-01T00:00:00Z"
done

mkdir -p "$out.tmp/bin"
echo "building the Kubernetes ${kube_version} control plane into $out (first build: about 10 minutes on 2 cores)" >&2
CGO_ENABLED=0 go build -buildvcs=false -trimpath -gcflags "$GO_GCFLAGS" -ldflags "-s -w${stamp}" -o "$out.tmp/bin/" \
  "${packages[@]}"
rm -rf "$out"
mv "$out.tmp" "$out"
echo "$out/bin"
