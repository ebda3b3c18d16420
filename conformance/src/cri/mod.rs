//! The CRI tier: linkerd-cni under a real container runtime, containerd's
//! CRI plugin, driven over its gRPC socket the way the kubelet drives it,
//! and linkerd-cni's image run by that containerd the way the DaemonSet
//! runs it.
//!
//! - [`containerd`]: [`CriNode`], a [`crate::Node`] with a containerd of its
//!   own (own root, state, socket, config, the node's CNI dirs, a private
//!   mount namespace; its config where the node's installers read the
//!   runtime's settings), restartable with another `max_conf_num`, torn
//!   down on drop and checked clean by [`CriNode::shutdown`].
//! - [`image`]: OCI image archives written by the harness: the pause image
//!   (a static C program) and linkerd-cni's image with the Dockerfile's
//!   layout.
//! - [`api`], [`grpc`], [`wire`]: the CRI client (`runtime.v1`), unary gRPC
//!   over HTTP/2 on a Unix socket, and the protobuf encoding.
//! - [`pods`]: sandboxes as tests use them: run, inspect the sandbox's
//!   netns, stop and remove.
//! - [`measure`]: measurements the tests and benchmarks share: meshed pods
//!   that came up unmeshed while the primary rewrites its config, per way
//!   of keeping the chain; sandbox creation time with and without
//!   linkerd-cni.
//! - [`daemonset`]: linkerd-cni's image started with `ctr run` as the
//!   linkerd2-cni chart's install-cni container starts it, or as
//!   `deploy/linkerd-cni.yaml`'s one container (installer, repair
//!   controller and lookup agent) does.

pub mod api;
pub mod containerd;
pub mod daemonset;
pub mod grpc;
pub mod image;
pub mod measure;
pub mod pods;
pub mod wire;

use std::path::Path;

pub use api::{Cri, SandboxSpec, SandboxStatus};
pub use containerd::CriNode;
pub use pods::Sandbox;

fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."))
}
