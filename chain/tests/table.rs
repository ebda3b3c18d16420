//! The chain library against a table of real-world conf dirs
//! (tests/fixtures/chain/<case>/in): the diagnosis of each, and the repaired
//! dir byte for byte (<case>/out; cases without one must not change).
//!
//! `UPDATE_CHAIN_FIXTURES=1` writes the `out` dirs from the current code, for
//! review in the diff; the test never passes by writing them.

use std::fs;
use std::path::Path;

use linkerd_cni_chain::{self as chain, Action, ChainState, Context, ModeChoice, NoLimit};
use serde_json::Value;
use testkit::TempDir;
use testkit::chain::{copy_tree, desired, fixtures, is_linkerd, object, plugins, same_order, tree};

/// The primary's file as the crate's one judge ([`chain::health`]) sees
/// it, in inline mode.
fn diagnose(dir: &Path, want: &chain::Entry) -> Result<chain::Diagnosis, chain::ChainError> {
    let mode = ModeChoice::of_entry(want)?;
    let ctx = Context::new(dir, want.clone(), mode, std::time::Duration::from_secs(30));
    chain::health(&ctx).map(|h| h.inline)
}

/// What one run of the keeper (inline mode, no limit) did to the case.
struct Repaired {
    changed: bool,
    /// The state it repaired (or, when it wrote nothing, the one found).
    before: ChainState,
    file: Option<std::path::PathBuf>,
    summary: String,
}

fn repair(dir: &Path, want: &chain::Entry, found: &ChainState) -> Repaired {
    let mode = ModeChoice::of_entry(want).unwrap();
    let ctx = Context::new(dir, want.clone(), mode, std::time::Duration::from_secs(30));
    let report = chain::keep(&ctx, &mut NoLimit).unwrap();
    let repaired = report.actions.iter().find_map(|a| match a {
        Action::Repaired { file, cause } => Some((file.clone(), cause.clone())),
        _ => None,
    });
    Repaired {
        changed: report.changed(),
        before: repaired.as_ref().map_or(found.clone(), |r| r.1.clone()),
        file: repaired.map(|r| r.0),
        summary: report.to_string(),
    }
}

struct Case {
    name: &'static str,
    /// Active file's name.
    active: Option<&'static str>,
    /// `{:?}` of the state (a prefix, for `Invalid`'s reason).
    state: &'static str,
    stray: &'static [&'static str],
}

const CASES: &[Case] = &[
    Case {
        name: "calico",
        active: Some("10-calico.conflist"),
        state: "Missing",
        stray: &[],
    },
    Case {
        name: "cilium",
        active: Some("05-cilium.conflist"),
        state: "Missing",
        stray: &[],
    },
    Case {
        name: "flannel",
        active: Some("10-flannel.conflist"),
        state: "Missing",
        stray: &[],
    },
    Case {
        name: "azure",
        active: Some("15-azure.conflist"),
        state: "Missing",
        stray: &[],
    },
    Case {
        name: "aws",
        active: Some("10-aws.conflist"),
        state: "Missing",
        stray: &[],
    },
    Case {
        name: "kindnet",
        active: Some("10-kindnet.conflist"),
        state: "Missing",
        stray: &[],
    },
    Case {
        name: "compact",
        active: Some("20-ptp.conflist"),
        state: "Missing",
        stray: &[],
    },
    Case {
        name: "kube-router",
        active: Some("10-kuberouter.conf"),
        state: "SingleConf",
        stray: &[],
    },
    Case {
        name: "multus",
        active: Some("00-multus.conf"),
        state: "SingleConf",
        stray: &[],
    },
    Case {
        name: "linkerd-first",
        active: Some("10-calico.conflist"),
        state: "NotLast { position: 0, len: 3 }",
        stray: &[],
    },
    Case {
        name: "linkerd-middle",
        active: Some("10-flannel.conflist"),
        state: "NotLast { position: 1, len: 3 }",
        stray: &[],
    },
    Case {
        name: "linkerd-twice",
        active: Some("10-calico.conflist"),
        state: "Duplicated { positions: [1, 3], len: 4 }",
        stray: &[],
    },
    Case {
        name: "linkerd-stale",
        active: Some("10-calico.conflist"),
        state: r#"Stale { position: 2, keys: ["policy", "linkerd"] }"#,
        stray: &[],
    },
    Case {
        name: "healthy",
        active: Some("10-calico.conflist"),
        state: "Healthy",
        stray: &[],
    },
    Case {
        name: "invalid",
        active: Some("10-calico.conflist"),
        state: r#"Invalid { reason: "not valid JSON"#,
        stray: &[],
    },
    Case {
        name: "json-list",
        active: Some("10-flannel.json"),
        state: r#"Invalid { reason: "a plugin list in a single-plugin file"#,
        stray: &[],
    },
    Case {
        name: "no-config",
        active: None,
        state: "NoPrimaryConfig",
        stray: &[],
    },
    Case {
        name: "linkerd-only",
        active: Some("01-linkerd.conflist"),
        state: "NoPrimaryPlugin",
        stray: &[],
    },
    Case {
        name: "dotfile-first",
        active: Some(".05-cilium.conflist"),
        state: "Missing",
        stray: &[],
    },
    Case {
        name: "stray",
        active: Some("05-cilium.conflist"),
        state: "Missing",
        stray: &["10-calico.conflist"],
    },
    Case {
        name: "dir-skipped",
        active: Some("10-flannel.conflist"),
        state: "Missing",
        stray: &[],
    },
];

fn name_of(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn every_case_diagnoses_and_repairs_as_expected() {
    let update = std::env::var_os("UPDATE_CHAIN_FIXTURES").is_some();
    let want = linkerd_cni_chain::Entry::new(desired(), "entry.json").unwrap();
    let mut seen = Vec::new();
    for case in CASES {
        let src = fixtures().join(case.name);
        let dir = TempDir::new("table").unwrap();
        copy_tree(&src.join("in"), dir.path());
        let before = tree(dir.path());

        let d = diagnose(dir.path(), &want).unwrap();
        let ctx = format!("case {}:\n{d}", case.name);
        assert_eq!(
            d.active.as_deref().map(name_of).as_deref(),
            case.active,
            "{ctx}"
        );
        assert!(
            format!("{:?}", d.state).starts_with(case.state),
            "{ctx}{:?}",
            d.state
        );
        let stray: Vec<String> = d.stray.iter().map(|p| name_of(p)).collect();
        assert_eq!(stray, case.stray, "{ctx}");
        assert_eq!(d.is_healthy(), d.state == ChainState::Healthy, "{ctx}");
        // The person-facing text names the file and the remedy.
        let text = d.to_string();
        if let Some(a) = case.active {
            assert!(text.contains(a), "{ctx}");
        }
        if d.state.is_repairable() {
            assert!(text.contains("repair would:"), "{ctx}");
        }

        let r = repair(dir.path(), &want, &d.state);
        assert_eq!(r.changed, d.state.is_repairable(), "{ctx}\n{}", r.summary);
        assert_eq!(r.before, d.state, "{ctx}");
        let after = tree(dir.path());
        let out = src.join("out");
        if update && r.changed {
            let _ = fs::remove_dir_all(&out);
            copy_tree(dir.path(), &out);
        }
        let expected = if r.changed {
            tree(&out)
        } else {
            before.clone()
        };
        for ((pa, ca), (pe, ce)) in after.iter().zip(&expected) {
            assert_eq!(pa, pe, "{ctx}");
            assert_eq!(
                String::from_utf8_lossy(ca),
                String::from_utf8_lossy(ce),
                "case {}: {pa} differs from the expected output",
                case.name
            );
        }
        assert_eq!(after.len(), expected.len(), "{ctx}");

        if r.changed {
            let file = r.file.clone().unwrap();
            let text = fs::read_to_string(&file).unwrap();
            check_repaired(case.name, &before, &name_of(&file), &text, &want);
            let again = diagnose(dir.path(), &want).unwrap();
            assert!(
                again.is_healthy(),
                "case {}: after repair:\n{again}",
                case.name
            );
            let r2 = repair(dir.path(), &want, &again.state);
            assert!(!r2.changed, "case {}: second repair wrote", case.name);
            assert_eq!(
                tree(dir.path()),
                after,
                "case {}: second repair changed files",
                case.name
            );
        }
        seen.push(case.name);
    }
    // Every fixture dir is in the table.
    let mut dirs: Vec<String> = fs::read_dir(fixtures())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    dirs.sort();
    seen.sort();
    assert_eq!(dirs, seen);
}

/// The properties every repaired file must have, whatever the case: one
/// linkerd entry, last, the desired one; every other plugin and top-level
/// member as before, in order.
fn check_repaired(
    case: &str,
    before: &[(String, Vec<u8>)],
    file: &str,
    text: &str,
    want: &chain::Entry,
) {
    let top = object(text);
    let list = plugins(text);
    let ours: Vec<usize> = (0..list.len()).filter(|&i| is_linkerd(&list[i])).collect();
    assert_eq!(
        ours,
        [list.len() - 1],
        "case {case}: linkerd entries at {ours:?}"
    );
    assert!(
        same_order(list.last().unwrap(), &Value::from(want.clone())),
        "case {case}"
    );

    // What the repaired file was made from.
    let (orig_name, orig) = before
        .iter()
        .find(|(n, _)| n == file)
        .or_else(|| {
            let stem = file.trim_end_matches(".conflist");
            before
                .iter()
                .find(|(n, _)| n == &format!("{stem}.conf") || n == &format!("{stem}.json"))
        })
        .expect("the repaired file's origin");
    let orig = object(std::str::from_utf8(orig).unwrap());
    if orig_name.ends_with(".conflist") {
        let orig_plugins: Vec<&Value> = orig["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| !is_linkerd(p))
            .collect();
        let kept: Vec<&Value> = list.iter().filter(|p| !is_linkerd(p)).collect();
        assert_eq!(kept.len(), orig_plugins.len(), "case {case}");
        for (a, b) in kept.iter().zip(&orig_plugins) {
            assert!(same_order(a, b), "case {case}: plugin changed");
        }
        let strip = |m: &serde_json::Map<String, Value>| {
            let mut m = m.clone();
            m.shift_remove("plugins");
            Value::Object(m)
        };
        assert!(
            same_order(&strip(&top), &strip(&orig)),
            "case {case}: top level changed"
        );
    } else {
        // A single-plugin file: its name and cniVersion on top, itself first.
        assert_eq!(top.get("name"), orig.get("name"), "case {case}");
        assert_eq!(top.get("cniVersion"), orig.get("cniVersion"), "case {case}");
        assert_eq!(list.len(), 2, "case {case}");
        assert!(same_order(&list[0], &Value::Object(orig)), "case {case}");
    }
}
