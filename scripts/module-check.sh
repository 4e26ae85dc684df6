#!/usr/bin/env bash
# The relay crate's modules import one way: no circle of `use` edges between its modules, nor
# between its top-level folders (table, broker, protocol, config, runtime, ...). cargo-modules
# draws the graph of module-level `use` edges (types, functions and traits filtered out, so a
# type and its own methods do not count); tsort fails on the first circle and names it.
set -euo pipefail
cd "$(dirname "$0")/.."

# 0.28 needs a newer rustc than the toolchain here; pin the last one that builds with it.
CARGO_MODULES_VERSION=0.27.0
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
if ! cargo modules --version 2>/dev/null | grep -q " ${CARGO_MODULES_VERSION}\$"; then
  echo "installing cargo-modules ${CARGO_MODULES_VERSION} (once per machine; it takes a while)"
  cargo install --locked --quiet cargo-modules --version "${CARGO_MODULES_VERSION}"
fi

graph=$(mktemp)
trap 'rm -f "$graph"' EXIT
cargo modules dependencies --lib -p outbox-relay \
  --no-externs --no-sysroot --no-fns --no-types --no-traits --no-owns >"$graph"

# `"a" -> "b" [label="uses", ...]` lines become `a b` pairs.
edges=$(sed -nE 's/^ *"([^"]+)" -> "([^"]+)" \[label="uses".*/\1 \2/p' "$graph")
if [ -z "$edges" ]; then
  echo "module-check: cargo-modules reported no use edges; the check would pass vacuously" >&2
  exit 1
fi

check() {
  local what=$1 pairs=$2
  if ! tsort <<<"$pairs" >/dev/null 2>"$graph.err"; then
    echo "module-check: the $what import each other in a circle:" >&2
    sed 's/^tsort: //' "$graph.err" >&2
    rm -f "$graph.err"
    exit 1
  fi
  rm -f "$graph.err"
}

check "modules" "$edges"
# Each module stands for its top-level folder; edges inside one folder drop out.
folders=$(awk '{ split($1, a, "::"); split($2, b, "::");
                 if (a[2] != b[2]) print a[1] "::" a[2], b[1] "::" b[2] }' <<<"$edges" | sort -u)
check "top-level modules" "$folders"
echo "module-check: $(wc -l <<<"$edges") use edges between modules of outbox-relay, no circle"
