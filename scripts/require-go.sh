# shellcheck shell=bash
# Sourced by the scripts that build a Go program into the cache (otel-collector.sh,
# toxiproxy.sh, tests/control-plane/build.sh): `require_go NEED WHAT` sets have_go to this
# machine's Go version, or says on stderr what WHAT needs and exits 1 when Go is missing or older
# than NEED.
#
# GO_GCFLAGS is the compiler flags every one of those builds uses. They all link with `-s -w`,
# which throws the DWARF tables away, so the compiler is told not to write them: building etcd
# from an empty build cache took 97 and 81 s of CPU with them, 67 and 71 s without (user + system,
# two runs each, alternated, 2026-12-07). The same flags in every build also let Go's build
# cache serve the packages the builds share (grpc, protobuf, otel) from one compilation.
# shellcheck disable=SC2034 # read by the scripts that source this file
GO_GCFLAGS="all=-dwarf=false"
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
