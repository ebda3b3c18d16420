//! The chain at ADD: the glue between the CNI invocation (its config, its
//! stdin) and the chain library's keeper (`linkerd_cni_chain::keep`).
//!
//! The plugin builds the keeper's context (the desired entry, the mode, the
//! budget, the kubeconfig that must exist for anything to be written, and
//! the owned file's marker when the runtime ran our own copy), passes its
//! repair history (kept in its state dir, recorded under the conf-dir lock)
//! and logs what comes back. The healthy path (almost every ADD) takes no
//! lock and writes nothing into the conf dir; while the conf dir's files
//! keep the stamps of the last healthy look it reads none of them either
//! (`linkerd_cni_state::memo`). Nothing here can fail or delay the ADD beyond
//! the budget, except on purpose: an ADD that ran a stale copy of the
//! primary's chain in owned mode is sent back (CNI code 11) so that the
//! runtime retries with the current one.

use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use linkerd_cni_chain::owned::{ChainMode, MARKER_KEY, Marker};
use linkerd_cni_chain::{ChainError, Context, Entry, ModeChoice, RepairOptions, keep, load_entry};
use linkerd_cni_state::PersistedFights;
use linkerd_cni_state::memo::{Memo, Stamps};

use crate::cni::{CniError, NetConf};
use crate::config::PluginConfig;

/// Keys a runtime adds to a plugin's config when invoking it: not part of
/// the entry in the conflist.
const INJECTED: [&str; 5] = ["name", "cniVersion", "prevResult", "runtimeConfig", "args"];

/// Fight detection for the plugin: this many repairs of the same content of
/// one file in this window is a fight (then at most one repair of that
/// content per window / threshold).
const FIGHT_WINDOW: Duration = Duration::from_secs(600);
const FIGHT_THRESHOLD: u32 = 5;

/// The entry the plugin was invoked with: its stdin config minus what the
/// runtime injects (and minus an owned copy's marker, which belongs to the
/// copy, not the entry). An error when that is not one of ours (the plugin
/// was installed under another type name), since the chain could not then
/// be told to hold it.
pub fn entry_from_stdin(raw: &Map<String, Value>) -> Result<Entry, ChainError> {
    let plugin = raw
        .iter()
        .filter(|(k, _)| !INJECTED.contains(&k.as_str()) && k.as_str() != MARKER_KEY)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Entry::new(plugin, "the config this ADD was invoked with")
}

/// The desired entry: the installer's, else the one this ADD was invoked
/// with.
fn desired(conf: &NetConf, config: &PluginConfig) -> Result<Entry, ChainError> {
    match load_entry(&config.cni_conf_dir) {
        Ok(Some(e)) => Ok(e),
        Ok(None) => entry_from_stdin(&conf.raw),
        Err(e) => {
            log::warn!("chain check: {e}; using the entry this ADD was invoked with");
            entry_from_stdin(&conf.raw)
        }
    }
}

/// How many times one pod is sent back (code 11) for having run a
/// stale owned copy before its ADD is accepted on the copy it ran. That
/// copy always holds linkerd-cni (the pod gets its rules); only the
/// primary's chain in it is older, by one rewrite. Without a bound, a
/// primary rewriting faster than a pod starts would keep every pod from
/// starting, each retry costing it a kubelet back-off.
const MAX_STALE_RETRIES: u64 = 2;

/// Whether `pod` may be sent back once more for a stale copy (and counts
/// it in the state dir's retry history), or has been sent back
/// [`MAX_STALE_RETRIES`] times and is let through.
fn send_back_again(config: &PluginConfig, pod: Option<&str>) -> bool {
    let Some(id) = pod else { return true };
    linkerd_cni_state::retries::send_back_again(&config.state_dir, id, MAX_STALE_RETRIES)
}

/// Keeps the chain within `config.chain_repair_budget`. `Err` (code 11)
/// only when the ADD of `pod` (its uid, else namespace/name) ran a stale
/// owned copy, at most [`MAX_STALE_RETRIES`] times per pod; any other
/// trouble is logged and
/// the ADD goes on.
pub fn chain_on_add(
    conf: &NetConf,
    config: &PluginConfig,
    pod: Option<&str>,
) -> Result<(), CniError> {
    if !config.chain_heal {
        return Ok(());
    }
    let start = Instant::now();
    let ran = Marker::of(&conf.raw);
    let memo = Memo::in_dir(&config.state_dir);
    if memo.holds(&config.cni_conf_dir, ran.as_ref()) {
        log::debug!("chain check: healthy, as last seen ({:?})", start.elapsed());
        return Ok(());
    }
    let stamps = Stamps::take(&config.cni_conf_dir);
    let desired = match desired(conf, config) {
        Ok(e) => e,
        Err(e) => {
            log::warn!(
                "chain check skipped: {e}, so this plugin's entry cannot be recognised in the chain"
            );
            return Ok(());
        }
    };
    let mode = ModeChoice::of_entry(&desired).unwrap_or_else(|e| {
        log::warn!("chain check: {e}; using inline mode");
        ModeChoice::new(ChainMode::Inline, format!("{e}; inline mode used instead"))
    });
    let ctx = Context {
        conf_dir: config.cni_conf_dir.clone(),
        desired,
        mode,
        opts: RepairOptions {
            // What an uninstall removes before its last sweep, so that no
            // ADD chains us again after it: the kubeconfig, or with
            // `kubernetes.agent-only` (no kubeconfig) the heartbeat.
            requires: if config.agent_only {
                Some(linkerd_cni_state::record::path::<
                    linkerd_cni_state::heartbeat::Beat,
                >(&config.state_dir))
            } else {
                config.kubeconfig.clone()
            },
            write_outside_conf_dir: config.chain_write_outside_conf_dir,
            ..RepairOptions::default()
        },
        deadline: start + config.chain_repair_budget,
        ran,
    };
    let mut fights = PersistedFights::load(&config.state_dir, FIGHT_WINDOW, FIGHT_THRESHOLD);
    let report = match keep(&ctx, &mut fights) {
        Ok(r) => r,
        Err(e) => {
            log::warn!("chain check skipped: {e}");
            return Ok(());
        }
    };
    if report.is_news() {
        log::warn!("chain: {report}");
    } else {
        log::debug!("chain check: healthy ({:?})", start.elapsed());
    }
    memo.remember(&ctx.conf_dir, stamps, ctx.ran.as_ref(), &report);
    match report.stale {
        None => Ok(()),
        Some(why) if !send_back_again(config, pod) => {
            log::warn!(
                "the chain that ran was stale ({why}); accepted after {MAX_STALE_RETRIES} retries of this pod: linkerd-cni ran, and its config now follows the primary's"
            );
            Ok(())
        }
        Some(why) => {
            log::warn!("the chain that ran was stale ({why}); asking the runtime to retry");
            Err(CniError::try_again(
                linkerd_cni_state::outcomes::RetryCause::StaleOwnedCopy,
                "the network config this ADD ran is out of date; try again",
                format!(
                    "linkerd-cni owned mode: {why}; linkerd-cni's config now follows the primary's, so a retry runs the current chain"
                ),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    //! Healing on ADD, with the plugin's config as the runtime passes it.

    use std::fs;
    use std::os::unix::fs::MetadataExt;
    use std::path::{Path, PathBuf};

    use linkerd_cni_chain::{ChainState, Diagnosis, PLUGIN_TYPE, content_sha256, persist_entry};
    use linkerd_cni_state::FIGHT_STATE_FILE;
    use linkerd_cni_state::retries::STALE_RETRIES_FILE;

    /// The primary's file as the chain crate's one judge sees it.
    fn diagnose(conf_dir: &Path, want: &Entry) -> Result<Diagnosis, ChainError> {
        let mode = ModeChoice::of_entry(want)?;
        let ctx = Context::new(conf_dir, want.clone(), mode, Duration::from_secs(5));
        linkerd_cni_chain::health(&ctx).map(|h| h.inline)
    }

    use super::*;

    /// A throwaway directory with the two file helpers these tests use.
    struct TempDir(testkit::TempDir);

    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let t = testkit::TempDir::new(&format!("lcni-{tag}")).expect("create temp dir");
            // Empty, even if a killed process with the same pid left it:
            // a stale fight history would postpone every repair.
            fs::remove_dir_all(t.path()).expect("clear temp dir");
            fs::create_dir(t.path()).expect("create temp dir");
            TempDir(t)
        }

        fn path(&self) -> &Path {
            self.0.path()
        }

        fn write(&self, name: &str, text: &str) -> PathBuf {
            let p = self.path().join(name);
            fs::write(&p, text).expect("write");
            p
        }

        fn read(&self, name: &str) -> String {
            fs::read_to_string(self.path().join(name)).expect("read")
        }
    }

    use testkit::chain::CALICO;

    /// The entry the chart renders.
    fn desired() -> Map<String, Value> {
        testkit::chain::chart_entry()
    }

    struct Node {
        conf: TempDir,
        state: TempDir,
    }

    fn node() -> Node {
        let n = Node {
            conf: TempDir::new("heal-conf"),
            state: TempDir::new("heal-state"),
        };
        // Healing requires the kubeconfig the entry names (see
        // `RepairOptions::requires`).
        n.state.write("kubeconfig", "apiVersion: v1\n");
        n
    }

    /// The stdin of an ADD for the entry `desired()`, as libcni builds it.
    fn stdin(n: &Node, extra: &[(&str, Value)]) -> NetConf {
        let mut m = desired();
        m.insert(
            "cni_conf_dir".into(),
            n.conf.path().to_string_lossy().into(),
        );
        m.insert("state_dir".into(), n.state.path().to_string_lossy().into());
        m.insert(
            "kubernetes".into(),
            serde_json::json!({"kubeconfig": n.state.path().join("kubeconfig")}),
        );
        for (k, v) in extra {
            m.insert((*k).into(), v.clone());
        }
        m.insert("name".into(), "k8s-pod-network".into());
        m.insert("cniVersion".into(), "0.3.1".into());
        m.insert(
            "prevResult".into(),
            serde_json::json!({"cniVersion":"0.3.1","ips":[]}),
        );
        m.insert(
            "runtimeConfig".into(),
            serde_json::json!({"portMappings":[]}),
        );
        NetConf::parse(Value::Object(m).to_string().as_bytes()).unwrap()
    }

    fn heal(conf: &NetConf) {
        let config = PluginConfig::from_map(&conf.raw).unwrap();
        assert!(
            chain_on_add(conf, &config, None).is_ok(),
            "no stale copy ran"
        );
    }

    /// The entry the plugin derives from `stdin(n, extra)`.
    fn derived(n: &Node, extra: &[(&str, Value)]) -> Entry {
        entry_from_stdin(&stdin(n, extra).raw).unwrap()
    }

    /// The retry history is read non-blocking: a FIFO in its place is no
    /// history, and the ADD is sent back (at most the usual number of
    /// times) rather than held up.
    #[test]
    fn a_retry_history_that_is_not_regular_does_not_block() {
        let n = node();
        let history = n.state.path().join(STALE_RETRIES_FILE);
        testkit::mkfifo(&history);
        let config = PluginConfig::from_map(&stdin(&n, &[]).raw).unwrap();
        let again = testkit::bounded(
            "a FIFO retry history",
            std::time::Duration::from_secs(20),
            move || send_back_again(&config, Some("uid-1")),
        );
        assert!(again);
        // Saved over the FIFO (by rename): a history again.
        assert!(fs::metadata(&history).unwrap().is_file());
        let saved: Value = serde_json::from_str(&n.state.read(STALE_RETRIES_FILE)).unwrap();
        assert_eq!(saved["uid-1"][0], 1, "{saved}");
    }

    /// A pod is sent back only once that is recorded: while another ADD
    /// holds the state dir's lock past the wait, the history is neither
    /// written (that could lose the holder's count) nor taken as a reason
    /// to send the pod back, and the bound holds once the lock is free.
    #[test]
    fn a_retry_history_that_cannot_be_locked_lets_the_add_through() {
        let n = node();
        let history = n.state.path().join(STALE_RETRIES_FILE);
        let config = PluginConfig::from_map(&stdin(&n, &[]).raw).unwrap();
        {
            let _held =
                linkerd_cni_chain::lock_dir(n.state.path(), Duration::from_secs(5), None).unwrap();
            for _ in 0..3 {
                assert!(!send_back_again(&config, Some("uid-1")));
            }
            assert!(!history.exists(), "written without the lock");
        }
        let sent: Vec<bool> = (0..4)
            .map(|_| send_back_again(&config, Some("uid-1")))
            .collect();
        assert_eq!(sent, [true, true, false, true]);
    }

    /// A send-back that cannot be saved is not made: it would not count.
    #[test]
    fn a_retry_history_that_cannot_be_saved_lets_the_add_through() {
        let n = node();
        let history = n.state.path().join(STALE_RETRIES_FILE);
        // A directory in its place: nothing renames a file over it.
        fs::create_dir_all(history.join("d")).unwrap();
        let config = PluginConfig::from_map(&stdin(&n, &[]).raw).unwrap();
        for _ in 0..3 {
            assert!(!send_back_again(&config, Some("uid-1")));
        }
        fs::remove_dir_all(&history).unwrap();
        assert!(send_back_again(&config, Some("uid-1")));
    }

    /// The retry history's times are bounded: one far ahead of now would
    /// never expire, and its count would let the pod through at once for
    /// good. Nor is a history believed unless root's own.
    #[test]
    fn a_retry_history_from_the_future_or_not_roots_own_is_no_history() {
        use std::os::unix::fs::PermissionsExt;
        let n = node();
        let config = PluginConfig::from_map(&stdin(&n, &[]).raw).unwrap();
        let history = n.state.path().join(STALE_RETRIES_FILE);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let sent_back = [MAX_STALE_RETRIES, now];
        let write = |t: u64| {
            fs::write(
                &history,
                serde_json::json!({"uid-1": [sent_back[0], t]}).to_string(),
            )
            .unwrap();
            fs::set_permissions(&history, fs::Permissions::from_mode(0o600)).unwrap();
        };
        write(sent_back[1]);
        assert!(!send_back_again(&config, Some("uid-1")), "sent back enough");
        write(now + 1_000_000_000);
        assert!(
            send_back_again(&config, Some("uid-1")),
            "a time ahead of now"
        );
        write(now);
        fs::set_permissions(&history, fs::Permissions::from_mode(0o666)).unwrap();
        assert!(
            send_back_again(&config, Some("uid-1")),
            "writable by others"
        );
    }

    #[test]
    fn stdin_entry_is_the_config_minus_runtime_keys() {
        let n = node();
        let e = derived(&n, &[]);
        for k in ["name", "cniVersion", "prevResult", "runtimeConfig", "args"] {
            assert!(!e.contains_key(k), "{k}");
        }
        assert_eq!(e.get("type"), Some(&Value::from(PLUGIN_TYPE)));
        assert!(e.contains_key("cni_conf_dir") && e.contains_key("linkerd"));
    }

    #[test]
    fn a_plugin_invoked_under_another_type_has_no_entry_and_heals_nothing() {
        let n = node();
        let f = n.conf.write("10-calico.conflist", CALICO);
        let conf = stdin(&n, &[("type", Value::from("linkerd-cni-renamed"))]);
        let e = entry_from_stdin(&conf.raw).unwrap_err().to_string();
        assert!(e.contains("linkerd-cni-renamed"), "{e}");
        heal(&conf);
        assert_eq!(fs::read_to_string(&f).unwrap(), CALICO);
    }

    #[test]
    fn stale_first_entry_is_moved_last_and_refreshed() {
        let n = node();
        let mut stale = desired();
        stale.insert("log_level".into(), "debug".into());
        let calico = CALICO.replacen(
            "\"plugins\": [\n",
            &format!("\"plugins\": [\n    {},\n", Value::Object(stale)),
            1,
        );
        let f = n.conf.write("10-calico.conflist", &calico);
        let conf = stdin(&n, &[]);
        heal(&conf);
        let text = fs::read_to_string(&f).unwrap();
        let want = derived(&n, &[]);
        let d = diagnose(n.conf.path(), &want).unwrap();
        assert_eq!(d.active.as_deref(), Some(f.as_path()));
        assert_eq!(d.state, ChainState::Healthy, "{text}");
        // The state dir remembers the repair, for fight detection.
        assert!(
            n.state
                .read(FIGHT_STATE_FILE)
                .contains("10-calico.conflist")
        );
    }

    #[test]
    fn no_heal_while_the_kubeconfig_is_gone() {
        // Uninstall removes the kubeconfig, then sweeps the entries again:
        // an ADD must not put the entry back in between.
        let n = node();
        let f = n.conf.write("10-calico.conflist", CALICO);
        let gone = n.state.path().join("removed-kubeconfig");
        let conf = stdin(
            &n,
            &[("kubernetes", serde_json::json!({"kubeconfig": gone}))],
        );
        heal(&conf);
        assert_eq!(fs::read_to_string(&f).unwrap(), CALICO);
        // Without the guard the same ADD heals (the test can fail).
        heal(&stdin(&n, &[]));
        assert!(fs::read_to_string(&f).unwrap().contains(PLUGIN_TYPE));
    }

    #[test]
    fn entry_file_wins_over_stdin() {
        let n = node();
        n.conf.write("10-calico.conflist", CALICO);
        let mut persisted = desired();
        persisted.insert("log_level".into(), "debug".into());
        let persisted = Entry::new(persisted, "a test").unwrap();
        persist_entry(n.conf.path(), &persisted).unwrap();
        heal(&stdin(&n, &[]));
        assert!(diagnose(n.conf.path(), &persisted).unwrap().is_healthy());
    }

    #[test]
    fn a_remembered_healthy_look_still_sees_the_primary_rewrite() {
        let n = node();
        let f = n.conf.write("10-calico.conflist", CALICO);
        let want = derived(&n, &[]);
        persist_entry(n.conf.path(), &want).unwrap();
        let conf = stdin(&n, &[]);
        heal(&conf);
        assert!(diagnose(n.conf.path(), &want).unwrap().is_healthy());
        // Once the files are older than the racy bound, a healthy look is
        // remembered and the next ADD reads no file.
        std::thread::sleep(linkerd_cni_state::memo::RACY + Duration::from_millis(100));
        heal(&conf);
        let memo = n.state.path().join(linkerd_cni_state::memo::MEMO_FILE);
        assert!(memo.is_file(), "a settled healthy look is remembered");
        // The primary rewrites its file in place, then renames a new one
        // over it: each ADD after is a full look, and heals.
        fs::write(&f, CALICO).unwrap();
        heal(&conf);
        assert!(
            diagnose(n.conf.path(), &want).unwrap().is_healthy(),
            "in place"
        );
        let new = n.conf.write(".calico-new", CALICO);
        fs::rename(&new, &f).unwrap();
        heal(&conf);
        assert!(
            diagnose(n.conf.path(), &want).unwrap().is_healthy(),
            "renamed"
        );
    }

    #[test]
    fn healthy_path_takes_no_lock_and_writes_nothing() {
        let n = node();
        let f = n.conf.write("10-calico.conflist", CALICO);
        // A budget so long that one check waiting for the held lock would
        // show, whatever the machine's load: healthy checks take
        // milliseconds and never look at the lock.
        let conf = stdin(&n, &[("chain_repair_budget_seconds", Value::from(30))]);
        heal(&conf);
        let m1 = fs::metadata(&f).unwrap();
        let _holder =
            linkerd_cni_chain::lock_dir(n.conf.path(), Duration::from_secs(1), None).unwrap();
        let start = Instant::now();
        for _ in 0..20 {
            heal(&conf);
        }
        // Twenty healthy checks with the lock held: none waited for it.
        assert!(start.elapsed() < Duration::from_secs(30));
        let m2 = fs::metadata(&f).unwrap();
        assert_eq!((m1.ino(), m1.mtime_nsec()), (m2.ino(), m2.mtime_nsec()));
    }

    #[test]
    fn repair_trouble_never_fails_or_outlasts_the_budget() {
        let n = node();
        let f = n.conf.write("10-calico.conflist", CALICO);
        let conf = stdin(&n, &[("chain_repair_budget_seconds", Value::from(0.3))]);
        let holder =
            linkerd_cni_chain::lock_dir(n.conf.path(), Duration::from_secs(1), None).unwrap();
        let start = Instant::now();
        heal(&conf);
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(250), "{took:?}");
        assert!(took < Duration::from_secs(3), "{took:?}");
        assert_eq!(fs::read_to_string(&f).unwrap(), CALICO);
        drop(holder);
        heal(&conf);
        assert!(fs::read_to_string(&f).unwrap().contains(PLUGIN_TYPE));
    }

    #[test]
    fn unusable_state_dir_or_conf_dir_never_fails() {
        let n = node();
        let f = n.conf.write("10-calico.conflist", CALICO);
        // The state dir is a regular file: nothing can be saved there.
        let bogus = n.state.write("not-a-dir", "x");
        let mut conf = stdin(&n, &[]);
        conf.raw
            .insert("state_dir".into(), bogus.to_string_lossy().into());
        heal(&conf);
        assert!(fs::read_to_string(&f).unwrap().contains(PLUGIN_TYPE));
        let mut conf = stdin(&n, &[]);
        conf.raw.insert(
            "cni_conf_dir".into(),
            n.conf.path().join("absent").to_string_lossy().into(),
        );
        heal(&conf);
        // Off switch.
        let f2 = n.conf.write("10-calico.conflist", CALICO);
        heal(&stdin(&n, &[("chain_heal", Value::Bool(false))]));
        assert_eq!(fs::read_to_string(&f2).unwrap(), CALICO);
    }

    #[test]
    fn a_fight_is_detected_and_repairs_are_rate_limited() {
        let n = node();
        let conf = stdin(&n, &[]);
        let mut repairs = 0;
        for _ in 0..8 {
            // Another agent rewrites the file without our entry.
            let f = n.conf.write("10-calico.conflist", CALICO);
            heal(&conf);
            if fs::read_to_string(&f).unwrap().contains(PLUGIN_TYPE) {
                repairs += 1;
            }
        }
        // The fifth repair within the window is a fight; then one per
        // window / threshold (two minutes), so none more in this test.
        assert_eq!(repairs, 5);
        let saved: Value = serde_json::from_str(&n.state.read(FIGHT_STATE_FILE)).unwrap();
        // Kept per content: the digest of what each repair started from.
        let same = n.state.write("calico-copy", CALICO);
        let key = format!(
            "{}#{}",
            n.conf.path().join("10-calico.conflist").display(),
            content_sha256(&same)
        );
        assert_eq!(saved[key.as_str()].as_array().unwrap().len(), 5, "{saved}");
    }

    #[test]
    fn a_primary_writing_new_content_is_repaired_every_time() {
        let n = node();
        let conf = stdin(&n, &[]);
        for i in 0..20 {
            // New content each time: no fight, however often.
            let text = CALICO.replace("1440", &format!("{}", 1400 + i));
            assert_ne!(text, CALICO, "the fixture has an MTU of 1440");
            let f = n.conf.write("10-calico.conflist", &text);
            heal(&conf);
            assert!(
                fs::read_to_string(&f).unwrap().contains(PLUGIN_TYPE),
                "write {i} not repaired"
            );
        }
    }

    #[test]
    fn concurrent_repairs_each_leave_a_record() {
        // Each ADD is invoked with a different entry, so each finds the
        // chain stale and repairs it: every repair must be in the history,
        // however the ADDs interleave.
        const ADDS: usize = 4;
        assert!(
            ADDS < FIGHT_THRESHOLD as usize,
            "the history keeps only the last few"
        );
        for round in 0..10 {
            let n = node();
            n.conf.write("10-calico.conflist", CALICO);
            let levels = ["debug", "info", "warn", "error"];
            let confs: Vec<NetConf> = levels
                .iter()
                .map(|l| {
                    stdin(
                        &n,
                        &[
                            ("log_level", Value::from(*l)),
                            ("chain_repair_budget_seconds", Value::from(30)),
                        ],
                    )
                })
                .collect();
            let start = std::sync::Barrier::new(ADDS);
            std::thread::scope(|s| {
                for conf in &confs {
                    let start = &start;
                    s.spawn(move || {
                        start.wait();
                        heal(conf);
                    });
                }
            });
            let saved: Value = serde_json::from_str(&n.state.read(FIGHT_STATE_FILE)).unwrap();
            let recorded: usize = saved
                .as_object()
                .unwrap()
                .values()
                .map(|v| v.as_array().map_or(0, Vec::len))
                .sum();
            assert_eq!(recorded, ADDS, "round {round}: {saved}");
        }
    }
}
