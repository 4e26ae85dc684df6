#!/usr/bin/env bash
# make dist: the release artifacts, built and published the way users consume them.
#
#   1. the image (both static binaries, FROM scratch; scripts/image.sh), pushed by digest to an
#      OCI registry as REGISTRY/outbox-relay/outbox-relay:VERSION;
#   2. the chart, packaged and pushed to the same registry as an OCI artifact:
#      oci://REGISTRY/outbox-relay/charts/outbox-relay-operator, VERSION;
#   3. a CycloneDX SBOM of the image (cargo-cyclonedx on both crates, merged: the image holds
#      both binaries), kept beside the artifacts;
#   4. with a key: cosign signatures of the image and the chart, and the SBOM as a signed
#      `cyclonedx` attestation of the image, all offline (no transparency log) and verified
#      with the public key at once. Without one, everything else is still built and pushed and
#      one line says what was not signed and how to give the key (the SBOM then stays a file:
#      it is attached only as a signed attestation).
#
# Environment:
#   DIST_REGISTRY    host:port of the registry (default 127.0.0.1:REGISTRY_PORT, started here with
#                    `outbox-registry start`, from BIN_DIR, when nothing answers there)
#   DIST_PLAIN_HTTP  1 to talk plain HTTP to it (default: 1 for 127.0.0.1 and localhost, else 0)
#   DIST_OUT         where the artifacts and dist.env go (default .cache/dist)
#   BIN_DIR          the static release binaries, built already (as scripts/image.sh takes it)
#   COSIGN_KEY       the signing key: a cosign.key file (cosign generate-key-pair), or any key
#                    reference cosign takes (env://VAR, a KMS URI); unset: nothing is signed
#   COSIGN_PASSWORD  the key's password (cosign reads it from the environment; never printed)
#   COSIGN_PUBLIC_KEY the public key to verify with (default: derived from COSIGN_KEY); the
#                    result is compared with the project's, release/cosign.pub
#
# The last line on stdout is the path of dist.env: the references, digests and whether they
# were signed, for scripts and tests to read.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="$(awk '/^\[workspace.package\]/{p=1; next} /^\[/{p=0} p && /^version *=/{gsub(/[" ]/, "", $0); sub(/^version=/, ""); print; exit}' "$ROOT/Cargo.toml")"
# The registry's port when none is given: the one `outbox-registry start` starts it on.
# shellcheck source-path=SCRIPTDIR source=services/ports.env
. "$ROOT/scripts/services/ports.env"
REGISTRY="${DIST_REGISTRY:-127.0.0.1:$REGISTRY_PORT}"
OUT="${DIST_OUT:-$ROOT/.cache/dist}"
PROJECT_KEY="$ROOT/release/cosign.pub"
case "${REGISTRY%%:*}" in
    127.0.0.1 | localhost) PLAIN_HTTP="${DIST_PLAIN_HTTP:-1}" ;;
    *) PLAIN_HTTP="${DIST_PLAIN_HTTP:-0}" ;;
esac
IMAGE_REPO="$REGISTRY/outbox-relay/outbox-relay"
CHART_REPO="$REGISTRY/outbox-relay/charts"
CHART_NAME=outbox-relay-operator

say() { echo "dist: $*" >&2; }
step_start=$SECONDS
timed() { say "$1 ($((SECONDS - step_start)) s)"; step_start=$SECONDS; }

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
rm -f "$OUT/dist.env"

# The registry: started here only when it is the default one and nothing answers.
if ! curl -fsS -o /dev/null --max-time 5 "$([ "$PLAIN_HTTP" = 1 ] && echo http || echo https)://$REGISTRY/v2/" 2>/dev/null; then
    if [ -n "${DIST_REGISTRY:-}" ]; then
        say "no OCI registry answers at $REGISTRY (DIST_REGISTRY); start one, or leave DIST_REGISTRY unset for a local one"
        exit 1
    fi
    "${BIN_DIR:?names the folder of the release binaries, where outbox-registry starts the local registry}/outbox-registry" start >&2
fi
"$ROOT/scripts/image-tools.sh" >&2
HELM="$("$ROOT/scripts/helm-tools.sh")/helm/helm"
COSIGN="$("$ROOT/scripts/cosign.sh")"
CYCLONEDX_BIN="$("$ROOT/scripts/cyclonedx.sh")"
tls_flags=()
helm_flags=()
cosign_flags=()
if [ "$PLAIN_HTTP" = 1 ]; then
    tls_flags=(--dest-tls-verify=false)
    helm_flags=(--plain-http)
    cosign_flags=(--allow-http-registry=true --allow-insecure-registry=true)
fi
timed "tools ready: helm $("$HELM" version --short), cosign $("$COSIGN" version --json 2>/dev/null | sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p'), skopeo $(skopeo --version | cut -d' ' -f3)"

# 1. The image, built as `make image` builds it, then copied as it is (same digest) to the registry.
layout="$(IMAGE_OUT="$OUT/image" IMAGE="$IMAGE_REPO:$VERSION" "$ROOT/scripts/image.sh")"
skopeo copy --quiet --preserve-digests "${tls_flags[@]}" --digestfile "$OUT/image.digest" \
    "oci:$layout" "docker://$IMAGE_REPO:$VERSION" >&2
IMAGE_DIGEST="$(cat "$OUT/image.digest")"
IMAGE_REF="$IMAGE_REPO@$IMAGE_DIGEST"
timed "pushed the image $IMAGE_REPO:$VERSION, $IMAGE_REF"

# 2. The chart as an OCI artifact.
rm -f "$OUT/$CHART_NAME"-*.tgz
"$HELM" package "$ROOT/charts/$CHART_NAME" --destination "$OUT" >/dev/null
chart_tgz="$OUT/$CHART_NAME-$VERSION.tgz"
[ -f "$chart_tgz" ] || { say "helm package wrote no $chart_tgz: does Chart.yaml's version ($VERSION) follow Cargo.toml?"; exit 1; }
push_out="$("$HELM" push "$chart_tgz" "oci://$CHART_REPO" "${helm_flags[@]}" 2>&1)" || {
    say "helm push failed: $push_out"
    exit 1
}
CHART_DIGEST="$(printf '%s\n' "$push_out" | sed -n 's/^Digest: *\(sha256:[0-9a-f]*\).*/\1/p')"
[ -n "$CHART_DIGEST" ] || { say "helm push printed no digest: $push_out"; exit 1; }
CHART_REF="$CHART_REPO/$CHART_NAME@$CHART_DIGEST"
timed "pushed the chart oci://$CHART_REPO/$CHART_NAME $VERSION, $CHART_REF"

# 3. The SBOM: cargo-cyclonedx describes each crate as built for the image's target; the two
# (the relay's and the operator's) are merged into one document whose subject is the image.
sbom_dir="$OUT/sbom"
rm -rf "$sbom_dir"
mkdir -p "$sbom_dir"
# cargo-cyclonedx writes one SBOM beside every member's Cargo.toml, all under one name: the
# relay's and the operator's are moved out at once and the others removed, so the tree stays
# as it was (.gitignore names them too, should this script be cut short).
sbom_name="dist-sbom-$$"
cleanup_sboms() { rm -f "$ROOT"/*/"$sbom_name.json"; }
trap cleanup_sboms EXIT
(cd "$ROOT" && PATH="$CYCLONEDX_BIN:$PATH" cargo cyclonedx --quiet --format json --spec-version 1.5 \
    --target x86_64-unknown-linux-gnu --no-build-deps --override-filename "$sbom_name" >&2)
for crate in relay operator; do
    mv "$ROOT/$crate/$sbom_name.json" "$sbom_dir/outbox-$crate.cdx.json"
done
cleanup_sboms
SBOM="$sbom_dir/outbox-relay-image.cdx.json"
python3 "$ROOT/scripts/sbom-merge.py" "$ROOT" "$IMAGE_REPO" "$VERSION" "$IMAGE_DIGEST" \
    "$sbom_dir/outbox-relay.cdx.json" "$sbom_dir/outbox-operator.cdx.json" >"$SBOM"
timed "SBOM $SBOM ($(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["components"]))' "$SBOM") components)"

# 4. Signatures and the attestation, with the key when there is one.
SIGNED=no
if [ -n "${COSIGN_KEY:-}" ]; then
    if [ -z "${COSIGN_PASSWORD+set}" ]; then
        # cosign would prompt on a terminal and fail without one: an empty password is a choice.
        say "COSIGN_PASSWORD is not set: set it to the key's password (empty if it has none)"
        exit 1
    fi
    export COSIGN_PASSWORD
    sign() {
        "$COSIGN" sign --yes --key "$COSIGN_KEY" --tlog-upload=false "${cosign_flags[@]}" "$1" >/dev/null 2>"$OUT/cosign.log" || {
            say "cosign sign $1 failed:"; cat "$OUT/cosign.log" >&2; exit 1
        }
    }
    sign "$IMAGE_REF"
    sign "$CHART_REF"
    "$COSIGN" attest --yes --key "$COSIGN_KEY" --tlog-upload=false "${cosign_flags[@]}" \
        --type cyclonedx --predicate "$SBOM" "$IMAGE_REF" >/dev/null 2>"$OUT/cosign.log" || {
        say "cosign attest failed:"; cat "$OUT/cosign.log" >&2; exit 1
    }
    public_key="${COSIGN_PUBLIC_KEY:-$OUT/cosign.pub}"
    if [ -z "${COSIGN_PUBLIC_KEY:-}" ]; then
        "$COSIGN" public-key --key "$COSIGN_KEY" --outfile "$public_key" 2>"$OUT/cosign.log" || {
            say "cosign public-key failed:"; cat "$OUT/cosign.log" >&2; exit 1
        }
    fi
    # What a user runs (docs/install/verify.md), at once: a signature that does not verify
    # with the public key is a failed dist.
    for ref in "$IMAGE_REF" "$CHART_REF"; do
        "$COSIGN" verify --key "$public_key" --insecure-ignore-tlog=true "${cosign_flags[@]}" "$ref" >/dev/null 2>"$OUT/cosign.log" || {
            say "cosign verify $ref failed:"; cat "$OUT/cosign.log" >&2; exit 1
        }
    done
    "$COSIGN" verify-attestation --key "$public_key" --insecure-ignore-tlog=true "${cosign_flags[@]}" \
        --type cyclonedx "$IMAGE_REF" >/dev/null 2>"$OUT/cosign.log" || {
        say "cosign verify-attestation $IMAGE_REF failed:"; cat "$OUT/cosign.log" >&2; exit 1
    }
    SIGNED=yes
    if cmp -s <(tr -d '[:space:]' <"$public_key") <(tr -d '[:space:]' <"$PROJECT_KEY"); then
        key_note="the project's key (release/cosign.pub)"
    else
        key_note="a key other than the project's release/cosign.pub (public key: $public_key)"
    fi
    timed "signed the image and the chart and attested the SBOM with $key_note; verified"
else
    # The SBOM goes to the registry only as a signed attestation (cosign's unsigned `attach
    # sbom` is deprecated): without the key it stays a file here.
    say "not signed: the image $IMAGE_REF and the chart $CHART_REF, and the SBOM not attached (only $SBOM); to sign, set COSIGN_KEY to the cosign.key file and COSIGN_PASSWORD to its password"
fi

cat >"$OUT/dist.env" <<ENV
VERSION=$VERSION
REGISTRY=$REGISTRY
IMAGE_REPO=$IMAGE_REPO
IMAGE_DIGEST=$IMAGE_DIGEST
IMAGE_REF=$IMAGE_REF
CHART_OCI=oci://$CHART_REPO/$CHART_NAME
CHART_DIGEST=$CHART_DIGEST
CHART_REF=$CHART_REF
CHART_PACKAGE=$chart_tgz
SBOM=$SBOM
SIGNED=$SIGNED
ENV
say "version $VERSION: image $IMAGE_REF; chart oci://$CHART_REPO/$CHART_NAME --version $VERSION; SBOM $SBOM; signed: $SIGNED"
echo "$OUT/dist.env"
