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
//! # Extension points (part 2 of the conformance issue)
//!
//! - **Meshed pods.** The testkit crate's fake TLS Kubernetes API server must
//!   be reachable from the plugin, which runs in the node netns: start it
//!   inside with [`Node::enter`] (a thread that `setns`es into the node;
//!   a listener bound there stays in that netns, and threads spawned there
//!   start in it), write its kubeconfig to the path
//!   [`chains::linkerd_entry`] names (`<conf dir>/ZZZ-linkerd-cni-kubeconfig`),
//!   then ADD [`PodSpec::kubernetes`] pods and compare
//!   [`NatTable::linkerd_lines`] of each backend with reference.md's text.
//! - **Self-heal.** Set `"chain_heal": true` in the entry (the part 1 tests
//!   set it to false), write stale, duplicated or misplaced entries with
//!   [`Node::write_conf`], ADD, then read [`Node::active_conf`] (the
//!   runtime's choice, written here independently of the plugin's library).
//! - **Installer.** [`artifacts::workspace_bin`]`("linkerd-cni-installer",
//!   "linkerd-cni-installer")` builds it; run it with [`Netns::command`] of
//!   the node, `DEST_CNI_NET_DIR`/`DEST_CNI_BIN_DIR` set to
//!   [`Node::conf_dir`]/[`Node::bin_dir`], and the API server as above.
//!   [`Node::new`] links `linkerd-cni` into the bin dir itself; a node for
//!   installer tests needs a constructor that leaves that to the installer
//!   (split [`Node::new`]'s last step out).
//! - **Concurrency.** [`Node`] is `Sync` and every call uses its own trace
//!   file: `std::thread::scope` with 50 threads each doing
//!   `node.add(&net, &node.pod(..))` works as is.
//! - **Benchmarks.** [`Node::driver_command`] gives the exact command to
//!   time; [`Exec::duration`] is each plugin's own wall time as libcni saw
//!   it, so a benchmark can separate linkerd-cni from the primary.

pub mod artifacts;
pub mod chains;
pub mod driver;
pub mod iptables;
pub mod node;
pub mod results;
pub mod sys;

pub use driver::{Completed, Exec, Failed, Outcome};
pub use iptables::{Backend, Family, NatTable};
pub use node::{Node, Pod, PodSpec};
pub use sys::Netns;
