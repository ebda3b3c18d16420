# syntax=docker/dockerfile:1
#
# The linkerd-cni image: the installer (the DaemonSet's default command) and
# the plugin it copies onto the node.

# Build both binaries. .cargo/config.toml links them statically (the plugin
# runs on arbitrary node OSes), which is also what lets the runtime image
# hold nothing else.
FROM rust:1.95-slim AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p linkerd-cni -p linkerd-cni-installer

# No shell, no libc, no package manager: the readiness probe is the
# installer's own `check` subcommand.
FROM scratch
COPY --from=build /src/target/x86_64-unknown-linux-gnu/release/linkerd-cni /opt/cni/bin/linkerd-cni
COPY --from=build /src/target/x86_64-unknown-linux-gnu/release/linkerd-cni-installer /usr/local/bin/linkerd-cni-installer
COPY --from=build /src/target/x86_64-unknown-linux-gnu/release/linkerd-cni-sh /bin/sh
ENTRYPOINT ["/usr/local/bin/linkerd-cni-installer"]
