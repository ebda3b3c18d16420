//! The Kubernetes API, as far as the plugin needs it: read the kubeconfig
//! ([`kubeconfig`]), GET a pod, its namespace and the `kubernetes` Service
//! ([`client`]), and the fields of those objects it reads ([`objects`]);
//! for the installer, whether its DaemonSet is gone ([`owner`]) and
//! removing a startup taint from a node ([`taint`]).

pub mod client;
pub mod kubeconfig;
pub mod objects;
pub mod owner;
pub mod taint;

pub use client::{ApiError, Client};
pub use kubeconfig::{ApiConfig, KubeconfigError, Trust};
