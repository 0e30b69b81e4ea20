# syntax=docker/dockerfile:1
# cmpoll's image: built in a Rust image, run from distroless (glibc, no shell, non-root).
#   docker build -t ghcr.io/cmpoll/cmpoll:0.1.0 .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p cmpoll \
 && cp target/release/cmpoll /cmpoll

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /cmpoll /usr/local/bin/cmpoll
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/cmpoll"]
CMD ["run"]
