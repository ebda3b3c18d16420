//! Harness for the end-to-end tests in `tests/`: linkerd-cni driven by
//! libcni (the library containerd and CRI-O embed) on throwaway nodes made
//! of network namespaces and temp dirs, next to the reference CNI plugins.
//! What the tests cover, what they need and how to run them: the README's
//! "Conformance tests".
//!
//! Why libcni and not our own runner: nothing here was written by the
//! people who wrote the plugin's protocol layer except the glue; config
//! lookup, chaining, result conversion, the result cache and error decoding
//! are libcni's own code. Each module's doc says what it owns; the fixtures
//! (namespaces, temp dirs, the fake API server, the nat-table reader and
//! reference rules) are testkit's.
//!
//! Set-up failures (not root, a package missing, `ip netns add` failing)
//! panic with what failed: they are broken test environments, not outcomes.
//! CNI operations return [`Outcome`], because their failure is often the
//! thing a test asserts.
//!
//! # Extending
//!
//! - **Kubernetes.** [`Node::start_api_server`] starts the API server in the
//!   node and writes the kubeconfig (which also enables the plugin's chain
//!   repair, done only while that file exists); [`kube::serve_meshed`] and
//!   [`kube::serve_unmeshed`] register pods and return their [`PodSpec`].
//! - **Self-heal.** Write stale, duplicated or misplaced entries with
//!   [`Node::write_conf`], ADD, then judge [`Node::read_active`] with
//!   [`active::ActiveConf::healthy_with`].
//! - **Installer.** [`installer::start`] on a
//!   [`Node::without_linkerd_cni`] (the installer puts the binary in place);
//!   [`installer::expected_entry`] is what it must render.
//! - **Concurrency.** [`Node`] is `Sync` and every call uses its own trace
//!   file: `std::thread::scope` with many threads each doing
//!   `node.add(&net, &pod)` works as is.
//! - **Benchmarks** (the `linkerd-cni-tools` crate). [`Node::driver_command`]
//!   gives the exact command to time; [`Exec::duration`] is each plugin's own
//!   wall time as libcni saw it, so a benchmark can separate linkerd-cni from
//!   the primary.

pub mod active;
pub mod agent;
pub mod artifacts;
pub mod chains;
// The CRI tier: containerd driven over CRI, and the image as the
// DaemonSet runs it.
pub mod cri;
pub mod driver;
pub mod expect;
pub mod installer;
pub mod kube;
pub mod modes;
pub mod node;
pub mod results;
pub mod sys;

pub use driver::{Completed, Exec, Failed, Outcome};
pub use node::{Node, Pod, PodSpec};
pub use testkit::iptables::{self, Backend, Family, NatTable};
