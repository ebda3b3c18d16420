//! Pod sandboxes as the tests use them: created through CRI with the pod's
//! Kubernetes identity, their network namespace reachable from the test
//! (containerd's netns mounts live in its private mount namespace: the
//! sandbox's pause process gives the way in), stopped and removed as the
//! kubelet does, also when a test fails.

use std::process::Command;

use testkit::iptables::{default_save, normalize_save};

use super::api::{SandboxSpec, SandboxStatus};
use super::containerd::CriNode;
use super::grpc::GrpcError;
use crate::sys;

/// A sandbox; stopped and removed on drop if the test did not.
#[derive(Debug)]
pub struct Sandbox<'a> {
    node: &'a CriNode,
    id: String,
    removed: bool,
}

impl CriNode {
    /// `RunPodSandbox` for pod `namespace/name`, as the kubelet calls it:
    /// the CNI ADD of the node's active chain runs inside.
    pub fn run_pod(&self, namespace: &str, name: &str) -> Result<Sandbox<'_>, GrpcError> {
        self.run_pod_spec(&self.sandbox_spec(namespace, name))
    }

    /// `RunPodSandbox` for `spec`: the kubelet retrying a pod's sandbox
    /// sends the same pod (name, namespace, uid) again, and the runtime
    /// gives each attempt a new sandbox id.
    pub fn run_pod_spec(&self, spec: &SandboxSpec) -> Result<Sandbox<'_>, GrpcError> {
        let id = self.cri().run_pod_sandbox(spec)?;
        Ok(Sandbox {
            node: self,
            id,
            removed: false,
        })
    }
}

impl CriNode {
    /// The sandbox `id` (from [`Sandbox::detach`]), stopped and removed on
    /// drop again.
    pub fn sandbox(&self, id: String) -> Sandbox<'_> {
        Sandbox {
            node: self,
            id,
            removed: false,
        }
    }
}

impl Sandbox<'_> {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Its id, for [`CriNode::sandbox`], without stopping it: across
    /// [`CriNode::restart_containerd`], which needs the node alone. Should
    /// the test fail meanwhile, the node's teardown removes it.
    pub fn detach(mut self) -> String {
        self.removed = true;
        std::mem::take(&mut self.id)
    }

    /// `PodSandboxStatus` (verbose).
    pub fn status(&self) -> SandboxStatus {
        self.node
            .cri()
            .pod_sandbox_status(&self.id)
            .unwrap_or_else(|e| panic!("PodSandboxStatus {}: {e}", self.id))
    }

    /// The sandbox's network namespace, under a name of this harness.
    pub fn netns(&self) -> SandboxNetns {
        let st = self.status();
        let pid = st
            .pid()
            .unwrap_or_else(|| panic!("no pid in the sandbox's status: {st:?}"));
        SandboxNetns::attach(pid)
    }

    /// `StopPodSandbox` (CNI DEL).
    pub fn stop(&self) -> Result<(), GrpcError> {
        self.node.cri().stop_pod_sandbox(&self.id)
    }

    /// `StopPodSandbox` then `RemovePodSandbox`, as the kubelet does when
    /// a pod is deleted.
    pub fn stop_and_remove(mut self) -> Result<(), GrpcError> {
        self.stop()?;
        self.node.cri().remove_pod_sandbox(&self.id)?;
        self.removed = true;
        Ok(())
    }
}

impl Drop for Sandbox<'_> {
    fn drop(&mut self) {
        if !self.removed {
            let cri = self.node.cri();
            if let Err(e) = cri
                .stop_pod_sandbox(&self.id)
                .and_then(|_| cri.remove_pod_sandbox(&self.id))
            {
                eprintln!("conformance: removing sandbox {}: {e}", self.id);
            }
        }
    }
}

/// A sandbox's netns, attached under `/run/netns/lcnic-sbx-<pid>-<n>`
/// (`ip netns attach`) for the iptables readers; the name is deleted on
/// drop (the namespace itself belongs to containerd).
#[derive(Debug)]
pub struct SandboxNetns {
    name: String,
}

/// Every backend's and family's `*-save` tool.
const SAVE_TOOLS: [&str; 4] = [
    "iptables-legacy-save",
    "iptables-nft-save",
    "ip6tables-legacy-save",
    "ip6tables-nft-save",
];

/// The one the shipped entry's `iptables-mode` writes IPv4 rules with.
fn ours() -> &'static str {
    testkit::chart::backend().save_tool(testkit::iptables::Family::V4)
}

impl SandboxNetns {
    fn attach(pid: u32) -> SandboxNetns {
        let name = testkit::unique_name("sbx");
        sys::checked(Command::new("ip").args(["netns", "attach", &name, &pid.to_string()]));
        SandboxNetns { name }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `argv` inside the sandbox (`ip netns exec`): its stdout; panics with
    /// its stderr when it fails.
    fn exec_ok(&self, argv: &[&str]) -> String {
        let out = sys::output(
            Command::new("ip")
                .args(["netns", "exec", &self.name])
                .args(argv),
        );
        assert!(
            out.status.success(),
            "{argv:?} in sandbox netns {} failed: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Every backend's and family's nat table, normalized.
    pub fn nat_tables(&self) -> Vec<(&'static str, String)> {
        SAVE_TOOLS
            .iter()
            .map(|tool| (*tool, self.nat_table(tool)))
            .collect()
    }

    /// `<tool> -t nat` in the sandbox, normalized.
    fn nat_table(&self, tool: &str) -> String {
        let out =
            sys::output(Command::new("ip").args(["netns", "exec", &self.name, tool, "-t", "nat"]));
        assert!(
            out.status.success(),
            "{tool} -t nat in sandbox netns {} failed ({}): {}{}",
            self.name,
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        normalize_save(&String::from_utf8_lossy(&out.stdout))
    }

    /// Whether any linkerd-cni chain is in any nat table.
    pub fn has_linkerd_rules(&self) -> bool {
        self.nat_tables()
            .iter()
            .any(|(_, t)| t.contains("PROXY_INIT"))
    }

    /// The reference rules for linkerd's defaults, exactly, in the IPv4
    /// table of the shipped entry's backend, and no rule anywhere else.
    pub fn expect_reference_rules(&self) {
        for (tool, table) in self.nat_tables() {
            if tool == ours() {
                assert_eq!(table, default_save(), "{tool} in the sandbox");
            } else {
                assert!(!table.contains("\n-A "), "{tool} in the sandbox:\n{table}");
            }
        }
    }

    /// No nat rule at all, in any backend or family.
    pub fn expect_no_rules(&self) {
        for (tool, table) in self.nat_tables() {
            assert!(!table.contains("\n-A "), "{tool} in the sandbox:\n{table}");
            assert!(
                !table.contains("PROXY_INIT"),
                "{tool} in the sandbox:\n{table}"
            );
        }
    }

    /// The names of the sandbox's links but loopback (`ip -o link`): one
    /// per network the runtime attached it to.
    pub fn links(&self) -> Vec<String> {
        let out = self.exec_ok(&["ip", "-o", "link", "show"]);
        // `2: eth0@if7: <BROADCAST,...`: the name before any `@peer`.
        out.lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n).to_string())
            .filter(|n| n != "lo")
            .collect()
    }

    /// Every IPv4 address (`a.b.c.d/len`) in the sandbox but loopback's.
    pub fn ipv4_addrs_all(&self) -> Vec<String> {
        let out = self.exec_ok(&["ip", "-4", "-o", "addr", "show"]);
        crate::node::inet_addrs(&out)
            .into_iter()
            .filter(|a| !a.starts_with("127."))
            .collect()
    }

    /// The IPv4 addresses (`a.b.c.d/len`) on `ifname`.
    pub fn ipv4_addrs(&self, ifname: &str) -> Vec<String> {
        let out = self.exec_ok(&["ip", "-4", "-o", "addr", "show", "dev", ifname]);
        crate::node::inet_addrs(&out)
    }
}

impl Drop for SandboxNetns {
    fn drop(&mut self) {
        let out = sys::output(Command::new("ip").args(["netns", "del", &self.name]));
        if !out.status.success() {
            eprintln!(
                "conformance: could not delete netns name {}: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
