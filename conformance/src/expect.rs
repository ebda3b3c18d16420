//! Assertions the conformance tests share: what libcni ran, what linkerd-cni
//! handed back, what is in a pod's nat table, what host-local still holds.
//! Each panics with the whole libcni trace or table, so a failure says what
//! happened.

use serde_json::Value;

use crate::driver::Completed;
use crate::node::{Node, Pod};
use crate::results::exact;
use testkit::iptables::{Backend, Family, NatTable};

/// The commands and plugins libcni ran, in order.
pub fn steps(run: &Completed) -> Vec<(String, String)> {
    run.trace
        .iter()
        .map(|e| (e.command.clone(), e.plugin.clone()))
        .collect()
}

/// libcni ran exactly `plugins`, in this order, each with `command`.
pub fn expect_steps(run: &Completed, command: &str, plugins: &[&str]) {
    let want: Vec<(String, String)> = plugins
        .iter()
        .map(|p| (command.to_string(), p.to_string()))
        .collect();
    assert_eq!(steps(run), want, "{run:?}");
}

/// "ADD returns the primary's result unchanged", checked on what libcni
/// actually exchanged with the plugins:
/// - linkerd-cni, last, printed exactly the prevResult libcni gave it (same
///   keys, same order, same numbers), at the list's cniVersion;
/// - that prevResult is the previous plugin's result, and not an empty one;
/// - what libcni returned to the runtime is what linkerd-cni printed.
pub fn expect_pass_through(run: &Completed, version: &str) {
    let (last, before) = match run.trace.as_slice() {
        [.., before, last] => (last, before),
        _ => panic!("linkerd-cni was not chained: {run:?}"),
    };
    assert_eq!(last.plugin, "linkerd-cni", "{run:?}");
    assert_eq!(last.error, None, "{run:?}");
    let prev = last
        .prev_result()
        .unwrap_or_else(|| panic!("libcni gave linkerd-cni no prevResult: {run:?}"));
    let printed = last
        .stdout_json()
        .unwrap_or_else(|| panic!("linkerd-cni printed no JSON: {:?}", last.stdout));
    assert_eq!(
        exact(&printed),
        exact(prev),
        "linkerd-cni changed the result"
    );
    assert_eq!(printed["cniVersion"], version);

    let primary_result = before
        .stdout_json()
        .unwrap_or_else(|| panic!("the previous plugin printed no JSON: {run:?}"));
    assert_eq!(prev, &primary_result, "libcni's prevResult for linkerd-cni");
    assert!(
        prev["ips"].as_array().is_some_and(|ips| !ips.is_empty()),
        "an empty prevResult proves nothing: {prev}"
    );
    assert_eq!(run.json(), printed, "libcni's result differs from ours");
}

/// The result's first address is really on the pod's `eth0`.
pub fn expect_address_in_pod(pod: &Pod, result: &Value) {
    let addr = result["ips"][0]["address"]
        .as_str()
        .unwrap_or_else(|| panic!("no address in {result}"));
    let have = pod.ipv4_addrs("eth0");
    assert!(
        have.iter().any(|a| a == addr),
        "{addr} not on eth0: {have:?}"
    );
}

/// Nothing at all in the pod's nat tables, for either backend and family
/// (no chain of the reference plugins writes into the pod).
pub fn expect_no_nat_rules(pod: &Pod) {
    for table in pod.nat_tables() {
        assert!(table.linkerd_lines().is_empty(), "{table}");
        assert!(table.rules().is_empty(), "{table}");
        assert!(
            !table.chains().iter().any(|c| c.starts_with("PROXY_INIT")),
            "{table}"
        );
    }
}

/// The pod's nat tables hold exactly the reference rules for linkerd's
/// defaults in `backend`'s IPv4 table (the whole table, counters zeroed,
/// compared with testkit's copy of that text), and nothing in the other
/// backend or in IPv6.
pub fn expect_reference_rules(pod: &Pod, backend: Backend) {
    for table in pod.nat_tables() {
        if (table.backend, table.family) == (backend, Family::V4) {
            assert_eq!(
                testkit::iptables::normalize_save(&table.text),
                testkit::iptables::default_save(),
                "{table}"
            );
        } else {
            assert!(table.rules().is_empty(), "{table}");
            assert!(table.linkerd_lines().is_empty(), "{table}");
        }
    }
}

/// host-local keeps one file per reserved address: none may be left after
/// every pod's DEL (a blocked DEL leaks pod IPs).
pub fn expect_no_reserved_ips(node: &Node, network: &str) {
    let left = reserved_ips(node, network);
    assert!(left.is_empty(), "addresses still reserved: {left:?}");
}

/// The addresses host-local holds for `network` on `node`.
pub fn reserved_ips(node: &Node, network: &str) -> Vec<String> {
    let dir = node.ipam_dir().join(network);
    std::fs::read_dir(&dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The node's own IPv4 nat tables (portmap writes with whichever
/// `iptables` the node has), concatenated.
pub fn node_nat(node: &Node) -> String {
    Backend::ALL
        .iter()
        .map(|b| NatTable::read(node.netns(), *b, Family::V4).text)
        .collect()
}
