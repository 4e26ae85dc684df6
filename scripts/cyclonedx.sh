#!/usr/bin/env bash
# Prints the directory holding cargo-cyclonedx (CycloneDX's own SBOM generator for Cargo
# projects), installing it once from crates.io into a cache outside the clone, keyed by its
# version and build profile: $HOME/.cache/outbox-relay/cargo-cyclonedx-<version>-debug/bin. Put
# it on PATH and run `cargo cyclonedx`.
#
# It is built without optimisation (`cargo install --debug`): it describes this workspace once
# per `make dist`, in 1.0 s against 0.6 s optimised, writing the same SBOM but for its timestamp
# and serial number, while the optimised build cost 157 CPU-seconds against 92 (0.5.9, measured
# on the 2-core machine) inside the first step of a fresh `make test`, where every core is
# already building (issue 57).
#
# Environment: CARGO_CYCLONEDX_VERSION (default 0.5.9), OUTBOX_CACHE (default
# $HOME/.cache/outbox-relay).
set -euo pipefail

VERSION="${CARGO_CYCLONEDX_VERSION:-0.5.9}"
CACHE="${OUTBOX_CACHE:-$HOME/.cache/outbox-relay}"
out="$CACHE/cargo-cyclonedx-$VERSION-debug"

say() { echo "cyclonedx: $*" >&2; }

installed() { [ -x "$out/bin/cargo-cyclonedx" ]; }
if installed; then
    echo "$out/bin"
    exit 0
fi
mkdir -p "$CACHE"
exec 9>"$CACHE/.cargo-cyclonedx.lock"
flock 9
if ! installed; then
    say "installing cargo-cyclonedx $VERSION into $out (first build: a few minutes on 2 cores)"
    start=$SECONDS
    rm -rf "$out" "$out.build"
    # A build of its own: not the workspace's static target settings (a cargo plugin is an
    # ordinary host program) nor its target directory, which the next `make` would find changed.
    env -u CARGO_BUILD_TARGET -u CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS -u RUSTFLAGS \
        CARGO_TARGET_DIR="$out.build" \
        cargo install --quiet --locked --debug --version "$VERSION" --root "$out" cargo-cyclonedx >&2
    rm -rf "$out.build"
    say "installed in $((SECONDS - start)) s"
fi
echo "$out/bin"
