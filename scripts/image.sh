#!/usr/bin/env bash
# Builds the one container image (outbox-relay and outbox-operator) from the Dockerfile at the
# repository root, with docker or podman when one of them can actually reach its engine;
# otherwise says so and exits 0 (the build machines have no container engine).
#
#   IMAGE=registry.example.com/outbox-relay:dev ./scripts/image.sh   # another reference
#   CONTAINER_ENGINE=podman ./scripts/image.sh                       # pick the engine
#   PUSH=1 ./scripts/image.sh                                        # push after the build
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="$(awk '/^\[workspace.package\]/{p=1; next} /^\[/{p=0} p && /^version *=/{gsub(/[" ]/, "", $0); sub(/^version=/, ""); print; exit}' "$ROOT/Cargo.toml")"
IMAGE="${IMAGE:-ghcr.io/outbox-relay/outbox-relay:$VERSION}"

engine_reachable() {
    command -v "$1" >/dev/null 2>&1 || return 1
    # `info` talks to the engine: a client without a running daemon fails here.
    timeout 20 "$1" info >/dev/null 2>&1
}

engine=""
for candidate in ${CONTAINER_ENGINE:-docker podman}; do
    if engine_reachable "$candidate"; then
        engine="$candidate"
        break
    fi
done

if [ -z "$engine" ]; then
    echo "image: no container engine is available (tried: ${CONTAINER_ENGINE:-docker podman}); not building $IMAGE"
    exit 0
fi

echo "image: building $IMAGE with $engine"
"$engine" build \
    --file "$ROOT/Dockerfile" \
    --tag "$IMAGE" \
    --label "org.opencontainers.image.version=$VERSION" \
    --label "org.opencontainers.image.revision=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)" \
    "$ROOT"
# The image must hold both binaries and start as non-root.
"$engine" run --rm --entrypoint /usr/local/bin/outbox-relay "$IMAGE" --help >/dev/null
"$engine" run --rm --entrypoint /usr/local/bin/outbox-operator "$IMAGE" --help >/dev/null
if [ -n "${PUSH:-}" ]; then
    "$engine" push "$IMAGE"
fi
echo "image: built $IMAGE"
