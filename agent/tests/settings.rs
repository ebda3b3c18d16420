//! The installer's settings as the command line reads them: from the
//! environment, where empty is unset and a value that is not UTF-8 is
//! refused by name, or from flags, which win; and its log lines on stderr.

// The node's helpers; not all of them are used here.
#[allow(unused_imports)]
mod common;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::{Command, Output};

use common::*;

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// As upstream's `${VAR:-default}`: a variable set to "" takes the default
/// (clap alone would hand "" to the check, which refuses it).
#[test]
fn empty_variables_count_as_unset() {
    let node = Node::new("settings-empty");
    let empty: Vec<(&str, &str)> = [
        "LINKERD_CNI_RESYNC_SECONDS",
        "LINKERD_CNI_WATCH",
        "LINKERD_CNI_UNINSTALL_ON_EXIT",
        "LINKERD_CNI_CHAIN_MODE",
        "LINKERD_CNI_METRICS_ADDR",
        "LINKERD_CNI_NODE_NAME",
        "LINKERD_CNI_STARTUP_TAINT",
        "KUBECONFIG_FILE_NAME",
        "KUBERNETES_SERVICE_PROTOCOL",
    ]
    .iter()
    .map(|v| (*v, ""))
    .collect();
    let out = node.run(&["check"], &empty);
    // Not installed: not ready (1), but no configuration error (2).
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("invalid configuration"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_variable_that_is_not_utf8_is_refused_by_name() {
    let node = Node::new("settings-utf8");
    let out = Command::new(env!("CARGO_BIN_EXE_linkerd-cni-agent"))
        .arg("check")
        .env_clear()
        .envs(node.env())
        .env("LINKERD_CNI_WATCH", OsStr::from_bytes(b"tru\xffe"))
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("invalid configuration: LINKERD_CNI_WATCH: not valid UTF-8"),
        "{err}"
    );
}

/// Each setting is a flag too, before the command, and the flag wins over
/// the variable (whose bad value is then never read).
#[test]
fn a_flag_wins_over_its_variable() {
    let node = Node::new("settings-flag");
    let bad = [("LINKERD_CNI_RESYNC_SECONDS", "soon")];
    let out = node.run(&["check"], &bad);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(
            "invalid configuration: LINKERD_CNI_RESYNC_SECONDS: expected a number of seconds"
        ),
        "{}",
        stderr(&out)
    );
    let out = node.run(&["--resync-seconds", "2", "check"], &bad);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    // A bad flag is named by its variable, as a bad variable is.
    let out = node.run(&["--watch=maybe", "check"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(
            "invalid configuration: LINKERD_CNI_WATCH: expected true or false, got \"maybe\""
        ),
        "{}",
        stderr(&out)
    );
}

/// One line per event on stderr, `<time> <LEVEL> <program>[<pid>]:
/// <message>`, the plugin's format (the demo parses it), also for what
/// linkerd-cni's libraries log through `log`: here the chain library's
/// warning during an uninstall.
#[test]
fn log_lines_name_the_program_and_include_the_libraries() {
    let node = Node::new("settings-log");
    let only_ours = r#"{"cniVersion":"1.0.0","name":"lonely","plugins":[{"type":"linkerd-cni","name":"linkerd-cni"}]}"#;
    node.write_by_rename("10-lonely.conflist", only_ours);
    let out = node.run(&["uninstall"], &[]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let line = err
        .lines()
        .find(|l| l.contains("holds only linkerd-cni entries"))
        .unwrap_or_else(|| panic!("no line from the chain library:\n{err}"));
    let (head, _) = line.split_once("]: ").expect("<program>[<pid>]: ");
    let fields: Vec<&str> = head.split_whitespace().collect();
    assert_eq!(fields.len(), 3, "{line}");
    assert!(
        fields[0].ends_with('Z') && fields[0].contains('T'),
        "an RFC 3339 UTC time: {line}"
    );
    assert_eq!(fields[1], "WARN", "{line}");
    assert_eq!(
        fields[2],
        format!("linkerd-cni-installer[{}", out_pid(&err)),
        "{line}"
    );
    // The uninstall's own line, from the agent, in the same form.
    assert!(
        err.lines()
            .any(|l| l.contains(" INFO  linkerd-cni-installer[") && l.ends_with("]: uninstalled")),
        "{err}"
    );
}

/// The pid the lines carry (all the same: one process).
fn out_pid(err: &str) -> String {
    let pids: std::collections::BTreeSet<&str> = err
        .lines()
        .filter_map(|l| l.split_once("linkerd-cni-installer[")?.1.split_once(']'))
        .map(|(pid, _)| pid)
        .collect();
    assert_eq!(pids.len(), 1, "{err}");
    assert!(pids.iter().all(|p| p.parse::<u32>().is_ok()), "{err}");
    pids.into_iter().next().unwrap().to_string()
}
