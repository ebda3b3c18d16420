# syntax=docker/dockerfile:1
#
# The linkerd-cni image: the installer (the DaemonSet's default command) and
# the plugin it copies onto the node.
#
# Multi-architecture: `docker buildx build --platform linux/amd64,linux/arm64`
# runs the build stage once per platform (natively or under emulation), and
# BuildKit sets TARGETARCH to that platform's architecture. The stage maps it
# to the Rust musl target of the same architecture, so nothing here names a
# machine: the build never cross-compiles, and ring's C and assembly are
# compiled by musl-gcc for the architecture the stage runs on.
#
# musl rather than glibc: a static glibc binary still loads the node's NSS
# modules (getaddrinfo, getpwnam) at run time, from whatever glibc the node
# has; a musl binary has no such path. musl targets link statically by
# default, so .cargo/config.toml's glibc-only crt-static flag does not apply.

FROM rust:1.95-slim AS build
ARG TARGETARCH
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# musl-gcc, for the C parts of ring. The Rust toolchain of the base image
# pins the rest; this package follows Debian's security updates.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN case "${TARGETARCH:?set by BuildKit}" in \
      amd64) arch=x86_64 ;; \
      arm64) arch=aarch64 ;; \
      *) echo "no Rust musl target mapped for TARGETARCH=${TARGETARCH}" >&2; exit 1 ;; \
    esac \
 && target="${arch}-unknown-linux-musl" \
 && rustup target add "${target}" \
 && cargo build --release --locked --target "${target}" -p linkerd-cni -p linkerd-cni-agent \
 && mkdir -p /out \
 && cp "target/${target}/release/linkerd-cni" "target/${target}/release/linkerd-cni-agent" \
      "target/${target}/release/linkerd-cni-sh" /out/

# No shell (/bin/sh is linkerd-cni-sh: kill and sleep, for the chart's
# preStop hook), no libc, no package manager: the readiness probe is the
# installer's own `check` subcommand.
FROM scratch
COPY --from=build /out/linkerd-cni /opt/cni/bin/linkerd-cni
# One program at the two paths the linkerd2-cni chart runs: the entrypoint
# (its install-cni container) and the repair controller's; it picks its
# command line by the name it runs under. A scratch image cannot make a
# link, so it is copied twice.
COPY --from=build /out/linkerd-cni-agent /usr/local/bin/linkerd-cni-installer
COPY --from=build /out/linkerd-cni-agent /usr/lib/linkerd/linkerd-cni-repair-controller
COPY --from=build /out/linkerd-cni-sh /bin/sh
ENTRYPOINT ["/usr/local/bin/linkerd-cni-installer"]
