//! linkerd-cni: a chained CNI plugin that installs Linkerd's proxy redirect
//! rules in each meshed pod's network namespace, and keeps itself chained in
//! the node's active conflist.
//!
//! The crate is the plugin binary and its library (for its tests and the
//! conformance tools); the installer does not depend on it:
//!
//! - [`cni`]: the CNI protocol (environment, the stdin network config as
//!   every plugin reads it, results, errors).
//! - [`heal`]: keeping the chain on every ADD within a budget, through the
//!   chain library's keeper (`linkerd_cni_chain`), which the installer and
//!   the repair controller share.
//! - [`config`]: linkerd-cni's own keys of that network config, compatible
//!   with upstream's.
//! - [`plugin`]: what each CNI command does.
//! - [`logging`]: stderr and syslog logging, never stdout.
//! - [`outcome`]: how each ADD ended, counted in the state dir.
//! - [`pod`]: the per-pod work of ADD and CHECK, built on `linkerd_cni_kube` (the
//!   Kubernetes API), [`iptables`] (the redirect rules) and [`netns`]
//!   (entering the pod's network namespace).

pub mod cni;
pub mod config;
pub mod heal;
pub mod iptables;
pub mod logging;
pub mod netns;
pub mod outcome;
pub mod plugin;
pub mod pod;

/// `s` as an unsigned decimal, digits only, as Go's `strconv.ParseUint`
/// reads it: Rust's `from_str` would also take a leading `+`.
pub(crate) fn decimal<T: std::str::FromStr>(s: &str) -> Option<T> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}
