# shellcheck shell=bash
# The image's build files, checked by scripts/chart-check.sh (which sources this file):
# Dockerfile and Containerfile end in the same FROM scratch stage, and .dockerignore keeps what
# Cargo needs.

# The final stage, from its FROM to the end, with the source of its one COPY left out: the
# Dockerfile's comes from its builder stage, the Containerfile's from the prepared context.
final_stage() {
    awk '/^# --- final stage/{p=1} p' "$1" | sed -E 's#^COPY (--from=builder )?[^ ]+ /$#COPY <rootfs> /#'
}

dockerfile_ok() {
    local f="$ROOT/Dockerfile" want
    for want in '^FROM docker.io/library/rust:.* AS builder' \
        'cargo build --release --locked -p outbox-relay -p outbox-operator' \
        '^FROM scratch' '^USER 65532:65532'; do
        grep -Eq -- "$want" "$f" || { echo "Dockerfile lacks /$want/"; return 1; }
    done
    if ! diff <(final_stage "$f") <(final_stage "$ROOT/Containerfile"); then
        echo "the final stages of Dockerfile and Containerfile differ (above)"
        return 1
    fi
    [ "$(final_stage "$f" | grep -c '^COPY <rootfs> /$')" = 1 ] || { echo "no single COPY of the root filesystem"; return 1; }
    # The build context must keep every workspace member (Cargo needs them all to build one).
    for member in relay operator tests Cargo.toml Cargo.lock image; do
        if grep -qx "$member" "$ROOT/.dockerignore"; then
            echo ".dockerignore leaves out $member"
            return 1
        fi
    done
}
