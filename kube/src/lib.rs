//! The Kubernetes API as linkerd-cni's plugin uses it: read the kubeconfig
//! ([`kubeconfig`]), call the API server within a time budget,
//! synchronously and without an async runtime ([`client`]), the fields of
//! the objects it reads ([`objects`]), and the claims of a service-account
//! token ([`token`]). The node agent shares the kubeconfig, the objects,
//! the token claims and the errors ([`ApiError`]); its own calls go
//! through kube-rs.

pub mod client;
pub mod kubeconfig;
pub mod names;
pub mod objects;
pub mod text;
pub mod token;

pub use client::{ApiError, Client};
pub use kubeconfig::{ApiConfig, KubeconfigError, Trust};
