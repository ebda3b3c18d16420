//! The real installer's `/metrics`: off by default (no socket, no thread);
//! on, each counter moves by exactly what the test made happen (repairs, a
//! fight, a repair held back), and an idle installer writes nothing into
//! the conf dir however often it is scraped.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use common::*;

/// The address the installer says it serves on.
fn metrics_addr(inst: &Installer) -> SocketAddr {
    let needle = "serving /metrics on http://";
    assert!(inst.wait_log(needle, GRACE * 8), "{}", inst.log());
    let log = inst.log();
    let rest = &log[log.find(needle).unwrap() + needle.len()..];
    rest[..rest.find("/metrics").unwrap()].parse().unwrap()
}

/// Starts the installer with metrics on (resync 1 s) and waits until the
/// node is chained.
fn start_chained(node: &Node) -> (Installer, SocketAddr) {
    let inst = node.start(&[
        ("LINKERD_CNI_RESYNC_SECONDS", "1"),
        ("LINKERD_CNI_METRICS_ADDR", "127.0.0.1:0"),
    ]);
    let addr = metrics_addr(&inst);
    node.wait_healthy(GRACE * 4)
        .unwrap_or_else(|e| panic!("{e}\n{}", inst.log()));
    (inst, addr)
}

/// One scrape: each sample line as `name{labels}` -> value.
fn scrape(addr: SocketAddr) -> BTreeMap<String, f64> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: node\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

/// A scrape once `key` has reached `want` (the pass records a repair just
/// after its write, which the test may see first).
fn scrape_when(addr: SocketAddr, key: &str, want: f64) -> BTreeMap<String, f64> {
    let mut last = BTreeMap::new();
    let reached = wait_until(GRACE * 8, || {
        last = scrape(addr);
        last.get(key).copied().unwrap_or_default() >= want
    });
    assert!(reached, "{key} never reached {want}: {last:#?}");
    last
}

fn get(m: &BTreeMap<String, f64>, key: &str) -> f64 {
    *m.get(key).unwrap_or_else(|| panic!("no {key} in {m:#?}"))
}

/// The values that differ between two scrapes, as `after - before`.
fn moved(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .filter(|(k, _)| {
            !k.contains("timestamp") && !k.contains("_sum") && *k != "linkerd_cni_passes_total"
        })
        .filter_map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0.0);
            (d != 0.0).then(|| (k.clone(), d))
        })
        .collect()
}

/// Network (TCP and UDP) sockets the process holds, and its thread count.
/// Not its Unix sockets: tokio's runtime keeps a socket pair for its
/// signal handling, which reaches no network.
fn sockets_and_threads(pid: u32) -> (usize, usize) {
    let inet: Vec<String> = ["tcp", "tcp6", "udp", "udp6"]
        .iter()
        .filter_map(|t| std::fs::read_to_string(format!("/proc/{pid}/net/{t}")).ok())
        .flat_map(|table| {
            let inodes: Vec<String> = table
                .lines()
                .skip(1)
                .filter_map(|l| l.split_whitespace().nth(9).map(str::to_string))
                .collect();
            inodes
        })
        .collect();
    let sockets = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|t| {
                let t = t.to_string_lossy();
                t.strip_prefix("socket:[")
                    .and_then(|i| i.strip_suffix(']'))
                    .is_some_and(|i| inet.iter().any(|n| n == i))
            })
        })
        .count();
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .count();
    (sockets, threads)
}

#[test]
fn metrics_off_means_no_socket_and_no_thread() {
    let node = Node::new("metrics-off");
    node.write_by_rename("10-calico.conflist", &calico_text(0));
    let inst = node.start(&[("LINKERD_CNI_RESYNC_SECONDS", "1")]);
    node.wait_healthy(GRACE * 4)
        .unwrap_or_else(|e| panic!("{e}\n{}", inst.log()));
    // Past a few passes (resync 1 s).
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(sockets_and_threads(inst.id()), (0, 1), "{}", inst.log());
    assert!(!inst.log().contains("/metrics"), "{}", inst.log());

    // The same node with metrics on: one socket (the listener), one thread
    // more. The measure above can tell them apart.
    drop(inst);
    let inst = node.start(&[
        ("LINKERD_CNI_RESYNC_SECONDS", "1"),
        ("LINKERD_CNI_METRICS_ADDR", "127.0.0.1:0"),
    ]);
    metrics_addr(&inst);
    assert_eq!(sockets_and_threads(inst.id()), (1, 2), "{}", inst.log());
}

/// The conf dir's entries: name, inode, size and mtime.
fn conf_dir_state(dir: &Path) -> Vec<(String, u64, u64, i64, i64)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| {
            let m = e.metadata().unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                m.ino(),
                m.size(),
                m.mtime(),
                m.mtime_nsec(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn counters_move_by_exactly_what_happened() {
    let node = Node::new("metrics");
    node.write_by_rename("10-calico.conflist", &calico_text(0));
    let (inst, addr) = start_chained(&node);
    const REPAIRS: &str = "linkerd_cni_chain_repairs_total{cause=\"missing\"}";
    scrape_when(addr, REPAIRS, 1.0);
    // The verdict is recorded at the end of that pass.
    let start = scrape_when(addr, "linkerd_cni_chain_healthy{mode=\"inline\"}", 1.0);
    assert_eq!(
        get(&start, "linkerd_cni_chain_healthy{mode=\"inline\"}"),
        1.0
    );
    // The first chaining was a repair of a chain without our entry.
    assert_eq!(
        get(&start, "linkerd_cni_chain_repairs_total{cause=\"missing\"}"),
        1.0
    );
    // The first pass's: no heal-latency sample (it would be the time the
    // node spent without an installer).
    assert_eq!(
        get(&start, "linkerd_cni_chain_heal_latency_seconds_count"),
        0.0
    );
    assert_eq!(
        get(
            &start,
            "linkerd_cni_chain_mode{configured=\"inline\",selected=\"inline\",reason=\"inline, the default (no chain_mode in the entry)\"}"
        ),
        1.0
    );
    assert_eq!(
        get(
            &start,
            "linkerd_cni_plugin_adds_total{outcome=\"meshed\",cause=\"\"}"
        ),
        0.0
    );

    // Idle: scraped again and again over three passes, the conf dir is
    // untouched.
    let before = conf_dir_state(&node.conf_dir);
    let passes = get(&start, "linkerd_cni_passes_total");
    assert!(wait_until(GRACE * 8, || get(
        &scrape(addr),
        "linkerd_cni_passes_total"
    ) >= passes + 3.0));
    assert_eq!(conf_dir_state(&node.conf_dir), before, "written while idle");
    assert_eq!(moved(&start, &scrape(addr)), BTreeMap::new());

    // A primary writing its own new content: one repair.
    node.write_by_rename("10-calico.conflist", &calico_text(1));
    node.wait_healthy(GRACE * 4)
        .unwrap_or_else(|e| panic!("{e}\n{}", inst.log()));
    let after_one = scrape_when(addr, REPAIRS, 2.0);
    assert_eq!(
        moved(&start, &after_one),
        BTreeMap::from([
            (
                "linkerd_cni_chain_repairs_total{cause=\"missing\"}".into(),
                1.0
            ),
            ("linkerd_cni_chain_heal_latency_seconds_count".into(), 1.0),
            (
                "linkerd_cni_chain_heal_latency_seconds_bucket{le=\"+Inf\"}".into(),
                1.0
            ),
        ])
        .into_iter()
        .chain(buckets_moved(&start, &after_one))
        .collect()
    );

    // Another agent undoing the repair with the same content, again and
    // again: the 10th repair of that content within 60 s is a fight.
    for v in 1..=10 {
        node.write_by_rename("10-calico.conflist", &calico_text(7));
        node.wait_healthy(GRACE * 4)
            .unwrap_or_else(|e| panic!("rewrite {v}: {e}\n{}", inst.log()));
    }
    assert!(inst.wait_log("repairs within", GRACE * 4), "{}", inst.log());
    scrape_when(addr, REPAIRS, 12.0);
    // Recorded right after the repair that made it one.
    let fought = scrape_when(addr, "linkerd_cni_chain_fights_total", 1.0);
    let m = moved(&after_one, &fought);
    assert_eq!(
        m["linkerd_cni_chain_repairs_total{cause=\"missing\"}"],
        10.0
    );
    assert_eq!(m["linkerd_cni_chain_fights_total"], 1.0);
    assert_eq!(m["linkerd_cni_chain_heal_latency_seconds_count"], 10.0);
    assert!(
        !m.contains_key("linkerd_cni_chain_repairs_held_back_total"),
        "{m:?}"
    );

    // Once more: held back by the limit (counted once, however many
    // passes see it), then repaired when the limit allows; still the same
    // fight.
    node.write_by_rename("10-calico.conflist", &calico_text(7));
    assert!(
        inst.wait_log("not repairing it again yet", GRACE * 4),
        "{}",
        inst.log()
    );
    node.wait_healthy(Duration::from_secs(6) + GRACE * 4)
        .unwrap_or_else(|e| panic!("{e}\n{}", inst.log()));
    scrape_when(addr, REPAIRS, 13.0);
    // Healthy again at the end of that pass (the held-back one said not).
    let m = moved(
        &fought,
        &scrape_when(addr, "linkerd_cni_chain_healthy{mode=\"inline\"}", 1.0),
    );
    assert_eq!(m["linkerd_cni_chain_repairs_held_back_total"], 1.0, "{m:?}");
    assert_eq!(
        m["linkerd_cni_chain_repairs_total{cause=\"missing\"}"], 1.0,
        "{m:?}"
    );
    assert!(!m.contains_key("linkerd_cni_chain_fights_total"), "{m:?}");
    // Nothing the test did not do.
    assert!(
        m.keys()
            .all(|k| k.contains("repairs") || k.contains("heal_latency")),
        "{m:?}"
    );
}

/// The finite heal-latency buckets that moved.
fn buckets_moved(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> Vec<(String, f64)> {
    moved(before, after)
        .into_iter()
        .filter(|(k, _)| k.contains("_bucket{") && !k.contains("+Inf"))
        .collect()
}

/// `status` for a person on the node: the chain, readiness and the
/// plugin's counters from disk, the running installer's repairs from its
/// `/metrics` on its admin socket; exit 0 healthy, 1 not.
#[test]
fn status_shows_the_same_state() {
    let node = Node::new("status");
    node.write_by_rename("10-calico.conflist", &calico_text(0));
    // Before any install: not healthy, and says why.
    let o = node.run(&["status"], &[]);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(text.contains("chain:         NOT healthy"), "{text}");
    assert!(text.contains("installer:     metrics off"), "{text}");

    let (_inst, addr) = start_chained(&node);
    scrape_when(addr, "linkerd_cni_chain_healthy{mode=\"inline\"}", 1.0);
    let o = node.run(
        &["status"],
        &[("LINKERD_CNI_METRICS_ADDR", &addr.to_string())],
    );
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    eprintln!("{text}");
    assert_eq!(o.status.code(), Some(0), "{text}");
    for want in [
        "mode:          inline\n",
        "mode chosen:   inline, the default (no chain_mode in the entry)\n",
        "chain:         healthy",
        "ready:         yes\n",
        "plugin ADDs:   meshed 0, unmeshed 0, exempt 0, passed through 0, try again 0, failed 0",
        "; repairs 1 (missing 1); fights 0; repairs held back 0",
    ] {
        assert!(text.contains(want), "no {want:?} in\n{text}");
    }
    // Asked on the root-only socket, which no pod can fill.
    let from = format!("(from /metrics on {})\n", admin_socket(&node).display());
    assert!(text.contains(&from), "no {from:?} in\n{text}");
}

/// Owned mode: the copy's creation and each primary rewrite it follows are
/// counted under their own causes, and the chain is healthy in owned mode.
#[test]
fn owned_mode_counts_its_copies() {
    let node = Node::new("metrics-owned");
    node.write_by_rename("10-calico.conflist", &calico_text(0));
    let inst = node.start(&[
        ("LINKERD_CNI_RESYNC_SECONDS", "1"),
        ("LINKERD_CNI_METRICS_ADDR", "127.0.0.1:0"),
        ("LINKERD_CNI_CHAIN_MODE", "owned"),
    ]);
    let addr = metrics_addr(&inst);
    const CREATED: &str = "linkerd_cni_chain_repairs_total{cause=\"owned_missing\"}";
    const FOLLOWED: &str = "linkerd_cni_chain_repairs_total{cause=\"owned_outdated\"}";
    scrape_when(addr, CREATED, 1.0);
    let start = scrape_when(addr, "linkerd_cni_chain_healthy{mode=\"owned\"}", 1.0);
    assert_eq!(
        get(
            &start,
            "linkerd_cni_chain_mode{configured=\"owned\",selected=\"owned\",reason=\"set in the entry (chain_mode)\"}"
        ),
        1.0,
        "{start:#?}"
    );

    node.write_by_rename("10-calico.conflist", &calico_text(1));
    let after = scrape_when(addr, FOLLOWED, 1.0);
    let m = moved(&start, &after);
    assert_eq!(m[FOLLOWED], 1.0, "{m:?}");
    assert_eq!(
        m["linkerd_cni_chain_heal_latency_seconds_count"], 1.0,
        "{m:?}"
    );
    assert!(
        m.keys()
            .all(|k| k == FOLLOWED || k.contains("heal_latency")),
        "only the copy followed the primary: {m:?}\n{}",
        inst.log()
    );
}

/// Silent connections as many as the server holds, from the scraper's own
/// address and from others, do not keep a scrape from its page: the oldest
/// of them make room. One address holds at most 4 of them.
#[test]
fn silent_connections_do_not_blind_a_scrape() {
    let node = Node::new("metrics-flood");
    node.write_by_rename("10-calico.conflist", &calico_text(0));
    let (_inst, addr) = start_chained(&node);
    let silent = |last: u8| testkit::connect_from([127, 0, 0, last].into(), addr).unwrap();
    let started = std::time::Instant::now();
    // 16 from the scraper's address.
    let held: Vec<TcpStream> = (0..16).map(|_| silent(1)).collect();
    scrape(addr);
    // 4 from each of 4 others: all the server holds.
    let mut others: Vec<TcpStream> = (2..6)
        .flat_map(|i| (0..4).map(move |_| i))
        .map(silent)
        .collect();
    // A fifth from one of them: its own oldest makes room, at once (not
    // at the 5 s header timeout).
    others.push(silent(2));
    let first = &mut others[0];
    first.set_read_timeout(Some(GRACE * 2)).unwrap();
    assert_eq!(first.read(&mut [0u8; 64]).unwrap_or(0), 0);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    scrape(addr);
    drop(held);
}

/// The state dir's admin socket.
fn admin_socket(node: &Node) -> std::path::PathBuf {
    node.prefix.join("run/linkerd-cni/admin.sock")
}

/// `check --live`, within a bound it must keep: its exit status and what
/// it said.
fn check_live(node: &Node) -> (bool, String) {
    let out = node
        .run_within(&["check", "--live"], Duration::from_secs(10))
        .expect("check --live ends within its own bound");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.success(), said)
}

/// The kubelet's liveness probe (deploy/'s `check --live`) asks on the
/// root-only socket, whose connections no pod can take: a flood of silent
/// connections on the metrics port, from many addresses, more than the
/// port's whole budget, does not fail it.
#[test]
fn liveness_answers_on_the_socket_while_the_port_is_flooded() {
    let node = Node::new("live-flood");
    node.write_by_rename("10-calico.conflist", &calico_text(0));
    let (inst, addr) = start_chained(&node);
    let flood: Vec<TcpStream> = (2..40)
        .flat_map(|i| [i; 4])
        .filter_map(|i| testkit::connect_from([127, 0, 0, i].into(), addr).ok())
        .collect();
    assert!(flood.len() > 64, "{}", flood.len());
    let (live, said) = check_live(&node);
    assert!(live, "{said}\n{}", inst.log());
    assert_eq!(
        said,
        format!("live: live (from {})\n", admin_socket(&node).display())
    );
    drop(flood);
}

/// `check --live` fails, saying why, and within its bound, when no
/// installer runs (no socket, or one left by a process that died) and
/// when the one running does not answer.
#[test]
fn liveness_fails_without_an_installer_or_with_a_hung_one() {
    let node = Node::new("live-none");
    let socket = admin_socket(&node);
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    let (live, said) = check_live(&node);
    assert!(!live, "{said}");
    assert!(
        said.starts_with("not live: the installer is not running on this node: nothing listens on"),
        "{said}"
    );
    // A socket file nobody listens on.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let (live, said) = check_live(&node);
    assert!(!live && said.contains("is not running"), "{said}");
    // Listening, never answering: what a hung process does.
    std::fs::remove_file(&socket).unwrap();
    let _hung = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let started = std::time::Instant::now();
    let (live, said) = check_live(&node);
    assert!(!live, "{said}");
    assert!(
        said.contains("did not answer") && said.contains("within 3 s: it is hung"),
        "{said}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
}
