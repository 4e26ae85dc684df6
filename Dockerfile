# syntax=docker/dockerfile:1
#
# One image for both binaries: /usr/local/bin/outbox-operator and /usr/local/bin/outbox-relay.
# The operator starts relay pods with its own image by default, so the operator and the relay it
# runs are always the same version (one build, one tag, one scan).
#
#   make image            # or: docker build -t ghcr.io/outbox-relay/outbox-relay:0.1.0 .

# --- builder: the official Rust image (Debian bookworm, the same glibc as the runtime image) ---
ARG RUST_VERSION=1.95
FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS builder
WORKDIR /src
COPY . .
# The cache mounts keep the registry and target/ between builds; the binaries are copied out of
# the cached target/ so the final stage can take them.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p outbox-relay -p outbox-operator \
    && mkdir -p /out \
    && cp target/release/outbox-relay target/release/outbox-operator /out/ \
    && strip --strip-debug /out/outbox-relay /out/outbox-operator

# --- runtime: distroless with glibc and libgcc, no shell, non-root (uid 65532) ---
FROM gcr.io/distroless/cc-debian12:nonroot
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="outbox-relay" \
      org.opencontainers.image.description="Transactional-outbox relay (PostgreSQL to RabbitMQ) and its Kubernetes operator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/outbox-relay /out/outbox-operator /usr/local/bin/
USER nonroot
# Relay /metrics, /healthz, /readyz; the operator's are on 8080.
EXPOSE 9090 8080
# Kubernetes manifests name the binary in `command`; without one the image runs the relay.
ENTRYPOINT ["/usr/local/bin/outbox-relay"]
CMD ["--help"]
