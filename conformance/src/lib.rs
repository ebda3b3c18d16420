//! Harness for the end-to-end tests in `tests/`: linkerd-cni driven by
//! libcni — the library containerd and CRI-O embed — on throwaway nodes made
//! of network namespaces and temp dirs, next to the reference CNI plugins.
//! Nothing here was written by the people who wrote the plugin's protocol
//! layer except the glue: config lookup, chaining, result conversion, the
//! result cache and error decoding are libcni's own code.
//!
//! # Pieces
//!
//! - [`artifacts`]: builds the Go driver (`cnidriver/main.go`, against
//!   Debian's libcni source, GOPATH mode, offline) and the workspace binaries
//!   (a nested `cargo build` for the running profile), once per process.
//! - [`node`]: [`Node`] — a netns standing in for the host, with its own
//!   conf dir, bin dir (symlinks to `/usr/lib/cni/*` and our `linkerd-cni`),
//!   libcni cache and IPAM state; [`Pod`] — a netns, a container ID and the
//!   kubelet's `CNI_ARGS`. The driver always runs inside the node netns, so
//!   bridges, veths and portmap rules never reach the machine's own network.
//! - [`driver`]: what one libcni call returned ([`Completed`] or [`Failed`],
//!   the latter with the CNI error object libcni decoded) and the trace of
//!   every plugin execution libcni made (stdin with `prevResult`, stdout,
//!   stderr): the tests compare what libcni handed linkerd-cni with what it
//!   printed.
//! - [`iptables`]: `*-save -t nat` inside a netns, legacy and nft, v4 and v6.
//! - [`results`]: comparing results across pods (masking MACs, netns
//!   paths and randomly named node-side links).
//! - [`chains`]: configs of reference-plugin chains, and linkerd-cni's chart
//!   entry pointed at the node.
//! - [`kube`]: testkit's fake TLS Kubernetes API server inside the node
//!   netns, its kubeconfig where the entry names it, meshed and unmeshed
//!   pods.
//! - [`active`]: the node's active config read as a runtime reads it, and
//!   judged healthy or not without the plugin's chain library.
//! - [`installer`]: the real `linkerd-cni-installer` running against a node
//!   (mount prefix, image bin dir and service account in temp dirs).
//! - [`expect`]: the assertions the tests share (pass-through results,
//!   reference rules, no rules, no reserved addresses).
//! - [`sys`]: unique names (`lcnic-<kind>-<pid>-<n>`), Drop guards for netns
//!   and temp dirs (they run on panic too), `setns`, the root/package check
//!   (a test on an unfit machine fails and says why; it never passes
//!   silently), and removal of what a SIGKILLed earlier run left behind.
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
//! - **Installer.** [`installer::Installer::start`] on a
//!   [`Node::without_linkerd_cni`] (the installer puts the binary in place);
//!   [`installer::expected_entry`] is what it must render.
//! - **Concurrency.** [`Node`] is `Sync` and every call uses its own trace
//!   file: `std::thread::scope` with many threads each doing
//!   `node.add(&net, &pod)` works as is.
//! - **Benchmarks.** [`Node::driver_command`] gives the exact command to
//!   time; [`Exec::duration`] is each plugin's own wall time as libcni saw
//!   it, so a benchmark can separate linkerd-cni from the primary.

pub mod active;
pub mod artifacts;
pub mod chains;
pub mod driver;
pub mod expect;
pub mod installer;
pub mod iptables;
pub mod kube;
pub mod mode_bench;
pub mod modes;
pub mod node;
pub mod results;
// The demo and the benchmarks (src/bin/): whole-node scenarios, their
// statistics, and the supervisor that cleans up after them.
pub mod scenario;
pub mod stats;
pub mod supervise;
pub mod sys;

pub use driver::{Completed, Exec, Failed, Outcome};
pub use iptables::{Backend, Family, NatTable};
pub use node::{Node, Pod, PodSpec};
pub use sys::Netns;
