#!/usr/bin/env bash
# Prints the path of the Toxiproxy server the application-level fault tests put between the
# relay and its servers (latency, bandwidth, a connection that stops mid-frame:
# tests/src/toxiproxy.rs), built once with Go into the cache from the Go module proxy, keyed by
# everything that decides the binary: the module path and version, the Go version and the
# build flags (progress on stderr); a second call with the same inputs answers at once:
#   $HOME/.cache/outbox-relay/toxiproxy-<key>/toxiproxy-server
# Nothing is started here: each test runs a server of its own, on its own port. `make
# toxiproxy` (make test's first step) builds it ahead of the tests.
#
# The version is pinned: `@latest` resolves through the module proxy to an old v2 release.
#
# Environment: OUTBOX_CACHE (default $HOME/.cache/outbox-relay).
set -euo pipefail

TOXIPROXY_MODULE="github.com/Shopify/toxiproxy/v2"
TOXIPROXY_VERSION="v2.12.0"
# v2.12.0's go.mod asks for Go 1.22 or newer.
TOXIPROXY_GO="1.22"
# The version stamp is what `make` would put there (`toxiproxy-server -version`, GET /version).
TOXIPROXY_LDFLAGS="-s -w -X $TOXIPROXY_MODULE.Version=$TOXIPROXY_VERSION"
say() { echo "toxiproxy: $*" >&2; }
# shellcheck source-path=SCRIPTDIR source=require-go.sh
. "$(dirname "$0")/require-go.sh"
require_go "$TOXIPROXY_GO" Toxiproxy
key=$( { echo "$TOXIPROXY_MODULE@$TOXIPROXY_VERSION"; go env GOVERSION; echo "$TOXIPROXY_LDFLAGS $GO_GCFLAGS"; } \
  | sha256sum | cut -c1-16)
cache="${OUTBOX_CACHE:-$HOME/.cache/outbox-relay}"
out="$cache/toxiproxy-$key"
if [ -x "$out/toxiproxy-server" ]; then
  echo "$out/toxiproxy-server"
  exit 0
fi
# Several callers may ask at once (make test's first step, tests side by side): one builds,
# the others wait for it and then find it built. The lock is a descriptor of this short-lived
# script, gone when it exits.
mkdir -p "$cache"
exec 9>"$cache/.toxiproxy.lock"
flock 9
if [ ! -x "$out/toxiproxy-server" ]; then
  say "building $TOXIPROXY_MODULE@$TOXIPROXY_VERSION with Go $have_go into $out"
  start=$SECONDS
  rm -rf "$out.tmp"
  mkdir -p "$out.tmp"
  # Static (no cgo), no build paths or VCS stamp in it: the same inputs give the same binary.
  # Outside any module (from the cache folder), so no go.mod of ours takes part.
  (cd "$out.tmp" && GOBIN="$out.tmp" CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" \
    go install -trimpath -gcflags "$GO_GCFLAGS" -ldflags "$TOXIPROXY_LDFLAGS" \
    "$TOXIPROXY_MODULE/cmd/server@$TOXIPROXY_VERSION" >&2)
  mv "$out.tmp/server" "$out.tmp/toxiproxy-server"
  rm -rf "$out"
  mv "$out.tmp" "$out"
  say "built in $((SECONDS - start)) s"
fi
echo "$out/toxiproxy-server"
