//! The installer as deploy/ runs it: uid 0 with only the capability the
//! manifest grants (CHOWN), against a primary conflist that root does not
//! own. Without it, `check` and the log say what is missing and what to
//! do; with it, the primary is chained with its owner, group and mode kept.
//! A 0600 primary of another uid it cannot read: deploy/ grants no
//! DAC_READ_SEARCH (with it, open_by_handle_at reaches every file of the
//! host), so `check` names the file and the way to chain it, and leaves it
//! alone. Needs root (chown, setpriv).

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::{Command, Output};
use std::time::Duration;

use common::{Installer, Node, calico_text, wait_until};

/// Another agent's uid, as a primary CNI running unprivileged would own
/// its file.
const OTHER_UID: u32 = 1000;

/// The capabilities deploy/ grants its one container (install-cni).
const DEPLOY_CAPS: [&str; 1] = ["CHOWN"];

/// Capabilities no container of deploy/ may have, as a list item anywhere
/// in it: each reaches files beyond the mounts it is given
/// (DAC_READ_SEARCH through open_by_handle_at, which the runtime's default
/// seccomp profile allows to a holder of it).
const NEVER: [&str; 3] = ["DAC_READ_SEARCH", "DAC_OVERRIDE", "SYS_ADMIN"];

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
        .arg(env!("CARGO_BIN_EXE_linkerd-cni-agent"))
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

/// Every `capabilities.add` list of the manifest, in order: each `add:`
/// line and the list items under it.
fn added_capabilities(manifest: &str) -> Vec<Vec<String>> {
    let mut lists = vec![];
    let mut lines = manifest.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() != "add:" {
            continue;
        }
        let mut caps = vec![];
        while let Some(item) = lines.peek().and_then(|l| l.trim().strip_prefix("- ")) {
            caps.push(item.trim().to_string());
            lines.next();
        }
        lists.push(caps);
    }
    lists
}

#[test]
fn the_manifest_grants_what_these_tests_grant_and_never_dac_read_search() {
    let m = testkit::chart::MANIFEST;
    assert_eq!(
        added_capabilities(m),
        [DEPLOY_CAPS.map(String::from).to_vec()],
        "deploy/ adds exactly {DEPLOY_CAPS:?}, to its one container"
    );
    // Also as a list item anywhere (a capability added in another form).
    for cap in NEVER {
        for form in [cap.to_string(), format!("CAP_{cap}")] {
            assert!(
                !m.lines().any(|l| {
                    let l = l.trim().trim_start_matches("- ").trim_matches('"');
                    l == form
                }),
                "deploy/ grants {form}"
            );
        }
    }
}

#[test]
fn a_primary_only_its_owner_may_read_is_named_and_left_alone() {
    let node = Node::new("caps-read");
    let p = primary(&node, 0o600);
    let before = fs::read(&p).unwrap();
    for caps in [&[][..], &DEPLOY_CAPS] {
        let o = check(&node, caps);
        assert!(!o.status.success());
        let out = text(&o);
        assert!(
            out.contains("10-calico.conflist")
                && out.contains("CAP_DAC_READ_SEARCH")
                && out.contains("open_by_handle_at")
                && out.contains("linkerd-cni chain repair"),
            "{out}"
        );
    }
    // The installer as deployed names it and what to do, and leaves it.
    let log = node.root.join("deploy-caps-0600.log");
    let i = Installer::spawn(setpriv(&node, &DEPLOY_CAPS, &[]), log);
    assert!(
        i.wait_log("linkerd-cni chain repair", Duration::from_secs(30)),
        "{}",
        i.log()
    );
    drop(i);
    let m = fs::metadata(&p).unwrap();
    assert_eq!((m.uid(), m.gid()), (OTHER_UID, OTHER_UID));
    assert_eq!(m.mode() & 0o7777, 0o600);
    assert_eq!(fs::read(&p).unwrap(), before, "left alone");
    // Made readable by root, it is chained, owner and mode kept.
    fs::set_permissions(&p, fs::Permissions::from_mode(0o604)).unwrap();
    chained_as_it_was(&node, &p, 0o604);
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
