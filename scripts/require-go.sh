# shellcheck shell=bash
# Sourced by the scripts that build a Go program into the cache (otel-collector.sh,
# toxiproxy.sh): `require_go NEED WHAT` sets have_go to this machine's Go version, or says on
# stderr what WHAT needs and exits 1 when Go is missing or older than NEED.
require_go() {
  local need=$1 what=$2
  if ! command -v go >/dev/null; then
    echo "building $what needs Go >= $need: install Go $need or newer (.ci/run installs it)" >&2
    exit 1
  fi
  have_go=$(go env GOVERSION | sed 's/^go//')
  if [ "$(printf '%s\n%s\n' "$need" "$have_go" | sort -V | head -1)" != "$need" ]; then
    echo "building $what needs Go >= $need; this machine has $have_go" >&2
    exit 1
  fi
}
