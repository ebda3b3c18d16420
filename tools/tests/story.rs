//! A whole demo run tells the story the README promises, each step's lines
//! in that step: the installer's log lines printed after the effect they
//! report and once each (a line read before it was written shows up a step
//! late, which reads as a second repair), owned mode chosen by `auto` with
//! its reason, the startup taint's Event, the rewrite healed by the file
//! watcher, `status` and `/metrics`, the node agent's lookup, and the stale
//! chain caught at ADD.
//!
//! Needs root (the demo makes network namespaces) and the workspace's
//! binaries built (`cargo build --workspace --bins`, as ./test.sh does),
//! the repair controller's included.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Generous: a debug-built demo on a loaded 2-core machine.
const LIMIT: Duration = Duration::from_secs(300);

/// The demo's stdout, split by section ("N. title" lines); section 0 is
/// the intro.
fn run_demo() -> Vec<Vec<String>> {
    testkit::require_root("runs the demo, which creates network namespaces");
    let dir = testkit::TempDir::new("demo-story").expect("temp dir");
    let out_file = dir.path().join("stdout");
    let err_file = dir.path().join("stderr");
    let mut child = Command::new(env!("CARGO_BIN_EXE_demo"))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_file).expect("stdout file"))
        .stderr(std::fs::File::create(&err_file).expect("stderr file"))
        .spawn()
        .expect("start the demo");
    let deadline = Instant::now() + LIMIT;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the demo did not finish within {LIMIT:?}\nstdout:\n{}\nstderr:\n{}",
                std::fs::read_to_string(&out_file).unwrap_or_default(),
                std::fs::read_to_string(&err_file).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = std::fs::read_to_string(&out_file).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_file).unwrap_or_default();
    assert!(
        status.success(),
        "the demo failed ({status})\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(
        stderr.contains("clean-up checked: no process, network namespace or temp dir"),
        "{stderr}"
    );
    let mut sections = vec![Vec::new()];
    for line in stdout.lines() {
        let numbered = line
            .split_once(". ")
            .is_some_and(|(n, _)| n.parse::<u32>().is_ok_and(|n| n as usize == sections.len()));
        if numbered {
            sections.push(Vec::new());
        }
        sections
            .last_mut()
            .expect("one section")
            .push(line.to_string());
    }
    sections
}

/// The installer's log entries printed in `section`, each with its
/// wrapped continuation lines joined.
fn installer_entries(section: &[String]) -> Vec<String> {
    let mut entries: Vec<String> = Vec::new();
    let mut open = false;
    for l in section {
        if l.starts_with("    installer ") {
            entries.push(l.trim().to_string());
            open = true;
        } else if open && l.starts_with("        ") {
            if let Some(e) = entries.last_mut() {
                e.push(' ');
                e.push_str(l.trim());
            }
        } else {
            open = false;
        }
    }
    entries
}

/// The lines of `section` after the first one holding `marker`.
fn after<'a>(section: &'a [String], marker: &str) -> &'a [String] {
    let at = section
        .iter()
        .position(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("no {marker:?} in\n{}", section.join("\n")));
    &section[at + 1..]
}

fn has(section: &[String], needle: &str) -> bool {
    section.iter().any(|l| l.contains(needle))
}

#[test]
fn each_step_prints_its_own_lines_once() {
    let s = run_demo();
    assert_eq!(
        s.len(),
        9,
        "the intro and 8 sections:\n{}",
        s.concat().join("\n")
    );
    let text = |i: usize| s[i].join("\n");

    // 2: owned mode from containerd's settings, chained by the periodic
    // pass; the line saying so printed right after the verdict, with the
    // taint's removal; then the Event.
    assert!(
        has(
            &s[2],
            "installer INFO chain mode owned: LINKERD_CNI_CHAIN_MODE=auto:"
        ),
        "{}",
        text(2)
    );
    assert!(has(&s[2], "containerd's max_conf_num is 1"), "{}", text(2));
    let chained = after(&s[2], "✓ chained");
    assert!(
        chained
            .get(1)
            .is_some_and(|l| l.contains("installer INFO wrote")),
        "the chaining pass's log right after the verdict:\n{}",
        text(2)
    );
    assert!(
        has(chained, "installer INFO startup taint: removed"),
        "{}",
        text(2)
    );
    assert!(
        has(&s[2], "Reason:  LinkerdCNIStartupTaintRemoved"),
        "{}",
        text(2)
    );
    assert!(has(&s[2], "Node worker-1 has no taint left"), "{}", text(2));

    // 4: the old installer's stop is one line; the new one starts with
    // its metrics.
    let old_stop: Vec<String> = installer_entries(after(&s[4], "leaves everything installed"))
        .into_iter()
        .take_while(|l| !l.contains("starting:"))
        .collect();
    assert_eq!(old_stop.len(), 1, "{old_stop:?}\n{}", text(4));
    assert!(old_stop[0].contains("SIGTERM: exiting"), "{}", text(4));
    assert!(
        has(&s[4], "serving /metrics on http://127.0.0.1:9995/metrics"),
        "{}",
        text(4)
    );

    // 5: healed by the watcher, its one repair line right after; status
    // and metrics agree.
    let followed = after(&s[5], "after the rewrite, on the file watcher's event");
    assert!(
        followed
            .first()
            .is_some_and(|l| l.contains("installer INFO wrote")),
        "{}",
        text(5)
    );
    assert_eq!(
        installer_entries(&s[5]).len(),
        1,
        "one installer line in step 5:\n{}",
        text(5)
    );
    for want in [
        "mode:          owned",
        "chain:         healthy",
        "repairs 1 (owned_outdated 1)",
        "linkerd_cni_chain_healthy{mode=\"owned\"} 1",
        "linkerd_cni_chain_repairs_total{cause=\"owned_outdated\"} 1",
    ] {
        assert!(has(&s[5], want), "no {want:?} in\n{}", text(5));
    }

    // 6: the node agent answered; 7: the stale copy sent back, the retry
    // meshed.
    assert!(
        has(&s[6], "the pod's facts came from the agent"),
        "{}",
        text(6)
    );
    assert!(has(&s[7], "CNI error code 11"), "{}", text(7));
    let retried = after(&s[7], "ADD demo/web-2 (meshed), again");
    assert!(
        has(retried, "installed linkerd's redirect rules"),
        "{}",
        text(7)
    );
    assert!(has(retried, "✓ exit 0: healthy"), "{}", text(7));

    // Each repair of linkerd-cni's own file is printed once: steps 2 and 5.
    let ours = "wrote /host$NODE/net.d/10-k8s-pod-network-linkerd-cni.conflist from";
    let wrote: Vec<usize> = (0..s.len())
        .flat_map(|i| {
            installer_entries(&s[i])
                .into_iter()
                .filter(|e| e.contains(ours))
                .map(move |_| i)
        })
        .collect();
    assert_eq!(wrote, [2, 5], "{}", s.concat().join("\n"));
}
