# syntax=docker/dockerfile:1
# ichor's container image: built with the Rust toolchain, run on distroless (glibc, libgcc,
# CA certificates, OpenSSL; no shell, no package manager) as the `nonroot` user (65532).
#
#   docker build -t REGISTRY/ichor:TAG .
#
# deploy/deployment.yaml runs it as `ichor run --config /etc/ichor/config.yaml`.

FROM docker.io/library/rust:1-bookworm AS build
WORKDIR /src
# Everything the build reads: the manifest, the sources, the protos (compiled by build.rs
# in pure Rust, so no protoc), and the files embedded with include_str! (policies/,
# testdata/). tests/ and benches/ are declared in Cargo.toml, so cargo wants them present.
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY proto ./proto
COPY policies ./policies
COPY testdata ./testdata
COPY tests ./tests
COPY benches ./benches
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin ichor \
    && install -D -m 0755 target/release/ichor /out/ichor

# Debian 12, like the builder, so the glibc the binary was linked against is there.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/ichor /usr/local/bin/ichor
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/ichor"]
CMD ["run", "--config", "/etc/ichor/config.yaml"]
