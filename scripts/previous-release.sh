#!/usr/bin/env bash
# The previous release, built from its recorded commit and cached by that commit: what the
# upgrade tests install first and what the mixed-version test runs beside this build.
#
#   ./scripts/previous-release.sh          # builds once (minutes), then answers at once
#
# It reads the newest line of release/releases (VERSION COMMIT DATE), exports that commit's tree
# (`git archive`: a clean clone has the history; tests/tests/repo_release.rs checks the commit is
# there), and builds with the release's own files: its static outbox-relay and outbox-operator,
# its image (its own scripts/image.sh and Containerfile) and its packaged chart. They are kept
# under $OUTBOX_CACHE/previous-release/<commit>/ (default $HOME/.cache/outbox-relay):
#
#   bin/outbox-relay, bin/outbox-operator       static, stripped
#   image/oci (OCI layout, tag VERSION), image/outbox-relay-VERSION.oci.tar
#   chart/outbox-relay-operator-VERSION.tgz
#   release.env                                 what is where (written last: its presence means done)
#
# The last line on stdout is the path of release.env.
#
# The cargo build gets a target folder of its own, removed once the binaries are out: cargo
# keys a workspace crate by its path relative to the workspace root, so the old crates built in
# the current target folder would overwrite this build's (and the uplifted binaries carry no
# hash at all). The folder is seeded with hard links to the dependency artifacts of the current
# build (CARGO_TARGET_DIR, else ./target), which cost no disk, so only the workspace crates
# compile; every file or folder named after a workspace crate (outbox*, liboutbox*) is left out,
# so nothing the old build writes is a link into the current one. Dependencies whose versions or
# features changed since the release compile again, under their own hashes.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${OUTBOX_CACHE:-$HOME/.cache/outbox-relay}"
TRIPLE=x86_64-unknown-linux-gnu

say() { echo "previous-release: $*" >&2; }

line="$(grep -v '^#' "$ROOT/release/releases" | grep -v '^[[:space:]]*$' | tail -1)"
read -r VERSION COMMIT _ <<<"$line"
[[ "$COMMIT" =~ ^[0-9a-f]{40}$ ]] || { say "release/releases: no VERSION COMMIT line (newest: '$line')"; exit 1; }
out="$CACHE/previous-release/$COMMIT"
if [ -s "$out/release.env" ]; then
    echo "$out/release.env"
    exit 0
fi

# Several callers may ask at once (make test, a test): one builds, the others wait for it.
mkdir -p "$CACHE/previous-release"
exec 9>"$CACHE/previous-release/.lock"
flock 9
if [ -s "$out/release.env" ]; then
    echo "$out/release.env"
    exit 0
fi

# A shallow or single-branch clone may lack it: ask the clone's origin once (the tag or the
# commit itself) before giving up.
git -C "$ROOT" cat-file -e "$COMMIT^{commit}" 2>/dev/null ||
    git -C "$ROOT" fetch --quiet origin "refs/tags/v$VERSION:refs/tags/v$VERSION" 2>/dev/null ||
    git -C "$ROOT" fetch --quiet origin "$COMMIT" 2>/dev/null || true
git -C "$ROOT" cat-file -e "$COMMIT^{commit}" 2>/dev/null || {
    say "commit $COMMIT (release $VERSION) is not in this clone nor at its origin: fetch the history (git fetch --unshallow)"
    exit 1
}
say "building release $VERSION from commit $COMMIT into $out (first time: the workspace crates compile, some minutes)"
start=$SECONDS
work="$CACHE/previous-release/$COMMIT.build"
rm -rf "$work" "$out" "$out.tmp"
mkdir -p "$work/src" "$work/target" "$out.tmp/bin" "$out.tmp/chart"
git -C "$ROOT" archive "$COMMIT" | tar -x -C "$work/src"

# Seed the target folder: hard links of the current build's dependency artifacts.
current="${CARGO_TARGET_DIR:-$ROOT/target}"
seeded=0
if [ -d "$current" ] && [ "$(stat -c %d "$current")" = "$(stat -c %d "$work")" ]; then
    for profile in release "$TRIPLE/release"; do
        for kind in deps build .fingerprint; do
            from="$current/$profile/$kind"
            [ -d "$from" ] || continue
            to="$work/target/$profile/$kind"
            mkdir -p "$to"
            # Top-level entries only: a crate's files and folders carry its name first.
            find "$from" -mindepth 1 -maxdepth 1 ! -name 'outbox*' ! -name 'liboutbox*' \
                -exec cp -al -t "$to" {} + 
            seeded=1
        done
    done
fi
[ "$seeded" = 1 ] || say "no dependency build to seed from in $current (or another file system): every crate compiles (about 20 minutes on 2 cores)"

# Its own build, as its Makefile builds the image's binaries: static, for the FROM scratch image.
build_start=$SECONDS
# The dependencies get this tree's release profile (Cargo.toml: line tables only), which an
# older release may not have written: a profile setting is part of an artifact's hash, so
# without it all 359 seeded dependencies compiled again (7 minutes instead of 2 to 3). Its own
# two crates compile at opt-level 1: the upgrade and mixed-version tests need its behaviour, not
# its speed, and that took the build from 123 to 102 s alone on 2 cores (2026-12-07).
(cd "$work/src" && CARGO_TARGET_DIR="$work/target" CARGO_BUILD_TARGET="$TRIPLE" \
    CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --release --locked -p outbox-relay -p outbox-operator --bins \
        --config 'profile.release.package."*".debug="line-tables-only"' \
        --config 'profile.release.package.outbox-relay.opt-level=1' \
        --config 'profile.release.package.outbox-operator.opt-level=1' >&2)
build_seconds=$((SECONDS - build_start))
bin_dir="$work/target/$TRIPLE/release"
for bin in outbox-relay outbox-operator; do
    strip -o "$out.tmp/bin/$bin" "$bin_dir/$bin"
done

# Its image, with its own script and Containerfile. The script labels the image with
# `git rev-parse HEAD` of its tree, which an exported tree has not: a repository of its own
# whose HEAD is the release's commit (its objects borrowed from this clone) answers for it.
git_dir="$work/git"
git init -q --bare "$git_dir"
(cd "$ROOT" && realpath "$(git rev-parse --git-common-dir)/objects") >"$git_dir/objects/info/alternates"
git --git-dir="$git_dir" update-ref --no-deref HEAD "$COMMIT"
# shellcheck disable=SC2034 # image.sh prints the layout's path: kept off stdout, whose one line is release.env's path
layout="$(cd "$work/src" && GIT_DIR="$git_dir" BIN_DIR="$bin_dir" IMAGE_OUT="$out.tmp/image" \
    IMAGE="ghcr.io/outbox-relay/outbox-relay:$VERSION" ./scripts/image.sh)"
rm -rf "$out.tmp/image/context"
digest="$(cat "$out.tmp/image/digest")"

# Its chart, packaged as `make dist` packages one.
HELM="$("$ROOT/scripts/helm-tools.sh")/helm/helm"
"$HELM" package "$work/src/charts/outbox-relay-operator" --destination "$out.tmp/chart" >/dev/null
chart="$out.tmp/chart/outbox-relay-operator-$VERSION.tgz"
[ -f "$chart" ] || { say "helm package wrote no $chart"; exit 1; }

rm -rf "$work"
mv "$out.tmp" "$out"
cat >"$out/release.env.tmp" <<ENV
VERSION=$VERSION
COMMIT=$COMMIT
RELAY=$out/bin/outbox-relay
OPERATOR=$out/bin/outbox-operator
IMAGE_LAYOUT=$out/image/oci:$VERSION
IMAGE_ARCHIVE=$out/image/outbox-relay-$VERSION.oci.tar
IMAGE_DIGEST=$digest
CHART_PACKAGE=$out/chart/outbox-relay-operator-$VERSION.tgz
BUILD_SECONDS=$build_seconds
TOTAL_SECONDS=$((SECONDS - start))
ENV
mv "$out/release.env.tmp" "$out/release.env"
say "release $VERSION ($COMMIT): cargo build $build_seconds s, $((SECONDS - start)) s in all; image $digest; chart $(basename "$chart")"
echo "$out/release.env"
