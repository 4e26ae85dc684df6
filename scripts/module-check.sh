#!/usr/bin/env bash
# Both crates' modules import one way: no circle of `use` edges between their modules, nor
# between their top-level folders (the relay's table, broker, protocol, config, runtime, ...;
# the operator's crd, reconcile, runtime). cargo-modules
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
trap 'rm -f "$graph" "$graph.err"' EXIT

check() {
  local package=$1 what=$2 pairs=$3
  if ! tsort <<<"$pairs" >/dev/null 2>"$graph.err"; then
    echo "module-check: the $what of $package import each other in a circle:" >&2
    sed 's/^tsort: //' "$graph.err" >&2
    exit 1
  fi
}

for package in outbox-relay outbox-operator; do
  cargo modules dependencies --lib -p "$package" \
    --no-externs --no-sysroot --no-fns --no-types --no-traits --no-owns >"$graph"

  # `"a" -> "b" [label="uses", ...]` lines become `a b` pairs.
  edges=$(sed -nE 's/^ *"([^"]+)" -> "([^"]+)" \[label="uses".*/\1 \2/p' "$graph")
  if [ -z "$edges" ]; then
    echo "module-check: cargo-modules reported no use edges in $package; the check would pass vacuously" >&2
    exit 1
  fi

  check "$package" "modules" "$edges"
  # Each module stands for its top-level folder; edges inside one folder drop out.
  folders=$(awk '{ split($1, a, "::"); split($2, b, "::");
                   if (a[2] != b[2]) print a[1] "::" a[2], b[1] "::" b[2] }' <<<"$edges" | sort -u)
  check "$package" "top-level modules" "$folders"
  echo "module-check: $(wc -l <<<"$edges") use edges between modules of $package, no circle"
done
