//! Owned mode against real directories: naming, the copy, staleness,
//! removal, fallbacks and switching modes.

use std::ffi::OsStr;
use std::fs;

use serde_json::Value;

use super::super::inline::{remove_entries, repair};
use super::super::testutil::{TempDir, desired};
use super::super::{ChainState, RepairOptions, diagnose as inline_diagnose};
use super::*;

const CALICO: &str = r#"{
  "name": "k8s-pod-network",
  "cniVersion": "0.3.1",
  "unknownTop": {"kept": [1, 2.50]},
  "plugins": [
    {"type": "calico", "mtu": 1440, "ipam": {"type": "calico-ipam"}},
    {"type": "portmap", "snat": true, "capabilities": {"portMappings": true}}
  ]
}
"#;

impl SyncReport {
    /// Whether the sync changed anything in the conf dir (more than
    /// leftovers).
    fn changed(&self) -> bool {
        changed(&self.actions)
    }
}

fn owned_desired() -> Entry {
    desired().with(MODE_KEY, "owned").unwrap()
}

fn opts() -> RepairOptions {
    RepairOptions::default()
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).expect("json")
}

/// The marker of our copy of [`CALICO`]'s file, as the runtime hands it
/// to an ADD that ran the copy.
fn calico_copy_marker(d: &TempDir) -> Marker {
    Marker::of(
        json(&d.read("10-calico-linkerd-cni.conflist"))["plugins"][2]
            .as_object()
            .unwrap(),
    )
    .unwrap()
}

fn names_sorted_bytewise(mut v: Vec<String>) -> Vec<String> {
    v.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    v
}

#[test]
fn our_name_sorts_right_before_the_primary_whatever_it_is_called() {
    for primary in [
        "10-calico.conflist",
        "00-calico.conflist",
        "05-cilium.conf",
        "a.b.json",
        ".conf",
        ".hidden.conflist",
        "-.conf",
        "0.conf",
        "10-calico-linkerd-cni.conflist",
    ] {
        let ours = owned_name(OsStr::new(primary));
        let ours = ours.to_str().unwrap().to_string();
        assert!(
            ours.as_bytes() < primary.as_bytes(),
            "{ours} must sort before {primary}"
        );
        assert!(ours.ends_with(OWNED_SUFFIX), "{ours}");
        // Ours is a config name to the runtime.
        assert!(super::super::is_config_name(OsStr::new(&ours)), "{ours}");
    }
    assert_eq!(
        owned_name(OsStr::new("10-calico.conflist")),
        "10-calico-linkerd-cni.conflist"
    );
    assert_eq!(owned_name(OsStr::new(".conf")), "-linkerd-cni.conflist");
    // Against the files that could sort near it: a name sorting between
    // ours and the primary's would itself sort before the primary.
    let sorted = names_sorted_bytewise(vec![
        "10-calico.conflist".into(),
        "10-calico-linkerd-cni.conflist".into(),
        "10-calico.conf".into(),
        "10-calicp.conflist".into(),
    ]);
    assert_eq!(sorted.first().unwrap(), "10-calico-linkerd-cni.conflist");
}

#[test]
fn the_copy_keeps_the_primary_and_puts_us_last_and_our_file_becomes_active() {
    let d = TempDir::new("owned-copy");
    d.write("10-calico.conflist", CALICO);
    d.write("99-other.conflist", CALICO);
    let want = owned_desired();
    let diag = diagnose(d.path(), &want).unwrap();
    assert_eq!(diag.state, OwnedState::Missing);
    let r = sync(d.path(), &want, &opts()).unwrap();
    assert!(r.changed() && r.created, "{r:?}");
    assert_eq!(r.after, OwnedState::Current);
    assert_eq!(
        d.names(),
        [
            "10-calico-linkerd-cni.conflist",
            "10-calico.conflist",
            "99-other.conflist"
        ]
    );
    // The primary's file was only read.
    assert_eq!(d.read("10-calico.conflist"), CALICO);
    let ours = d.read("10-calico-linkerd-cni.conflist");
    let v = json(&ours);
    let primary = json(CALICO);
    for k in ["name", "cniVersion", "unknownTop"] {
        assert_eq!(v[k], primary[k], "{k}");
    }
    let plugins = v["plugins"].as_array().unwrap();
    assert_eq!(plugins.len(), 3);
    assert_eq!(plugins[..2], primary["plugins"].as_array().unwrap()[..]);
    let last = plugins[2].as_object().unwrap();
    let marker = Marker::of(last).expect("marker");
    assert_eq!(marker.file, "10-calico.conflist");
    assert_eq!(marker.sha256, sha256::hex(CALICO.as_bytes()));
    // Our entry is the desired one plus the marker.
    let mut plain = last.clone();
    plain.remove(MARKER_KEY);
    assert_eq!(&plain, want.as_map());
    // Byte-preserving: everything before our entry is the primary's text.
    let head = CALICO
        .rsplit_once('}')
        .unwrap()
        .0
        .rsplit_once(']')
        .unwrap()
        .0;
    let head = head.trim_end();
    assert!(ours.starts_with(head), "{ours}");
    // The file the runtime loads is ours, and it is recognised by content.
    let listing = list(d.path(), &RepairOptions::default()).unwrap();
    assert_eq!(listing.owned.len(), 1);
    assert_eq!(
        listing.configs.first().unwrap().file_name().unwrap(),
        "10-calico.conflist"
    );
    assert!(diagnose(d.path(), &want).unwrap().is_current());
    // Current: nothing written again.
    let ino = fs::metadata(d.path().join("10-calico-linkerd-cni.conflist")).unwrap();
    let again = sync(d.path(), &want, &opts()).unwrap();
    assert!(!again.changed(), "{again:?}");
    let ino2 = fs::metadata(d.path().join("10-calico-linkerd-cni.conflist")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(ino.ino(), ino2.ino());
}

#[test]
fn a_file_named_like_ours_without_the_marker_is_a_primary() {
    let d = TempDir::new("owned-lookalike");
    d.write("10-calico-linkerd-cni.conflist", CALICO);
    d.write("20-x.conflist", CALICO);
    let diag = diagnose(d.path(), &owned_desired()).unwrap();
    assert_eq!(
        diag.primary.unwrap().file_name().unwrap(),
        "10-calico-linkerd-cni.conflist"
    );
    assert!(diag.owned.is_empty());
    sync(d.path(), &owned_desired(), &opts()).unwrap();
    assert_eq!(
        d.names()[0],
        "10-calico-linkerd-cni-linkerd-cni.conflist",
        "{:?}",
        d.names()
    );
}

#[test]
fn a_single_plugin_primary_gives_a_conflist_copy_and_stays_untouched() {
    let d = TempDir::new("owned-conf");
    let conf = r#"{"cniVersion":"0.4.0","name":"mynet","type":"bridge","bridge":"cni0","ipam":{"type":"host-local","subnet":"10.22.0.0/16"}}"#;
    d.write("10-bridge.conf", conf);
    sync(d.path(), &owned_desired(), &opts()).unwrap();
    assert_eq!(
        d.names(),
        ["10-bridge-linkerd-cni.conflist", "10-bridge.conf"]
    );
    assert_eq!(d.read("10-bridge.conf"), conf);
    let v = json(&d.read("10-bridge-linkerd-cni.conflist"));
    assert_eq!(v["name"], "mynet");
    assert_eq!(v["cniVersion"], "0.4.0");
    assert_eq!(v["plugins"][0], json(conf));
    assert_eq!(v["plugins"][1]["type"], "linkerd-cni");
}

#[test]
fn a_change_of_the_primary_makes_the_copy_stale_and_sync_follows() {
    let d = TempDir::new("owned-stale");
    d.write("10-calico.conflist", CALICO);
    let want = owned_desired();
    sync(d.path(), &want, &opts()).unwrap();
    let ran = calico_copy_marker(&d);
    assert_eq!(diagnose(d.path(), &want).unwrap().stale(&ran), None);
    // The primary rewrites its file (by rename, as most do).
    let newer = CALICO.replace("1440", "1450");
    let tmp = d.write("tmp", &newer);
    fs::rename(tmp, d.path().join("10-calico.conflist")).unwrap();
    let diag = diagnose(d.path(), &want).unwrap();
    assert_eq!(diag.state, OwnedState::Outdated);
    let why = diag.stale(&ran).expect("stale");
    assert!(why.contains("changed"), "{why}");
    let r = sync(d.path(), &want, &opts()).unwrap();
    assert!(r.changed() && !r.created);
    let v = json(&d.read("10-calico-linkerd-cni.conflist"));
    assert_eq!(v["plugins"][0]["mtu"], 1450);
    assert!(diagnose(d.path(), &want).unwrap().is_current());
    // A change of the desired entry also makes it outdated (but the chain
    // that ran is not stale: the primary's config is the same).
    let other = want.with("log_level", "debug").unwrap();
    let diag = diagnose(d.path(), &other).unwrap();
    assert_eq!(diag.state, OwnedState::Outdated);
}

/// A rewrite that only reformats the primary's file (indentation, key
/// order) leaves the chain that ran current: the copy follows the new
/// bytes, but an ADD that ran the old copy is not sent back. A change of
/// meaning still is, and so is any change when the copy that ran records
/// no meaning (a copy made before it was recorded).
#[test]
fn a_reformatted_primary_is_no_stale_chain_a_changed_one_is() {
    let d = TempDir::new("owned-reformat");
    d.write("10-calico.conflist", CALICO);
    let want = owned_desired();
    sync(d.path(), &want, &opts()).unwrap();
    let ran = calico_copy_marker(&d);
    assert!(ran.meaning.is_some(), "{ran:?}");
    let reformatted = r#"{"cniVersion":"0.3.1","name":"k8s-pod-network",
      "plugins":[{"ipam":{"type":"calico-ipam"},"mtu":1440,"type":"calico"},
                 {"capabilities":{"portMappings":true},"snat":true,"type":"portmap"}],
      "unknownTop":{"kept":[1,2.50]}}"#;
    let tmp = d.write("tmp", reformatted);
    fs::rename(tmp, d.path().join("10-calico.conflist")).unwrap();
    let diag = diagnose(d.path(), &want).unwrap();
    assert_eq!(diag.state, OwnedState::Outdated, "the bytes changed");
    assert_eq!(diag.stale(&ran), None);
    let old_copy = Marker {
        meaning: None,
        ..ran.clone()
    };
    assert!(diag.stale(&old_copy).is_some());
    // A plugin's order is meaning.
    let reordered = r#"{"cniVersion":"0.3.1","name":"k8s-pod-network",
      "plugins":[{"capabilities":{"portMappings":true},"snat":true,"type":"portmap"},
                 {"ipam":{"type":"calico-ipam"},"mtu":1440,"type":"calico"}],
      "unknownTop":{"kept":[1,2.50]}}"#;
    let tmp = d.write("tmp", reordered);
    fs::rename(tmp, d.path().join("10-calico.conflist")).unwrap();
    let why = diagnose(d.path(), &want)
        .unwrap()
        .stale(&ran)
        .expect("stale");
    assert!(why.contains("changed"), "{why}");
}

#[test]
fn the_primary_gone_takes_our_file_with_it() {
    let d = TempDir::new("owned-gone");
    d.write("10-calico.conflist", CALICO);
    let want = owned_desired();
    sync(d.path(), &want, &opts()).unwrap();
    let ran = calico_copy_marker(&d);
    fs::remove_file(d.path().join("10-calico.conflist")).unwrap();
    let diag = diagnose(d.path(), &want).unwrap();
    assert_eq!(diag.state, OwnedState::NoPrimary);
    assert!(!diag.is_current());
    assert!(diag.stale(&ran).unwrap().contains("gone"));
    let r = sync(d.path(), &want, &opts()).unwrap();
    assert!(r.changed(), "{r:?}");
    assert!(d.names().is_empty(), "{:?}", d.names());
}

#[test]
fn the_primary_renamed_away_moves_our_file_to_the_new_primary() {
    let d = TempDir::new("owned-renamed");
    d.write("10-calico.conflist", CALICO);
    d.write("20-flannel.conflist", &CALICO.replace("calico", "flannel"));
    let want = owned_desired();
    sync(d.path(), &want, &opts()).unwrap();
    fs::rename(
        d.path().join("10-calico.conflist"),
        d.path().join("10-calico.conflist.bak"),
    )
    .unwrap();
    let diag = diagnose(d.path(), &want).unwrap();
    // The new primary's copy is missing, the old one must go.
    assert_eq!(diag.state, OwnedState::Missing);
    assert_eq!(diag.owned.len(), 1);
    sync(d.path(), &want, &opts()).unwrap();
    assert_eq!(
        d.names(),
        [
            "10-calico.conflist.bak",
            "20-flannel-linkerd-cni.conflist",
            "20-flannel.conflist"
        ]
    );
    assert!(diagnose(d.path(), &want).unwrap().is_current());
}

#[test]
fn a_meta_plugin_is_never_shadowed() {
    let d = TempDir::new("owned-multus");
    let multus = r#"{"cniVersion":"0.3.1","name":"multus-cni-network","type":"multus","kubeconfig":"/etc/cni/net.d/multus.d/multus.kubeconfig","delegates":[{"cniVersion":"0.3.1","name":"k8s-pod-network","plugins":[{"type":"calico"}]}]}"#;
    d.write("00-multus.conf", multus);
    d.write("10-calico.conflist", CALICO);
    let want = owned_desired();
    let diag = diagnose(d.path(), &want).unwrap();
    match &diag.state {
        OwnedState::Fallback { reason } => assert!(reason.contains("meta-plugin"), "{reason}"),
        s => panic!("{s:?}"),
    }
    assert!(diag.to_string().contains("inline"), "{diag}");
    let r = sync(d.path(), &want, &opts()).unwrap();
    assert!(!r.changed());
    assert_eq!(d.names(), ["00-multus.conf", "10-calico.conflist"]);
    // A delegating config of another type, too.
    let genie =
        r#"{"name":"g","cniVersion":"0.3.1","plugins":[{"type":"whatever","delegates":[]}]}"#;
    assert!(matches!(
        copy_of(Path::new("/x/00-g.conflist"), genie.as_bytes(), &want),
        Err(OwnedState::Fallback { reason }) if reason.contains("is a meta-plugin's config")
    ));
}

/// A stale linkerd-cni entry in the primary carrying a meta-plugin's key
/// (`delegates`, `clusterNetwork`...) makes it no meta-plugin's config: the
/// copy is made without that entry, and the primary is not rewritten.
#[test]
fn our_own_entry_with_a_meta_key_is_no_meta_plugin() {
    for key in ["delegates", "clusterNetwork", "defaultNetworks"] {
        let d = TempDir::new("owned-own-meta-key");
        let mut stale = desired().as_map().clone();
        stale.insert(key.into(), serde_json::json!([{"type": "calico"}]));
        let calico = CALICO.replacen(
            "\"plugins\": [\n",
            &format!("\"plugins\": [\n    {},\n", Value::Object(stale)),
            1,
        );
        d.write("10-calico.conflist", &calico);
        let want = owned_desired();
        let diag = diagnose(d.path(), &want).unwrap();
        assert_eq!(diag.state, OwnedState::Missing, "{key}: {diag}");
        let r = sync(d.path(), &want, &opts()).unwrap();
        assert!(r.changed(), "{key}");
        assert_eq!(
            d.names(),
            ["10-calico-linkerd-cni.conflist", "10-calico.conflist"],
            "{key}"
        );
        assert_eq!(
            d.read("10-calico.conflist"),
            calico,
            "{key}: primary rewritten"
        );
        let copy = json(&d.read("10-calico-linkerd-cni.conflist"));
        let plugins = copy["plugins"].as_array().unwrap();
        let types: Vec<&str> = plugins
            .iter()
            .map(|p| p["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["calico", "portmap", PLUGIN_TYPE], "{key}: {copy}");
        assert!(plugins[2].get(key).is_none(), "{key}: {copy}");
        // The copy is current; the stale entry left in the primary is the
        // mode switch's to remove, once the copy is in place.
        let after = diagnose(d.path(), &want).unwrap();
        assert_eq!(after.state, OwnedState::Current, "{key}: {after}");
    }
}

#[test]
fn an_invalid_primary_is_left_alone_and_so_is_our_file() {
    let d = TempDir::new("owned-invalid");
    d.write("10-calico.conflist", CALICO);
    let want = owned_desired();
    sync(d.path(), &want, &opts()).unwrap();
    let before = d.read("10-calico-linkerd-cni.conflist");
    // Caught half-way through an in-place rewrite.
    d.write("10-calico.conflist", &CALICO[..40]);
    let diag = diagnose(d.path(), &want).unwrap();
    assert!(
        matches!(diag.state, OwnedState::PrimaryInvalid { .. }),
        "{diag:?}"
    );
    let r = sync(d.path(), &want, &opts()).unwrap();
    assert!(!r.changed());
    assert_eq!(d.read("10-calico-linkerd-cni.conflist"), before);
}

#[test]
fn our_file_renamed_away_by_another_agent_means_falling_back_to_inline() {
    let d = TempDir::new("owned-cilium");
    d.write("05-cilium.conflist", &CALICO.replace("calico", "cilium"));
    let want = owned_desired();
    sync(d.path(), &want, &opts()).unwrap();
    fs::rename(
        d.path().join("05-cilium-linkerd-cni.conflist"),
        d.path().join("05-cilium-linkerd-cni.conflist.cilium_bak"),
    )
    .unwrap();
    let diag = diagnose(d.path(), &want).unwrap();
    match &diag.state {
        OwnedState::Fallback { reason } => {
            assert!(reason.contains("cni.exclusive=false"), "{reason}")
        }
        s => panic!("{s:?}"),
    }
    let r = sync(d.path(), &want, &opts()).unwrap();
    assert!(!r.changed(), "no fight: {r:?}");
}

#[test]
fn switching_from_inline_then_back_never_leaves_the_active_file_unchained() {
    let d = TempDir::new("owned-switch");
    d.write("10-calico.conflist", CALICO);
    let inline = desired();
    let owned = owned_desired();
    repair(d.path(), &inline, &opts()).unwrap();
    assert_eq!(
        inline_diagnose(d.path(), &inline).unwrap().state,
        ChainState::Healthy
    );
    let digest_inline = chain_digest(
        &d.path().join("10-calico.conflist"),
        d.read("10-calico.conflist").as_bytes(),
    );
    // The digest ignores our entry: the same chain with or without it.
    assert_eq!(digest_inline, sha256::hex(CALICO.as_bytes()));
    // inline -> owned: our file first, then the entry out of the primary.
    let r = crate::keep(
        &crate::Context::new(
            d.path(),
            owned.clone(),
            crate::ModeChoice::of_entry(&owned).unwrap(),
            std::time::Duration::from_secs(30),
        ),
        &mut crate::NoLimit,
    )
    .unwrap();
    let summary = r.to_string();
    assert!(summary.contains("took inline"), "{summary}");
    assert_eq!(d.read("10-calico.conflist"), CALICO);
    assert!(diagnose(d.path(), &owned).unwrap().is_current());
    // owned -> inline: the entry back into the primary first (inline
    // diagnosis does not count our file as the active one), then our file
    // goes.
    assert_eq!(
        inline_diagnose(d.path(), &inline).unwrap().state,
        ChainState::Missing
    );
    repair(d.path(), &inline, &opts()).unwrap();
    assert_eq!(d.names().len(), 2);
    retire(d.path(), &opts()).unwrap();
    assert_eq!(d.names(), ["10-calico.conflist"]);
    assert_eq!(
        inline_diagnose(d.path(), &inline).unwrap().state,
        ChainState::Healthy
    );
}

#[test]
fn uninstall_leaves_the_conf_dir_byte_identical() {
    let d = TempDir::new("owned-uninstall");
    d.write("10-calico.conflist", CALICO);
    d.write("20-bridge.conf", r#"{"name":"b","type":"bridge"}"#);
    let before: Vec<(String, String)> = d.names().iter().map(|n| (n.clone(), d.read(n))).collect();
    sync(d.path(), &owned_desired(), &opts()).unwrap();
    assert_eq!(d.names().len(), 3);
    retire(d.path(), &opts()).unwrap();
    remove_entries(d.path(), &opts()).unwrap();
    let after: Vec<(String, String)> = d.names().iter().map(|n| (n.clone(), d.read(n))).collect();
    assert_eq!(before, after);
}

#[test]
fn the_mode_key() {
    assert_eq!(mode_of(&desired()).unwrap(), ChainMode::Inline);
    assert_eq!(mode_of(&owned_desired()).unwrap(), ChainMode::Owned);
    assert!(
        mode_of(&Entry::parse(br#"{"type":"linkerd-cni","chain_mode":"own"}"#, "test").unwrap())
            .is_err()
    );
}

#[test]
fn sync_does_not_write_without_the_required_file() {
    let d = TempDir::new("owned-requires");
    d.write("10-calico.conflist", CALICO);
    let o = RepairOptions {
        requires: Some(d.path().join("ZZZ-linkerd-cni-kubeconfig")),
        ..opts()
    };
    let r = sync(d.path(), &owned_desired(), &o).unwrap();
    assert!(!r.changed(), "{r:?}");
    assert_eq!(d.names(), ["10-calico.conflist"]);
}

#[test]
fn an_entry_rebuilt_from_stdin_finds_the_copy_current() {
    // Without the installer's entry file the plugin knows its entry only
    // from stdin, where the runtime has overwritten "name": the copy made
    // from the full entry is still current, and is not rewritten.
    let d = TempDir::new("owned-stdin");
    d.write("10-calico.conflist", CALICO);
    let mut full = owned_desired().into_map();
    full.shift_insert(0, "name".into(), Value::String("linkerd-cni".into()));
    let full = Entry::new(full, "test").unwrap();
    sync(d.path(), &full, &opts()).unwrap();
    let from_stdin = owned_desired();
    assert!(diagnose(d.path(), &from_stdin).unwrap().is_current());
    let r = sync(d.path(), &from_stdin, &opts()).unwrap();
    assert!(!r.changed(), "{r:?}");
    // A real change of the entry is still one.
    let other = from_stdin.with("log_level", "debug").unwrap();
    assert!(!diagnose(d.path(), &other).unwrap().is_current());
}

#[test]
fn a_symlinked_primary_is_read_as_the_host_resolves_it() {
    // The installer sees the host under a mount prefix: the primary is a
    // symlink with an absolute target, which only means something under
    // that prefix. Owned mode reads it there and writes only its own file,
    // in the conf dir; the link and its target stay as they are.
    let host = TempDir::new("owned-host");
    let conf = host.path().join("etc/cni/net.d");
    fs::create_dir_all(&conf).unwrap();
    let target = host.write("calico.conflist", CALICO);
    std::os::unix::fs::symlink("/calico.conflist", conf.join("10-calico.conflist")).unwrap();
    let want = owned_desired();
    let opts = RepairOptions {
        host_root: host.path().to_path_buf(),
        ..opts()
    };
    let r = sync(&conf, &want, &opts).unwrap();
    assert_eq!(r.after, OwnedState::Current, "{r:?}");
    let ours = fs::read_to_string(conf.join("10-calico-linkerd-cni.conflist")).unwrap();
    let v = json(&ours);
    assert_eq!(v["plugins"][0]["type"], "calico", "{ours}");
    let marker = Marker::of(v["plugins"][2].as_object().unwrap()).expect("marker");
    assert_eq!(marker.sha256, sha256::hex(CALICO.as_bytes()));
    assert_eq!(fs::read_to_string(&target).unwrap(), CALICO);
    assert!(
        fs::symlink_metadata(conf.join("10-calico.conflist"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(diagnose_with(&conf, &want, &opts).unwrap().is_current());
}

#[test]
fn a_file_with_a_forged_marker_is_not_ours_and_never_removed() {
    // Named like ours, holding our entry with a marker whose digest is not
    // that of the chain in it: someone else's config, left alone.
    let d = TempDir::new("owned-forged");
    d.write("10-calico.conflist", CALICO);
    let forged = CALICO.replace(
        "\"snat\": true, \"capabilities\": {\"portMappings\": true}}",
        "\"snat\": true, \"capabilities\": {\"portMappings\": true}},\n    {\"type\": \"linkerd-cni\", \"owned_copy_of\": {\"file\": \"20-x.conflist\", \"sha256\": \"0000\"}}",
    );
    assert!(forged.contains("owned_copy_of"), "the fixture changed");
    d.write("20-x-linkerd-cni.conflist", &forged);
    let r = sync(d.path(), &owned_desired(), &opts()).unwrap();
    assert!(r.changed(), "{r:?}");
    assert_eq!(d.read("20-x-linkerd-cni.conflist"), forged);
    let listing = list(d.path(), &RepairOptions::default()).unwrap();
    assert_eq!(
        listing
            .owned
            .iter()
            .map(|o| o.path.clone())
            .collect::<Vec<_>>(),
        [d.path().join("10-calico-linkerd-cni.conflist")]
    );
}

#[test]
fn a_file_of_ours_that_cannot_be_read_is_never_taken_for_the_primary() {
    // A FIFO stands for any read failure (too many open files, EIO): what
    // it is cannot be told, so nothing is written and the reason is given.
    let d = TempDir::new("owned-unreadable");
    d.write("10-calico.conflist", CALICO);
    nix::unistd::mkfifo(
        &d.path().join("05-x-linkerd-cni.conflist"),
        nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
    )
    .unwrap();
    let diag = diagnose(d.path(), &owned_desired()).unwrap();
    match &diag.state {
        OwnedState::PrimaryInvalid { reason } => {
            assert!(reason.contains("cannot tell"), "{reason}")
        }
        s => panic!("{s:?}"),
    }
    let r = sync(d.path(), &owned_desired(), &opts()).unwrap();
    assert!(!r.changed(), "{r:?}");
    assert_eq!(
        d.names(),
        ["05-x-linkerd-cni.conflist", "10-calico.conflist"]
    );
}

const OURS: &str = "10-calico-linkerd-cni.conflist";

/// Runs a sync that crashes right after our copy is put in place, before
/// it reaches the disk: the disk then holds our file with its data lost
/// (`zeros` of its size, or nothing). Returns the durability steps taken
/// before the crash.
fn sync_crashing_after_the_swap(d: &TempDir, zeros: bool) -> Vec<&'static str> {
    use std::cell::RefCell;
    use std::rc::Rc;
    let ours = d.join(OURS);
    let before = Rc::new(RefCell::new(Vec::new()));
    let seen = Rc::clone(&before);
    crate::inline::testing::after_next_exchange(move || {
        *seen.borrow_mut() = write::order::take();
        let len = fs::metadata(&ours).map_or(0, |m| m.len());
        let lost = vec![0u8; if zeros { len as usize } else { 0 }];
        fs::write(&ours, lost).unwrap();
        panic!("crash");
    });
    write::order::take();
    let crashed = std::panic::catch_unwind(|| sync(d.path(), &owned_desired(), &opts()));
    assert!(
        crashed.is_err(),
        "the sync was to crash, it ended: {crashed:?}"
    );
    before.take()
}

#[test]
fn the_copy_is_in_place_before_the_disk_is_waited_for() {
    let d = TempDir::new("owned-order");
    d.write("10-calico.conflist", CALICO);
    let want = owned_desired();
    sync(d.path(), &want, &opts()).unwrap();
    d.write("10-calico.conflist", &CALICO.replace("1440", "1450"));
    write::order::take();
    let r = sync(d.path(), &want, &opts()).unwrap();
    assert!(r.changed() && !r.created, "{r:?}");
    // The runtime loads the new copy from the exchange on; it reaches the
    // disk before the copy it displaced is removed.
    assert_eq!(
        write::order::take(),
        ["exchange", "fsync file", "remove displaced", "fsync dir"]
    );
    assert!(diagnose(d.path(), &want).unwrap().is_current());
}

#[test]
fn a_crash_before_the_new_copy_reached_the_disk_puts_the_old_one_back() {
    for zeros in [false, true] {
        let d = TempDir::new("owned-crash-swap");
        d.write("10-calico.conflist", CALICO);
        let want = owned_desired();
        sync(d.path(), &want, &opts()).unwrap();
        let old_copy = d.read(OURS);
        d.write("10-calico.conflist", &CALICO.replace("1440", "1450"));
        assert_eq!(sync_crashing_after_the_swap(&d, zeros), ["exchange"]);
        // The copy it displaced is parked under the swap's intent.
        let parked: Vec<_> = d
            .names()
            .into_iter()
            .filter(|n| n.starts_with(write::TEMP_PREFIX))
            .collect();
        assert_eq!(parked.len(), 1, "{parked:?}");
        assert_eq!(d.read(&parked[0]), old_copy);
        // Recovery puts it back (our file is not removed and created
        // again), and the primary's newest is copied.
        let r = sync(d.path(), &want, &opts()).unwrap();
        assert!(
            matches!(&r.actions[..], [Action::Restored(n), Action::Copied { created: false, .. }] if n.contains("a crash lost")),
            "{r:?}"
        );
        assert!(diagnose(d.path(), &want).unwrap().is_current());
        assert_eq!(d.names(), [OURS, "10-calico.conflist"]);
        assert_eq!(json(&d.read(OURS))["plugins"][0]["mtu"], 1450);
    }
}

#[test]
fn a_first_copy_a_crash_lost_is_written_again() {
    for zeros in [false, true] {
        let d = TempDir::new("owned-crash-first");
        d.write("10-calico.conflist", CALICO);
        let want = owned_desired();
        sync_crashing_after_the_swap(&d, zeros);
        assert_eq!(d.names(), [OURS, "10-calico.conflist"]);
        // Not taken for the primary, which would leave it in place: ours,
        // to be written again.
        let diag = diagnose(d.path(), &want).unwrap();
        assert_eq!(diag.primary, Some(d.join("10-calico.conflist")));
        assert_eq!(diag.state, OwnedState::Outdated);
        let r = sync(d.path(), &want, &opts()).unwrap();
        assert!(r.changed() && r.created, "{r:?}");
        assert!(diagnose(d.path(), &want).unwrap().is_current());
        assert_eq!(d.names(), [OURS, "10-calico.conflist"]);
    }
}

#[test]
fn a_primary_write_while_we_copy_is_copied_in_the_same_sync() {
    let d = TempDir::new("owned-write-during-copy");
    d.write("10-calico.conflist", CALICO);
    let want = owned_desired();
    sync(d.path(), &want, &opts()).unwrap();
    d.write("10-calico.conflist", &CALICO.replace("1440", "1450"));
    let primary = d.join("10-calico.conflist");
    crate::inline::testing::after_next_exchange(move || {
        fs::write(&primary, CALICO.replace("1440", "1460")).unwrap()
    });
    let r = sync(d.path(), &want, &opts()).unwrap();
    assert_eq!(r.after, OwnedState::Current, "{r:?}");
    assert_eq!(json(&d.read(OURS))["plugins"][0]["mtu"], 1460);
    assert!(diagnose(d.path(), &want).unwrap().is_current());
}

/// The meaning digest is recorded in every owned file's marker: its
/// canonical form must never change, or every copy on every node would
/// look stale after an upgrade. Pinned on escapes, non-ASCII keys, big and
/// exact numbers, nesting and key order.
#[test]
fn the_meaning_digest_of_a_chain_is_pinned() {
    let chain = br#"{"z": 1, "name": "k8s-pod-network", "cniVersion": "0.3.1",
        "plugins": [{"type": "calico", "b": {"y": [1.50, 1e3, 123456789012345678901234567890], "x": null},
        "a": "tab\t\"quote\" \u00e9\ud83d\ude00", "\u00e9": true, "A": false}]}"#;
    assert_eq!(
        meaning_digest(Path::new("10-calico.conflist"), chain).as_deref(),
        Some("7f1b33879036df9e340585b39d29a224c5eee5dafa52a41c80e17cba5770fa30")
    );
}
