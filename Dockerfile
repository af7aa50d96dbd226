# syntax=docker/dockerfile:1
#
# The single `tidal` binary in a small, non-root image. Every role is a subcommand
# (`tidal gateway`, `tidal controller`, `tidal billing`, `tidal runtime`, ...), so one image
# serves the Helm chart and the runtime workers the controller creates.
#
#   docker build -t tidal:0.1.0 .
#
# Build stage: Debian 12 (bookworm), the same glibc as the runtime stage. The cache mounts keep
# the crates.io index, downloaded crates and the target directory between builds; they are not
# part of any layer, so the binary is copied out of the target directory in the same step.
FROM rust:1.95-bookworm AS build
WORKDIR /src
# .cargo/config.toml points the target directory at the developers' shared cache; in the image
# build it lives in a cache mount instead.
ENV CARGO_TARGET_DIR=/cache/target \
    CARGO_TERM_COLOR=never
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/cache/target,sharing=locked \
    cargo build --release --locked --bin tidal \
 && objcopy --strip-debug /cache/target/release/tidal /usr/local/bin/tidal \
 && /usr/local/bin/tidal --version

# Runtime stage: glibc, libgcc and CA certificates, no shell, no package manager. The binary
# links only libc, libm and libgcc_s (SQLite is compiled in; Kubernetes TLS is rustls).
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /usr/local/bin/tidal /usr/local/bin/tidal
# 65532 is distroless's `nonroot`; the chart's podSecurityContext uses the same ids.
USER 65532:65532
# Worker mode listens on 8000, the gateway on 8080, billing on 8090, the controller on 9090.
EXPOSE 8000 8080 8090 9090
ENTRYPOINT ["tidal"]
CMD ["--help"]
