#!/usr/bin/env bash
# Prints the path of a cosign v2 binary, building it once from the Go module proxy into a cache
# outside the clone, keyed by its version and the Go version that built it:
#   $HOME/.cache/outbox-relay/cosign-<version>-<go version>/cosign
# cosign v2, not v3: v3 fetches its TUF trust root by default and its offline key path is broken
# (sigstore/cosign #5043); make dist signs and verifies with a key pair, offline.
#
# Environment: COSIGN_VERSION (default v2.6.5), OUTBOX_CACHE (default $HOME/.cache/outbox-relay).
# Needs Go >= the module's own go directive (1.24 for v2.6.5); .ci/run installs a current Go.
set -euo pipefail

VERSION="${COSIGN_VERSION:-v2.6.5}"
CACHE="${OUTBOX_CACHE:-$HOME/.cache/outbox-relay}"

say() { echo "cosign: $*" >&2; }

command -v go >/dev/null || { say "building cosign needs Go 1.24 or newer (.ci/run installs it)"; exit 1; }
go_version="$(go env GOVERSION)"
out="$CACHE/cosign-$VERSION-$go_version"
if [ -x "$out/cosign" ]; then
    echo "$out/cosign"
    exit 0
fi

# Several callers may ask at once (make dist, a test): one builds, the others wait for it.
mkdir -p "$CACHE"
exec 9>"$CACHE/.cosign.lock"
flock 9
if [ ! -x "$out/cosign" ]; then
    say "building cosign $VERSION with $go_version into $out (first build: several minutes on 2 cores)"
    start=$SECONDS
    rm -rf "$out.tmp"
    mkdir -p "$out.tmp"
    # go install PACKAGE@VERSION builds the module as released, from its own go.mod and go.sum,
    # outside any module of ours. The version stamp is what `cosign version` reports.
    (cd /tmp && CGO_ENABLED=0 GOBIN="$out.tmp" GOFLAGS=-buildvcs=false go install -trimpath \
        -ldflags "-s -w -X sigs.k8s.io/release-utils/version.gitVersion=$VERSION" \
        "github.com/sigstore/cosign/v2/cmd/cosign@$VERSION" >&2)
    rm -rf "$out"
    mv "$out.tmp" "$out"
    say "built in $((SECONDS - start)) s"
fi
echo "$out/cosign"
