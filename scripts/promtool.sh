#!/usr/bin/env bash
# Prints the path of a promtool binary, fetching it once from Debian's prometheus package:
# `apt-get download` fetches the .deb (no root needed, nothing is installed) and only
# usr/bin/promtool is unpacked from it, into the cache. No Prometheus server is installed or
# started. Used by chart-check (the alert rules, their unit tests, the dashboard's PromQL).
#
# Environment: PROMTOOL_CACHE (default $HOME/.cache/outbox-relay/promtool); PROMTOOL, the path
# of a promtool to use instead (printed as it is once it runs).
set -euo pipefail

CACHE="${PROMTOOL_CACHE:-$HOME/.cache/outbox-relay/promtool}"
PACKAGE="prometheus"

say() { echo "promtool.sh: $*" >&2; }
die() {
    say "$*"
    exit 1
}

runs() { "$1" --version >/dev/null 2>&1; }

if [ -n "${PROMTOOL:-}" ]; then
    runs "$PROMTOOL" || die "PROMTOOL=$PROMTOOL does not run (\`$PROMTOOL --version\` failed)"
    echo "$PROMTOOL"
    exit 0
fi

# The newest promtool already unpacked (one directory per package version).
cached() {
    local dir
    for dir in $(find "$CACHE" -mindepth 1 -maxdepth 1 -type d -name '[0-9]*' -printf '%f\n' 2>/dev/null | sort -rV); do
        if [ -f "$CACHE/$dir/.complete" ] && runs "$CACHE/$dir/promtool"; then
            echo "$CACHE/$dir/promtool"
            return 0
        fi
    done
    return 1
}

# apt-get download into the current directory. Without package lists (a fresh container) it
# cannot find the package: root refreshes the system's lists; anybody else gets private lists in
# the cache, which apt-get can fetch without root.
download() {
    local -a private=(-o "Dir::State::Lists=$CACHE/apt/lists" -o "Dir::Cache=$CACHE/apt/cache")
    apt-get download -qq "$PACKAGE" >/dev/null 2>&1 && return 0
    if [ "$(id -u)" = 0 ]; then
        say "apt-get download $PACKAGE failed; running apt-get update"
        apt-get update -qq >/dev/null 2>&1 || true
        apt-get download -qq "$PACKAGE" >/dev/null 2>&1 && return 0
    fi
    say "fetching package lists into $CACHE/apt (no root needed)"
    mkdir -p "$CACHE/apt/lists/partial" "$CACHE/apt/cache/archives/partial"
    apt-get "${private[@]}" -o Debug::NoLocking=1 update -qq >/dev/null 2>&1 || true
    apt-get "${private[@]}" download -qq "$PACKAGE"
}

fetch() {
    if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
        die "apt-get and dpkg-deb are missing: promtool comes from Debian's $PACKAGE package here; install promtool and set PROMTOOL=<its path>"
    fi
    mkdir -p "$CACHE"
    local dl deb version dir
    dl="$(mktemp -d "$CACHE/download.XXXXXX")"
    # shellcheck disable=SC2064 # the directory is fixed now
    trap "rm -rf '$dl'" EXIT
    (cd "$dl" && download) || die "apt-get download $PACKAGE failed (see above); is a Debian package source configured?"
    deb="$(find "$dl" -maxdepth 1 -name "${PACKAGE}_*.deb" | head -n 1)"
    [ -n "$deb" ] || die "apt-get download $PACKAGE left no .deb in $dl"
    version="$(dpkg-deb -f "$deb" Version)"
    dir="$CACHE/${version//[^A-Za-z0-9.+~-]/_}"
    say "unpacking usr/bin/promtool of $PACKAGE $version into $dir"
    rm -rf "$dir"
    mkdir -p "$dir"
    dpkg-deb --fsys-tarfile "$deb" | tar -xf - -C "$dl" ./usr/bin/promtool ||
        die "$deb has no usr/bin/promtool"
    mv "$dl/usr/bin/promtool" "$dir/promtool"
    runs "$dir/promtool" || die "the unpacked $dir/promtool does not run (\`promtool --version\` failed)"
    echo "$version" >"$dir/.complete"
}

# Several checks may ask at once: one fetches, the others wait for it.
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if ! cached >/dev/null; then
    (fetch) >&2 || exit 1
fi
cached || die "no working promtool in $CACHE"
