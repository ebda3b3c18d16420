//! The Kubernetes API as linkerd-cni's plugin and installer use it, both
//! linking this crate: read the kubeconfig ([`kubeconfig`]), call the API
//! server within a time budget, synchronously and without an async runtime
//! ([`client`]), and the fields of the objects they read ([`objects`]);
//! for the installer, whether SIGTERM uninstalls the node ([`owner`]),
//! removing a startup taint from a node ([`taint`]), minting the plugin's
//! token ([`token`]), whether the plugin's token may get pods ([`review`])
//! and Events about its node ([`events`]).

pub mod client;
pub mod events;
pub mod kubeconfig;
pub mod names;
pub mod objects;
pub mod owner;
pub mod review;
pub mod taint;
pub mod text;
pub mod token;

pub use client::{ApiError, Client};
pub use kubeconfig::{ApiConfig, KubeconfigError, Trust};
