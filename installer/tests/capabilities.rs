//! The installer as deploy/ runs it: uid 0 with only the capabilities the
//! manifest grants (CHOWN, DAC_READ_SEARCH), against a primary conflist
//! that root does not own. Without them, `check` and the log say what is
//! missing and what to do; with them, the primary is chained with its
//! owner, group and mode kept (0644 and 0600). Needs root (chown, setpriv).

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::{Command, Output};
use std::time::Duration;

use common::{Installer, Node, calico_text, wait_until};

/// Another agent's uid, as a primary CNI running unprivileged would own
/// its file.
const OTHER_UID: u32 = 1000;

/// The capabilities deploy/ grants the install-cni container.
const DEPLOY_CAPS: [&str; 2] = ["CHOWN", "DAC_READ_SEARCH"];

fn setpriv(node: &Node, caps: &[&str], args: &[&str]) -> Command {
    testkit::require_root("chowns files to another uid and drops capabilities");
    let bounding: String = std::iter::once("-all".to_string())
        .chain(caps.iter().map(|c| format!("+{}", c.to_ascii_lowercase())))
        .collect::<Vec<_>>()
        .join(",");
    let mut c = Command::new("setpriv");
    c.args(["--inh-caps=-all", "--ambient-caps=-all"])
        .arg(format!("--bounding-set={bounding}"))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_linkerd-cni-installer"))
        .args(args)
        .env_clear()
        .envs(node.env());
    c
}

fn check(node: &Node, caps: &[&str]) -> Output {
    setpriv(node, caps, &["check"])
        .output()
        .expect("run setpriv (util-linux)")
}

fn primary(node: &Node, mode: u32) -> std::path::PathBuf {
    let p = node.conf("10-calico.conflist");
    fs::write(&p, calico_text(1)).unwrap();
    std::os::unix::fs::chown(&p, Some(OTHER_UID), Some(OTHER_UID)).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
    p
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn the_manifest_grants_what_these_tests_grant() {
    let m = testkit::chart::MANIFEST;
    let add = format!(
        "add:\n{}",
        DEPLOY_CAPS
            .iter()
            .map(|c| format!("            - {c}\n"))
            .collect::<String>()
    );
    assert!(m.contains(&add), "deploy/ does not add {DEPLOY_CAPS:?}");
}

#[test]
fn a_primary_only_its_owner_may_read_needs_dac_read_search() {
    let node = Node::new("caps-read");
    let p = primary(&node, 0o600);
    let o = check(&node, &[]);
    assert!(!o.status.success());
    let out = text(&o);
    assert!(
        out.contains("10-calico.conflist") && out.contains("CAP_DAC_READ_SEARCH"),
        "{out}"
    );
    // With deploy/'s capabilities it reads it: not chained yet, no error.
    let o = check(&node, &DEPLOY_CAPS);
    let out = text(&o);
    assert!(!out.contains("Permission denied"), "{out}");
    // And chains it: owner, group and mode 0600 kept.
    chained_as_it_was(&node, &p, 0o600);
}

/// The installer with deploy/'s capabilities chains `p`, keeping its
/// owner, group and `mode`; `check` then passes.
fn chained_as_it_was(node: &Node, p: &std::path::Path, mode: u32) {
    let log = node.root.join("deploy-caps.log");
    let _i = Installer::spawn(setpriv(node, &DEPLOY_CAPS, &[]), log);
    assert!(
        wait_until(Duration::from_secs(30), || node.healthy().is_ok()),
        "{:?}",
        node.healthy()
    );
    let m = fs::metadata(p).unwrap();
    assert_eq!((m.uid(), m.gid()), (OTHER_UID, OTHER_UID));
    assert_eq!(m.mode() & 0o7777, mode);
    let o = check(node, &DEPLOY_CAPS);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn a_primary_of_another_uid_needs_chown_to_keep_its_owner() {
    let node = Node::new("caps-chown");
    // Readable by root as "other": only the owner is in the way.
    let p = primary(&node, 0o644);
    {
        let log = node.root.join("no-caps.log");
        let i = Installer::spawn(setpriv(&node, &[], &[]), log);
        assert!(
            i.wait_log("CAP_CHOWN", Duration::from_secs(30)),
            "{}",
            i.log()
        );
        assert_eq!(fs::metadata(&p).unwrap().uid(), OTHER_UID);
    }
    // With deploy/'s: chained, owner and mode kept.
    chained_as_it_was(&node, &p, 0o644);
}
