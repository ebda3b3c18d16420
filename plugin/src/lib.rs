//! linkerd-cni: a chained CNI plugin that installs Linkerd's proxy redirect
//! rules in each meshed pod's network namespace, and keeps itself chained in
//! the node's active conflist.
//!
//! The crate is both the plugin binary and the library the installer shares:
//!
//! - [`cni`]: the CNI protocol (environment, stdin config, results, errors).
//! - [`config`]: linkerd-cni's config keys, compatible with upstream's.
//! - [`plugin`]: what each CNI command does.
//! - [`logging`]: stderr and syslog logging, never stdout.
//! - [`iptables`]: linkerd's redirect rules, applied in a pod's netns.
//! - [`k8s`]: the kubeconfig and the few Kubernetes API calls the plugin makes.
//! - [`netns`]: entering a network namespace without `nsenter`.

pub mod cni;
pub mod config;
pub mod iptables;
pub mod k8s;
pub mod logging;
pub mod netns;
pub mod plugin;
