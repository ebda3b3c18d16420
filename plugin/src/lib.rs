//! linkerd-cni: a chained CNI plugin that installs Linkerd's proxy redirect
//! rules in each meshed pod's network namespace, and keeps itself chained in
//! the node's active conflist.
//!
//! The crate is both the plugin binary and the library the installer shares:
//!
//! - [`cni`]: the CNI protocol (environment, stdin config, results, errors).
//! - [`chain`]: keeping our entry last in the active conflist (diagnosis,
//!   repair, healing on ADD), shared with the installer.
//! - [`config`]: linkerd-cni's config keys, compatible with upstream's.
//! - [`plugin`]: what each CNI command does; [`owned_add`]: owned chain
//!   mode's sync and stale-copy check at ADD.
//! - [`logging`]: stderr and syslog logging, never stdout.
//! - [`pod`]: the per-pod work of ADD and CHECK, built on [`k8s`] (the
//!   Kubernetes API), [`iptables`] (the redirect rules) and [`netns`]
//!   (entering the pod's network namespace).

pub mod chain;
pub mod cni;
pub mod config;
pub mod iptables;
pub mod k8s;
pub mod logging;
pub mod netns;
pub mod owned_add;
pub mod plugin;
pub mod pod;
