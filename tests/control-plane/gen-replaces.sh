#!/usr/bin/env bash
# Prints the replace block that pins every staging module of k8s.io/kubernetes to its published
# version. k8s.io/kubernetes requires its staging modules at v0.0.0 and points them at
# ./staging/src/... with replace directives, which Go ignores in a dependency, so a module that
# imports it must repeat one replace per staging module. The list changes between minor
# versions: it is read from the kubernetes module's own go.mod, fetched through the module proxy.
#
# Usage: gen-replaces.sh v1.37.2 > replaces.txt (control-plane/update.sh splices it into go.mod)
set -euo pipefail
version=${1:?usage: gen-replaces.sh vMAJOR.MINOR.PATCH}
staging_version="v0.${version#v1.}"
gomod=$(go mod download -json "k8s.io/kubernetes@${version}" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
[ -n "$gomod" ] || { echo "could not download k8s.io/kubernetes@${version}" >&2; exit 1; }
echo "replace ("
sed -n 's#^\t\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 '"${staging_version}"'#p' "$gomod"
echo ")"
