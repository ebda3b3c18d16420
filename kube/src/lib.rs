//! The Kubernetes API as linkerd-cni's plugin uses it: read the kubeconfig
//! ([`kubeconfig`]), call the API server within a time budget,
//! synchronously and without an async runtime ([`client`]), the fields of
//! the objects it reads ([`objects`]), and the claims of a service-account
//! token ([`token`]). The node agent shares the kubeconfig, the objects,
//! the token claims and the errors ([`error`]); its own calls go through
//! kube-rs, so it leaves out the blocking client (feature `client`, on by
//! default) and, with it, ureq.

#[cfg(feature = "client")]
pub mod client;
pub mod error;
pub mod kubeconfig;
pub mod names;
pub mod objects;
pub mod text;
pub mod token;

#[cfg(feature = "client")]
pub use client::Client;
pub use error::ApiError;
pub use kubeconfig::{ApiConfig, KubeconfigError, Trust};
