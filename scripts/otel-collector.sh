#!/usr/bin/env bash
# Prints the path of the OpenTelemetry Collector the span tests send to (tests/otel-collector/:
# the core OTLP receiver and contrib's file exporter), built once with Go into the cache, keyed
# by everything that decides the binary: the module's go.mod, go.sum and main.go, the Go version
# and the build flags (progress on stderr); a second call with the same inputs answers at once:
#   $HOME/.cache/outbox-relay/otel-collector-<key>/outbox-otelcol
# Nothing is started here: each test runs a collector of its own, on its own port, writing to its
# own file (tests/src/otel_collector.rs). `make otel-collector` (make test's first step) builds it
# ahead of the tests.
#
# Environment: OUTBOX_CACHE (default $HOME/.cache/outbox-relay).
set -euo pipefail

OTEL_COLLECTOR_LDFLAGS="-s -w"
say() { echo "otel-collector: $*" >&2; }
src="$(cd "$(dirname "$0")/.." && pwd)/tests/otel-collector"
need_go=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$src/go.mod")
# shellcheck source-path=SCRIPTDIR source=require-go.sh
. "$(dirname "$0")/require-go.sh"
require_go "$need_go" "the OpenTelemetry Collector"
key=$( { cat "$src/go.mod" "$src/go.sum" "$src/main.go"; go env GOVERSION; echo "$OTEL_COLLECTOR_LDFLAGS $GO_GCFLAGS"; } \
  | sha256sum | cut -c1-16)
cache="${OUTBOX_CACHE:-$HOME/.cache/outbox-relay}"
out="$cache/otel-collector-$key"
if [ -x "$out/outbox-otelcol" ]; then
  echo "$out/outbox-otelcol"
  exit 0
fi
# Several callers may ask at once (make test's first step, tests side by side): one builds,
# the others wait for it and then find it built. The lock is a descriptor of this short-lived
# script, gone when it exits.
mkdir -p "$cache"
exec 9>"$cache/.otel-collector.lock"
flock 9
if [ ! -x "$out/outbox-otelcol" ]; then
  say "building it with Go $have_go into $out (first build: several minutes on 2 cores)"
  start=$SECONDS
  rm -rf "$out.tmp"
  mkdir -p "$out.tmp"
  # Static (no cgo), no build paths or VCS stamp in it: the same inputs give the same binary.
  (cd "$src" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath \
    -gcflags "$GO_GCFLAGS" -ldflags "$OTEL_COLLECTOR_LDFLAGS" -o "$out.tmp/outbox-otelcol" . >&2)
  rm -rf "$out"
  mv "$out.tmp" "$out"
  say "built in $((SECONDS - start)) s"
fi
echo "$out/outbox-otelcol"
