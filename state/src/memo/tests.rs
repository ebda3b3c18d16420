//! The memo against the keeper on real conf dirs: remembered only for a
//! settled, steady look, and given up on any change a check would see.

use std::fs::{self, File};
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use super::*;
use crate::testutil::{TempDir, desired};
use linkerd_cni_chain::owned::ChainMode;
use linkerd_cni_chain::{Context, Entry, ModeChoice, NoLimit, keep, persist_entry};
use testkit::chain::CALICO;

/// The tests' bound for a settled file: every file here is new.
const TEST_RACY: Duration = Duration::from_millis(40);

struct Node {
    conf: TempDir,
    state: TempDir,
    entry: Entry,
}

impl Node {
    /// A conf dir with Calico's conflist and our entry file, chained in
    /// `mode` by a first look.
    fn chained(mode: ChainMode) -> Node {
        let entry = match mode {
            ChainMode::Inline => desired(),
            ChainMode::Owned => desired().with("chain_mode", "owned").expect("entry"),
        };
        let n = Node {
            conf: TempDir::new("memo-conf"),
            state: TempDir::new("memo-state"),
            entry,
        };
        n.conf.write("10-calico.conflist", CALICO);
        persist_entry(n.conf.path(), &n.entry).expect("persist the entry");
        let r = keep(&n.ctx(None), &mut NoLimit).expect("first look");
        assert!(r.changed(), "the first look chains the node: {r}");
        n
    }

    fn memo(&self) -> Memo {
        Memo::in_dir(self.state.path()).with_racy(TEST_RACY)
    }

    fn ctx(&self, ran: Option<Marker>) -> Context {
        let mode = ModeChoice::of_entry(&self.entry).expect("mode");
        let mut ctx = Context::new(
            self.conf.path(),
            self.entry.clone(),
            mode,
            Duration::from_secs(5),
        );
        ctx.ran = ran;
        ctx
    }

    /// The marker of our owned copy, as the runtime passes it on stdin.
    fn ran_owned(&self) -> Option<Marker> {
        let text = self.conf.read("10-calico-linkerd-cni.conflist");
        let v: Value = serde_json::from_str(&text).expect("our file is JSON");
        let last = v["plugins"]
            .as_array()
            .and_then(|p| p.last())
            .and_then(Value::as_object)
            .expect("a last plugin");
        Some(Marker::of(last).expect("a marker"))
    }

    /// One check as the plugin makes it: stamps, the keeper's look, the
    /// memo. Whether the look was steady.
    fn look(&self, ran: Option<Marker>) -> bool {
        let stamps = Stamps::take(self.conf.path());
        let ctx = self.ctx(ran);
        let report = keep(&ctx, &mut NoLimit).expect("look");
        self.memo()
            .remember(self.conf.path(), stamps, ctx.ran.as_ref(), &report);
        report.is_steady()
    }

    fn holds(&self, ran: Option<&Marker>) -> bool {
        self.memo().holds(self.conf.path(), ran)
    }
}

/// Lets every file written so far become older than [`TEST_RACY`].
fn settle() {
    std::thread::sleep(TEST_RACY + Duration::from_millis(20));
}

fn ran_for(n: &Node, mode: ChainMode) -> Option<Marker> {
    match mode {
        ChainMode::Inline => None,
        ChainMode::Owned => n.ran_owned(),
    }
}

#[test]
fn a_settled_steady_look_is_remembered_in_both_modes() {
    for mode in [ChainMode::Inline, ChainMode::Owned] {
        let n = Node::chained(mode);
        let ran = ran_for(&n, mode);
        settle();
        assert!(!n.holds(ran.as_ref()), "{mode}: nothing remembered yet");
        assert!(n.look(ran.clone()), "{mode}: the chained node is healthy");
        assert!(n.holds(ran.as_ref()), "{mode}: remembered");
        // Only for this conf dir.
        let other = TempDir::new("memo-other");
        assert!(!n.memo().holds(other.path(), ran.as_ref()), "{mode}");
    }
}

#[test]
fn files_changed_within_the_racy_bound_are_not_remembered() {
    let n = Node::chained(ChainMode::Inline);
    // The default bound: the files were written moments ago.
    let stamps = Stamps::take(n.conf.path());
    let ctx = n.ctx(None);
    let report = keep(&ctx, &mut NoLimit).expect("look");
    assert!(report.is_steady(), "{report}");
    let memo = Memo::in_dir(n.state.path());
    memo.remember(n.conf.path(), stamps, None, &report);
    assert!(!memo.holds(n.conf.path(), None));
    assert!(!n.state.path().join(MEMO_FILE).exists());
}

/// Rewrites `name` in place with text of the same length, and gives it
/// back its modification time: only the change time tells.
fn rewrite_same_size(n: &Node, name: &str, from: &str, to: &str) {
    assert_eq!(from.len(), to.len());
    let path = n.conf.path().join(name);
    let before = fs::metadata(&path).expect("stat");
    let text = fs::read_to_string(&path).expect("read");
    assert!(text.contains(from), "{name} holds {from}");
    fs::write(&path, text.replacen(from, to, 1)).expect("rewrite");
    File::options()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_modified(before.modified()?))
        .expect("set the modification time back");
    let after = fs::metadata(&path).expect("stat");
    assert_eq!(after.len(), before.len());
    assert_eq!(after.modified().ok(), before.modified().ok());
}

#[test]
fn an_in_place_rewrite_of_the_same_size_is_seen() {
    let cases = [
        (ChainMode::Inline, "10-calico.conflist", "1440", "1450"),
        (ChainMode::Inline, ENTRY_FILE, "linkerd-cni", "linkerd-cnx"),
        (ChainMode::Owned, "10-calico.conflist", "1440", "1450"),
        (
            ChainMode::Owned,
            "10-calico-linkerd-cni.conflist",
            "1440",
            "1450",
        ),
    ];
    for (mode, name, from, to) in cases {
        let n = Node::chained(mode);
        let ran = ran_for(&n, mode);
        settle();
        assert!(n.look(ran.clone()));
        assert!(n.holds(ran.as_ref()), "{mode} {name}: remembered");
        rewrite_same_size(&n, name, from, to);
        assert!(!n.holds(ran.as_ref()), "{mode} {name}: the rewrite is seen");
    }
}

#[test]
fn a_name_added_or_renamed_is_seen() {
    let n = Node::chained(ChainMode::Inline);
    settle();
    assert!(n.look(None));
    n.conf.write("05-cilium.conflist", CALICO);
    assert!(!n.holds(None), "a config that sorts first");

    let n = Node::chained(ChainMode::Inline);
    settle();
    assert!(n.look(None));
    fs::rename(
        n.conf.path().join("10-calico.conflist"),
        n.conf.path().join("20-calico.conflist"),
    )
    .expect("rename");
    assert!(!n.holds(None), "the primary renamed");
}

#[test]
fn nothing_is_remembered_for_a_symlinked_config_no_entry_file_or_an_unsteady_look() {
    // A symlinked config: its target can change with no stamp here.
    let n = Node::chained(ChainMode::Inline);
    let target = TempDir::new("memo-target");
    target.write("x.conflist", CALICO);
    symlink(
        target.path().join("x.conflist"),
        n.conf.path().join("99-x.conflist"),
    )
    .expect("symlink");
    settle();
    assert!(n.look(None), "the link sorts last: still healthy");
    assert!(!n.holds(None), "symlinked config");

    // No entry file: the desired entry is the ADD's own.
    let n = Node::chained(ChainMode::Inline);
    fs::remove_file(n.conf.path().join(ENTRY_FILE)).expect("remove the entry file");
    settle();
    assert!(n.look(None));
    assert!(!n.holds(None), "no entry file");

    // A look that repaired: the next one must look again.
    let n = Node::chained(ChainMode::Inline);
    n.conf.write("10-calico.conflist", CALICO);
    settle();
    assert!(!n.look(None), "the look repairs");
    assert!(!n.holds(None), "a repair is no steady verdict");
    assert!(n.look(None), "repaired");
    assert!(!n.holds(None), "the repair's write is too recent");
    settle();
    assert!(n.look(None));
    assert!(n.holds(None), "settled since");

    // A repair held back (a fight): the files are settled and unchanged,
    // and the chain is broken.
    let n = Node::chained(ChainMode::Inline);
    n.conf.write("10-calico.conflist", CALICO);
    settle();
    let stamps = Stamps::take(n.conf.path());
    let ctx = n.ctx(None);
    let report = keep(&ctx, &mut Refuse).expect("look");
    assert!(!report.held_back.is_empty(), "{report}");
    n.memo().remember(n.conf.path(), stamps, None, &report);
    assert!(!n.holds(None), "a held-back repair is no healthy verdict");
}

/// A limit that holds every repair back.
struct Refuse;

impl linkerd_cni_chain::RepairLimit for Refuse {
    fn allow(&self, _: &Path, _: &str, _: std::time::Instant) -> bool {
        false
    }

    fn next_allowed(&self, _: &Path, _: &str, _: std::time::Instant) -> Option<std::time::Instant> {
        None
    }

    fn record(&mut self, _: &Path, _: &str, _: std::time::Instant) -> Option<String> {
        None
    }
}

#[test]
fn another_copy_ran_is_another_question() {
    let n = Node::chained(ChainMode::Owned);
    let ran = n.ran_owned().expect("marker");
    settle();
    assert!(n.look(Some(ran.clone())));
    assert!(n.holds(Some(&ran)));
    let older = Marker {
        sha256: "0".repeat(64),
        ..ran.clone()
    };
    assert!(!n.holds(Some(&older)), "another copy");
    assert!(!n.holds(None), "the primary ran, not our copy");
}

#[test]
fn a_damaged_memo_or_one_from_the_future_holds_nothing() {
    let n = Node::chained(ChainMode::Inline);
    settle();
    assert!(n.look(None));
    assert!(n.holds(None));
    let path = n.state.path().join(MEMO_FILE);
    let good = fs::read_to_string(&path).expect("memo");

    let future = good
        .lines()
        .map(|l| {
            if l.starts_with("at ") {
                format!("at {}", i128::MAX / 2)
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    fs::write(&path, future).expect("write");
    assert!(!n.holds(None), "a clock set back since the look");

    for bad in [
        String::new(),
        "garbage\n".to_string(),
        good.replace(VERSION, "linkerd-cni healthy-chain memo v0"),
        good.lines().take(4).collect::<Vec<_>>().join("\n"),
        good.replacen(" 10-calico.conflist", " ", 1),
        good.replacen(" 10-calico.conflist", "", 1),
        good.replace('\n', " "),
    ] {
        fs::write(&path, &bad).expect("write");
        assert!(!n.holds(None), "{bad:?}");
    }
    fs::remove_file(&path).expect("remove");
    fs::create_dir(&path).expect("a directory squatting the memo's name");
    assert!(!n.holds(None));
    assert!(
        n.look(None),
        "a memo that cannot be written costs nothing else"
    );
    assert!(!n.holds(None));
}

/// A memo must name the conf dir, the entry file and every config: one
/// that lists only the dir (with its current stamps) vouches for files it
/// never saw, and would let an ADD skip the repair of a primary rewritten
/// in place.
#[test]
fn a_memo_that_leaves_out_a_file_holds_nothing() {
    let n = Node::chained(ChainMode::Inline);
    settle();
    assert!(n.look(None));
    assert!(n.holds(None));
    let path = n.state.path().join(MEMO_FILE);
    let good = fs::read_to_string(&path).expect("memo");
    let only_dir: String = good
        .lines()
        .take(4)
        .chain(good.lines().filter(|l| l.ends_with(" .")))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(only_dir.lines().any(|l| l.ends_with(" .")), "{only_dir}");
    assert!(!only_dir.contains(ENTRY_FILE), "{only_dir}");
    for partial in [
        only_dir.clone(),
        good.lines()
            .filter(|l| !l.ends_with(" 10-calico.conflist"))
            .map(|l| format!("{l}\n"))
            .collect(),
        good.lines()
            .filter(|l| !l.ends_with(&format!(" {ENTRY_FILE}")))
            .map(|l| format!("{l}\n"))
            .collect(),
        good.lines()
            .filter(|l| !l.ends_with(" ."))
            .map(|l| format!("{l}\n"))
            .collect(),
    ] {
        fs::write(&path, &partial).expect("write");
        assert!(!n.holds(None), "{partial}");
    }
    fs::write(&path, &good).expect("write");
    assert!(n.holds(None));
    // The primary rewritten in place without our entry (the dir's stamp
    // stays): under a memo naming only the dir, the ADD's look happens and
    // repairs it.
    fs::write(&path, &only_dir).expect("write");
    fs::write(n.conf.path().join("10-calico.conflist"), CALICO).expect("rewrite");
    assert!(!n.holds(None));
    assert!(!n.look(None), "the look repairs the unchained primary");
    assert!(
        n.conf
            .read("10-calico.conflist")
            .contains(linkerd_cni_chain::PLUGIN_TYPE)
    );
}

/// Only root's own memo is believed: one another user owns, or anyone may
/// write, or a link to one, is no memo.
#[test]
fn a_memo_that_is_not_roots_own_holds_nothing() {
    use std::os::unix::fs::PermissionsExt;
    testkit::require_root("chown");
    let n = Node::chained(ChainMode::Inline);
    settle();
    assert!(n.look(None));
    assert!(n.holds(None));
    let path = n.state.path().join(MEMO_FILE);
    fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).unwrap();
    assert!(!n.holds(None), "writable by others");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    assert!(n.holds(None));
    std::os::unix::fs::chown(&path, Some(1000), Some(1000)).unwrap();
    assert!(!n.holds(None), "owned by uid 1000");
    std::os::unix::fs::chown(&path, Some(0), Some(0)).unwrap();
    assert!(n.holds(None));
    let moved = n.state.path().join("elsewhere");
    fs::rename(&path, &moved).unwrap();
    symlink(&moved, &path).unwrap();
    assert!(!n.holds(None), "a link");
    // Remembered anew over the link, as root's own file.
    assert!(n.look(None));
    assert!(
        !fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(n.holds(None));
}
