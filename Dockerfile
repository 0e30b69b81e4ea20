# syntax=docker/dockerfile:1
# cmpoll's image: built in a Rust image, run from distroless (glibc, no shell, non-root).
#   docker build -t ghcr.io/cmpoll/cmpoll:0.1.0 .
#   docker build --target sidecar -t ghcr.io/cmpoll/cmpoll:0.1.0-sidecar .
FROM rust:1.95-bookworm AS build
WORKDIR /src
# The dependencies first, in a layer of their own: only the manifests and the lock file,
# with empty targets, so that a change to cmpoll's source does not rebuild them.
COPY Cargo.toml Cargo.lock ./
COPY tests/apiserver/Cargo.toml tests/apiserver/
RUN mkdir -p src tests/apiserver/src \
 && echo 'fn main() {}' > src/main.rs && touch src/lib.rs tests/tests.rs \
 && touch tests/apiserver/src/lib.rs && echo 'fn main() {}' > tests/apiserver/src/main.rs \
 && cargo build --release --locked -p cmpoll \
 && rm -rf src tests target/release/cmpoll* target/release/deps/cmpoll-* \
    target/release/deps/libcmpoll-* target/release/.fingerprint/cmpoll-*
COPY . .
RUN cargo build --release --locked -p cmpoll \
 && cp target/release/cmpoll /cmpoll

FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="cmpoll" \
      org.opencontainers.image.description="Labelled Kubernetes ConfigMaps as atomic files, a supervised agent, a reload URL or JSON events" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/cmpoll/cmpoll"
COPY --from=build /cmpoll /usr/local/bin/cmpoll
# Numeric, so that Kubernetes' runAsNonRoot can check it (distroless's nonroot user).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/cmpoll"]

# The k8s-sidecar drop-in (tag VERSION-sidecar): charts that embed kiwigrid/k8s-sidecar
# set only its environment, never a command, so the default command is `sidecar`.
#   docker build --target sidecar -t ghcr.io/cmpoll/cmpoll:0.1.0-sidecar .
FROM runtime AS sidecar
LABEL org.opencontainers.image.description="A drop-in for kiwigrid/k8s-sidecar: its variables, cmpoll's polling and atomic, confined writes"
CMD ["sidecar"]

# cmpoll with a POSIX shell (tag VERSION-webhook): --validate runs /bin/sh -c CMD, which
# distroless has not. For `cmpoll webhook` (k8s/webhook), and for a daemon that validates;
# with curl (sed and awk are Debian's essentials) for k8s/alloy's confirm-modules.sh.
#   docker build --target webhook -t ghcr.io/cmpoll/cmpoll:0.1.0-webhook .
FROM debian:bookworm-slim AS webhook
RUN apt-get update \
 && apt-get install -y --no-install-recommends curl ca-certificates \
 && rm -rf /var/lib/apt/lists/*
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="cmpoll" \
      org.opencontainers.image.description="cmpoll with /bin/sh, for --validate: the admission webhook and validating daemons" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/cmpoll/cmpoll"
COPY --from=build /cmpoll /usr/local/bin/cmpoll
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/cmpoll"]
CMD ["webhook"]

# The default target: `cmpoll run`.
FROM runtime
CMD ["run"]
