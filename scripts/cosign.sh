#!/usr/bin/env bash
# Prints the path of a cosign v2 binary: Debian 13's packaged cosign, fetched once with
# `apt-get download` from Debian's trixie suite (the machine's own package source, with a
# sources list and package lists of its own, so the system's apt is untouched) and unpacked with
# `dpkg-deb -x`, nothing installed. Cached outside the clone, keyed by the package version:
#   $HOME/.cache/outbox-relay/cosign-deb-<version>/cosign
# Measured: under 10 s on a fresh machine, where `go install` of cosign v2.6.5 took 472 s of the
# two cores (issue 57). cosign v2, not v3: v3 fetches its TUF trust root by default and its
# offline key path is broken (sigstore/cosign #5043); make dist signs and verifies with a key
# pair, offline, which 2.5.0 does as 2.6.5 did.
#
# Environment: COSIGN_DEB_VERSION (default 2.5.0-2+b5), OUTBOX_CACHE (default
# $HOME/.cache/outbox-relay). Needs root for apt-get's package lists (the tests run as root).
set -euo pipefail

VERSION="${COSIGN_DEB_VERSION:-2.5.0-2+b5}"
CACHE="${OUTBOX_CACHE:-$HOME/.cache/outbox-relay}"
out="$CACHE/cosign-deb-$VERSION"

say() { echo "cosign: $*" >&2; }

if [ -x "$out/cosign" ]; then
    echo "$out/cosign"
    exit 0
fi

# Several callers may ask at once (make dist, a test): one fetches, the others wait for it.
mkdir -p "$CACHE"
exec 9>"$CACHE/.cosign.lock"
flock 9
if [ ! -x "$out/cosign" ]; then
    say "fetching Debian 13's cosign $VERSION into $out"
    apt_dir="$CACHE/apt-trixie"
    mkdir -p "$apt_dir/sources" "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
    printf '%s\n' 'Types: deb' 'URIs: http://deb.debian.org/debian' 'Suites: trixie' \
        'Components: main' 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' \
        >"$apt_dir/sources/trixie.sources"
    apt_options=(-o "Dir::Etc::sourcelist=-" -o "Dir::Etc::sourceparts=$apt_dir/sources"
        -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
        -o "APT::Get::List-Cleanup=0" -o "APT::Sandbox::User=root")
    apt-get "${apt_options[@]}" update -qq >&2
    rm -rf "$out.tmp"
    mkdir -p "$out.tmp/deb"
    (cd "$out.tmp/deb" && apt-get "${apt_options[@]}" download "cosign=$VERSION" >&2)
    dpkg-deb -x "$out.tmp/deb/"cosign_*.deb "$out.tmp/root"
    mv "$out.tmp/root/usr/bin/cosign" "$out.tmp/cosign"
    rm -rf "$out.tmp/deb" "$out.tmp/root"
    "$out.tmp/cosign" version >/dev/null 2>&1 || { say "the unpacked cosign does not run"; exit 1; }
    rm -rf "$out"
    mv "$out.tmp" "$out"
fi
echo "$out/cosign"
