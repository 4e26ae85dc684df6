# syntax=docker/dockerfile:1
#
# One image for both binaries: /usr/local/bin/outbox-operator and /usr/local/bin/outbox-relay.
# The operator starts relay pods with its own image by default, so the operator and the relay it
# runs are always the same version (one build, one tag, one scan).
#
#   docker build -t ghcr.io/outbox-relay/outbox-relay:0.2.0-dev .
#
# This file builds from source and needs to pull the Rust image. With the binaries built already
# (or no registry at hand), `make image` builds the same final stage from Containerfile.

# --- builder: static binaries (glibc static-pie, as `make` builds them) and the root filesystem ---
ARG RUST_VERSION=1.95
FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS builder
WORKDIR /src
COPY . .
ENV CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static"
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p outbox-relay -p outbox-operator --target x86_64-unknown-linux-gnu \
    && mkdir -p /rootfs/usr/local/bin /rootfs/etc/ssl/certs \
    && cp target/x86_64-unknown-linux-gnu/release/outbox-relay \
          target/x86_64-unknown-linux-gnu/release/outbox-operator /rootfs/usr/local/bin/ \
    && strip /rootfs/usr/local/bin/outbox-relay /rootfs/usr/local/bin/outbox-operator \
    && cp image/etc/passwd image/etc/group /rootfs/etc/ \
    && cp /etc/ssl/certs/ca-certificates.crt /rootfs/etc/ssl/certs/

# --- final stage: the same in Dockerfile and Containerfile (chart-check compares them) ---
FROM scratch
ARG VERSION=0.2.0-dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="outbox-relay" \
      org.opencontainers.image.description="Transactional-outbox relay (PostgreSQL to RabbitMQ) and its Kubernetes operator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /rootfs/ /
USER 65532:65532
# Relay /metrics, /healthz, /readyz; the operator's are on 8080.
EXPOSE 9090 8080
# Kubernetes manifests name the binary in `command`; without one the image runs the relay.
ENTRYPOINT ["/usr/local/bin/outbox-relay"]
CMD ["--help"]
