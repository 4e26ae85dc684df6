#!/usr/bin/env bash
# Builds the one container image (outbox-relay and outbox-operator, FROM scratch) from static
# binaries with the Containerfile: with docker or podman when one can reach its engine, otherwise
# without a daemon, with buildah. Writes it as an OCI layout and an OCI archive under the ignored
# cache and prints its reference, digest and size.
#
#   ./scripts/image.sh                                   # builds the static binaries first
#   BIN_DIR=target/x86_64-unknown-linux-gnu/release ./scripts/image.sh   # static binaries built already
#   IMAGE=registry.example.com/outbox-relay:dev ./scripts/image.sh       # another reference
#   CONTAINER_ENGINE=buildah ./scripts/image.sh          # pick the builder (docker podman buildah)
#   IMAGE_OUT=/some/dir ./scripts/image.sh               # where the layout and archive go
#
# The last line on stdout is the OCI layout's path and tag (DIR:TAG), for tests to unpack.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="$(awk '/^\[workspace.package\]/{p=1; next} /^\[/{p=0} p && /^version *=/{gsub(/[" ]/, "", $0); sub(/^version=/, ""); print; exit}' "$ROOT/Cargo.toml")"
IMAGE="${IMAGE:-ghcr.io/outbox-relay/outbox-relay:$VERSION}"
OUT="${IMAGE_OUT:-$ROOT/.cache/image}"
TRIPLE=x86_64-unknown-linux-gnu
REVISION="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"

say() { echo "image: $*" >&2; }

is_static() { ! readelf -lW "$1" 2>/dev/null | grep -q 'program interpreter'; }

build_static() {
    say "building the static release binaries"
    (cd "$ROOT" && CARGO_BUILD_TARGET="$TRIPLE" \
        CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static" \
        cargo build --release --locked -p outbox-relay -p outbox-operator >&2)
    BIN_DIR="${CARGO_TARGET_DIR:-$ROOT/target}/$TRIPLE/release"
}

# The image has no libc: binaries that ask for a dynamic loader (a plain `cargo build`) are
# rebuilt static, as `make` builds them.
if [ -z "${BIN_DIR:-}" ]; then
    build_static
elif ! is_static "$BIN_DIR/outbox-relay" || ! is_static "$BIN_DIR/outbox-operator"; then
    say "$BIN_DIR holds dynamically linked binaries"
    build_static
fi
for bin in outbox-relay outbox-operator; do
    if ! { [ -x "$BIN_DIR/$bin" ] && is_static "$BIN_DIR/$bin"; }; then
        say "no static $BIN_DIR/$bin"
        exit 1
    fi
done

# The build context: the image's root filesystem and the Containerfile.
context="$OUT/context"
rm -rf "$context"
mkdir -p "$context/rootfs/usr/local/bin" "$context/rootfs/etc/ssl/certs"
for bin in outbox-relay outbox-operator; do
    strip -o "$context/rootfs/usr/local/bin/$bin" "$BIN_DIR/$bin"
done
cp "$ROOT/image/etc/passwd" "$ROOT/image/etc/group" "$context/rootfs/etc/"
ca=/etc/ssl/certs/ca-certificates.crt
[ -s "$ca" ] || { say "$ca is missing: install the ca-certificates package"; exit 1; }
cp "$ca" "$context/rootfs/etc/ssl/certs/"
cp "$ROOT/Containerfile" "$context/"

engine_reachable() {
    command -v "$1" >/dev/null 2>&1 || return 1
    case "$1" in
        buildah) return 0 ;;
        # `info` talks to the engine: a client without a running daemon fails here.
        *) timeout 20 "$1" info >/dev/null 2>&1 ;;
    esac
}
engine=""
for candidate in ${CONTAINER_ENGINE:-docker podman buildah}; do
    if engine_reachable "$candidate"; then
        engine="$candidate"
        break
    fi
done
[ -n "$engine" ] || { say "none of ${CONTAINER_ENGINE:-docker podman buildah} can build here (apt-get install buildah)"; exit 1; }

layout="$OUT/oci"
archive="$OUT/outbox-relay-$VERSION.oci.tar"
rm -rf "$layout" "$archive"
build_args=(--build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION")
say "building $IMAGE with $engine"
case "$engine" in
    buildah)
        # Daemonless, with its own store in the cache; vfs needs no kernel overlay support.
        store="${BUILDAH_STORE:-$HOME/.cache/outbox-relay/buildah}"
        b=(buildah --storage-driver vfs --root "$store/root" --runroot "$store/run")
        "${b[@]}" bud --quiet --format oci --timestamp 0 "${build_args[@]}" \
            -f "$context/Containerfile" -t "$IMAGE" "$context" >/dev/null
        "${b[@]}" push --quiet --digestfile "$OUT/digest" "$IMAGE" "oci:$layout:$VERSION"
        "${b[@]}" push --quiet "$IMAGE" "oci-archive:$archive:$VERSION"
        "${b[@]}" rmi "$IMAGE" >/dev/null
        digest="$(cat "$OUT/digest")"
        ;;
    podman)
        podman build --format oci "${build_args[@]}" -f "$context/Containerfile" -t "$IMAGE" "$context" >&2
        podman push --digestfile "$OUT/digest" "$IMAGE" "oci:$layout:$VERSION" >&2
        podman save --format oci-archive -o "$archive" "$IMAGE"
        digest="$(cat "$OUT/digest")"
        ;;
    docker)
        docker build "${build_args[@]}" -f "$context/Containerfile" -t "$IMAGE" "$context" >&2
        docker save -o "$archive" "$IMAGE"
        digest="$(docker image inspect --format '{{.Id}}' "$IMAGE")"
        # docker writes no OCI layout; unpack the archive, which holds one (docker 25 and later).
        mkdir -p "$layout" && tar -xf "$archive" -C "$layout"
        ;;
esac

size() { du -sb "$1" | cut -f1; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
say "reference $IMAGE"
say "digest    $digest"
say "size      $(mib "$(size "$layout")") as an OCI layout (compressed layers), $(mib "$(du -cb "$context"/rootfs/usr/local/bin/* | tail -1 | cut -f1)") of binaries"
say "archive   $archive"
echo "$layout:$VERSION"
