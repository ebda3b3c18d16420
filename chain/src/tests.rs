//! Tests of the chain module against real directories, and properties of
//! the text-preserving repair on generated conflists.

use std::fs::{self, File, Permissions};
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::inline::{self, diagnose_with, remove_entries, repair};
use super::names::Kind;
use super::plan::{self, differing_keys, is_ours};
use super::testutil::{TempDir, desired, object};
use super::*;
use testkit::chain::CALICO;

fn opts() -> RepairOptions {
    RepairOptions::default()
}

/// What a repair's recovery did, as the keeper reports it.
fn recovered(r: &inline::RepairReport) -> String {
    let lines: Vec<String> = r.recovery.iter().map(Action::to_string).collect();
    lines.join("; ")
}

#[test]
fn missing_entry_is_repaired_once_and_then_never_written() {
    let d = TempDir::new("once");
    let f = d.write("10-calico.conflist", CALICO);
    let want = desired();
    assert_eq!(
        diagnose(d.path(), &want).unwrap().state,
        ChainState::Missing
    );
    let r = repair(d.path(), &want, &opts()).unwrap();
    assert!(r.file.is_some());
    assert_eq!(r.file.as_deref(), Some(f.as_path()));
    assert_eq!(r.before, ChainState::Missing);
    assert!(diagnose(d.path(), &want).unwrap().is_healthy());
    let m1 = fs::metadata(&f).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let again = repair(d.path(), &want, &opts()).unwrap();
    assert!(again.file.is_none());
    assert_eq!(again.file, None);
    let m2 = fs::metadata(&f).unwrap();
    assert_eq!((m1.ino(), m1.mtime_nsec()), (m2.ino(), m2.mtime_nsec()));
    assert_eq!(d.names(), ["10-calico.conflist"]);
}

#[test]
fn entry_file_round_trip_and_validation() {
    let d = TempDir::new("entry");
    assert_eq!(load_entry(d.path()).unwrap(), None);
    assert_eq!(
        persist_entry(d.path(), &desired()).unwrap(),
        Some(Replaced::Absent)
    );
    let ino = fs::metadata(d.path().join(ENTRY_FILE)).unwrap().ino();
    assert_eq!(persist_entry(d.path(), &desired()).unwrap(), None);
    assert_eq!(fs::metadata(d.path().join(ENTRY_FILE)).unwrap().ino(), ino);
    assert_eq!(load_entry(d.path()).unwrap(), Some(desired()));
    assert!(!is_config_name(std::ffi::OsStr::new(ENTRY_FILE)));
    let other = desired().with("log_level", "debug").unwrap();
    assert_eq!(
        persist_entry(d.path(), &other).unwrap(),
        Some(Replaced::Different)
    );
    assert_eq!(load_entry(d.path()).unwrap(), Some(other.clone()));
    // A current file is compared without the conf-dir lock: a repair in
    // flight holding it delays nothing.
    let holder = File::open(d.path()).unwrap();
    holder.lock().unwrap();
    assert_eq!(persist_entry(d.path(), &other).unwrap(), None);
    drop(holder);
    d.write(ENTRY_FILE, "not json");
    assert_eq!(
        persist_entry(d.path(), &other).unwrap(),
        Some(Replaced::Unreadable)
    );
    assert_eq!(load_entry(d.path()).unwrap(), Some(other));
    assert!(remove_entry_file(d.path()).unwrap());
    assert!(!remove_entry_file(d.path()).unwrap());

    // Not ours, not an object, not JSON: clear errors, nothing written. An
    // entry not ours cannot even be made, so neither persisted nor diagnosed
    // against.
    let bad = Entry::new(object(r#"{"type":"calico"}"#), "a test");
    assert!(matches!(bad, Err(ChainError::InvalidEntry { .. })));
    assert!(matches!(
        desired().with("type", "calico"),
        Err(ChainError::InvalidEntry { .. })
    ));
    d.write(ENTRY_FILE, "[1]");
    let e = load_entry(d.path()).unwrap_err().to_string();
    assert!(
        e.contains(ENTRY_FILE) && e.contains("not a JSON object"),
        "{e}"
    );
    d.write(ENTRY_FILE, "{\"type\":");
    assert!(load_entry(d.path()).is_err());
    assert!(matches!(
        Entry::parse(b"{\"name\":\"x\"}", "a test"),
        Err(ChainError::InvalidEntry { .. })
    ));
}

#[test]
fn runtime_set_keys_are_not_compared() {
    let mut have = desired().into_map();
    have.shift_remove("name");
    have.insert("cniVersion".into(), "0.3.1".into());
    assert!(differing_keys(&have, &desired()).is_empty());
    have.insert("extra".into(), Value::Bool(true));
    have.shift_remove("log_level");
    assert_eq!(differing_keys(&have, &desired()), ["log_level", "extra"]);
}

#[test]
fn symlinked_conflist_is_written_through_to_its_target() {
    let d = TempDir::new("symlink");
    fs::create_dir(d.path().join("real")).unwrap();
    let target = d.path().join("real/calico.conflist");
    fs::write(&target, CALICO).unwrap();
    let link = d.path().join("10-calico.conflist");
    symlink("real/calico.conflist", &link).unwrap();
    let r = repair(d.path(), &desired(), &opts()).unwrap();
    // Reported as the config the runtime loads: the link, written through.
    assert_eq!(r.file.as_deref(), Some(link.as_path()), "{r:?}");
    assert!(
        fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(diagnose(d.path(), &desired()).unwrap().is_healthy());
    let text = fs::read_to_string(&target).unwrap();
    assert!(text.contains("linkerd-cni"));
    let mut names: Vec<_> = fs::read_dir(d.path().join("real"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["calico.conflist"]);
}

#[test]
fn mode_and_owner_are_kept() {
    let d = TempDir::new("mode");
    let f = d.write("10-calico.conflist", CALICO);
    fs::set_permissions(&f, Permissions::from_mode(0o600)).unwrap();
    // Tests run as root in CI (see test.sh); elsewhere only the mode is checked.
    let chowned = std::os::unix::fs::chown(&f, Some(4321), Some(8765)).is_ok();
    repair(d.path(), &desired(), &opts()).unwrap();
    let m = fs::metadata(&f).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o600);
    if chowned {
        assert_eq!((m.uid(), m.gid()), (4321, 8765));
    }
}

#[test]
fn leftovers_are_reported_and_cleaned() {
    let d = TempDir::new("leftover");
    d.write("10-calico.conflist", CALICO);
    repair(d.path(), &desired(), &opts()).unwrap();
    let tmp = d.write(&format!("{TEMP_PREFIX}999-1-abc"), "{half");
    let diag = diagnose(d.path(), &desired()).unwrap();
    assert_eq!(diag.state, ChainState::Healthy);
    assert!(!diag.is_healthy());
    assert!(diag.needs_repair());
    assert_eq!(diag.leftovers, std::slice::from_ref(&tmp));
    assert!(diag.to_string().contains("interrupted"), "{diag}");
    let r = repair(d.path(), &desired(), &opts()).unwrap();
    assert!(r.file.is_none());
    assert!(recovered(&r).contains("leftover"), "{r:?}");
    assert!(!tmp.exists());
    assert!(diagnose(d.path(), &desired()).unwrap().is_healthy());
}

#[test]
fn invalid_active_file_is_never_touched() {
    let d = TempDir::new("invalid");
    let f = d.write("10-calico.conflist", &CALICO[..100]);
    d.write("20-other.conflist", CALICO);
    let r = repair(d.path(), &desired(), &opts()).unwrap();
    assert!(r.file.is_none());
    assert!(matches!(r.before, ChainState::Invalid { .. }));
    assert_eq!(fs::read_to_string(&f).unwrap(), &CALICO[..100]);
    assert!(
        !fs::read_to_string(d.path().join("20-other.conflist"))
            .unwrap()
            .contains("linkerd")
    );
}

#[test]
fn fifo_and_huge_files_do_not_hang_or_load() {
    let d = TempDir::new("fifo");
    let fifo = d.path().join("00-pipe.conflist");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let diag = diagnose(d.path(), &desired()).unwrap();
    assert!(
        matches!(&diag.state, ChainState::Invalid { reason } if reason.contains("regular")),
        "{diag}"
    );
    fs::remove_file(&fifo).unwrap();
    let big = format!("{{\"name\":\"x\",\"pad\":\"{}\"}}", "a".repeat(2 << 20));
    d.write("00-big.conflist", &big);
    let diag = diagnose(d.path(), &desired()).unwrap();
    assert!(
        matches!(&diag.state, ChainState::Invalid { reason } if reason.contains("larger")),
        "{diag}"
    );
}

#[test]
fn conf_becomes_conflist_and_the_conf_goes_only_after() {
    let d = TempDir::new("conf");
    let conf = r#"{"cniVersion":"0.4.0","name":"br","type":"bridge","bridge":"cni0","ipam":{"type":"host-local","subnet":"10.22.0.0/16"}}"#;
    let f = d.write("10-bridge.conf", conf);
    fs::set_permissions(&f, Permissions::from_mode(0o640)).unwrap();
    let r = repair(d.path(), &desired(), &opts()).unwrap();
    assert!(r.file.is_some());
    assert_eq!(r.before, ChainState::SingleConf);
    assert_eq!(d.names(), ["10-bridge.conflist"]);
    let list = d.path().join("10-bridge.conflist");
    assert_eq!(r.file.as_deref(), Some(list.as_path()));
    assert_eq!(fs::metadata(&list).unwrap().mode() & 0o7777, 0o640);
    let text = d.read("10-bridge.conflist");
    assert!(
        text.starts_with(&format!(
            r#"{{"name":"br","cniVersion":"0.4.0","plugins":[{conf},{{"name":"linkerd-cni""#
        )),
        "{text}"
    );
    assert!(diagnose(d.path(), &desired()).unwrap().is_healthy());
}

#[test]
fn conversion_never_shadows_or_clobbers() {
    let want = desired();
    let conf = r#"{"cniVersion":"0.4.0","name":"br","type":"bridge"}"#;
    // Someone's own 10-bridge.conflist: not ours to overwrite.
    let d = TempDir::new("conv1");
    d.write("10-bridge.conf", conf);
    d.write("10-bridge.conflist", CALICO);
    let e = repair(d.path(), &want, &opts()).unwrap_err();
    assert!(matches!(e, ChainError::Refused { .. }), "{e}");
    assert!(e.to_string().contains("remove one of the two"), "{e}");
    assert_eq!(d.read("10-bridge.conflist"), CALICO);
    assert_eq!(d.read("10-bridge.conf"), conf);
    // A file sorting between the .conf and the .conflist would take over.
    let d = TempDir::new("conv2");
    d.write("10-bridge.conf", conf);
    d.write("10-bridge.conf.json", r#"{"name":"x","type":"y"}"#);
    let e = repair(d.path(), &want, &opts()).unwrap_err();
    assert!(e.to_string().contains("10-bridge.conf.json"), "{e}");
    assert_eq!(d.names(), ["10-bridge.conf", "10-bridge.conf.json"]);
    // A .conflist of ours left by a conversion killed half-way is replaced.
    let d = TempDir::new("conv3");
    d.write("10-bridge.conf", conf);
    repair(d.path(), &want, &opts()).unwrap();
    let done = d.read("10-bridge.conflist");
    d.write("10-bridge.conf", conf);
    let old = desired().with("log_level", "debug").unwrap();
    let stale = plan::repaired(Kind::Single, conf.as_bytes(), &old).unwrap();
    fs::write(d.path().join("10-bridge.conflist"), stale).unwrap();
    repair(d.path(), &want, &opts()).unwrap();
    assert_eq!(d.names(), ["10-bridge.conflist"]);
    assert_eq!(d.read("10-bridge.conflist"), done);
}

#[test]
fn symlinked_conf_is_converted_and_its_target_kept() {
    let d = TempDir::new("conflink");
    fs::create_dir(d.path().join("src")).unwrap();
    fs::write(
        d.path().join("src/bridge.conf"),
        r#"{"name":"br","type":"bridge"}"#,
    )
    .unwrap();
    symlink("src/bridge.conf", d.path().join("10-bridge.conf")).unwrap();
    assert!(
        repair(d.path(), &desired(), &opts())
            .unwrap()
            .file
            .is_some()
    );
    assert_eq!(d.names(), ["10-bridge.conflist", "src"]);
    assert!(d.path().join("src/bridge.conf").exists());
    assert!(diagnose(d.path(), &desired()).unwrap().is_healthy());
}

/// A conf dir that is not a directory is refused at once, with an error
/// naming it: a FIFO (which a plain open would wait on for a writer) and
/// a regular file (which a plain open would lock).
#[test]
fn a_conf_dir_that_is_not_a_directory_is_refused_at_once() {
    let d = TempDir::new("lock-kinds");
    let fifo = d.path().join("fifo");
    testkit::mkfifo(&fifo);
    let file = d.write("file", "");
    for p in [fifo, file] {
        let q = p.clone();
        let e = testkit::bounded("lock a FIFO", Duration::from_secs(20), move || {
            lock_dir(&q, Duration::from_secs(1), None)
        })
        .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains(&p.display().to_string()) && text.contains("Not a directory"),
            "{text}"
        );
    }
}

#[test]
fn lock_wait_is_bounded_and_nothing_is_written_without_it() {
    let d = TempDir::new("lock");
    let f = d.write("10-calico.conflist", CALICO);
    let holder = lock_dir(d.path(), Duration::from_secs(1), None).unwrap();
    let start = Instant::now();
    let o = RepairOptions {
        lock_timeout: Duration::from_millis(150),
        ..RepairOptions::default()
    };
    let e = repair(d.path(), &desired(), &o).unwrap_err();
    assert!(matches!(e, ChainError::LockTimeout { .. }), "{e}");
    assert!(start.elapsed() < Duration::from_secs(5));
    // A deadline shorter than the timeout wins.
    let o = RepairOptions {
        lock_timeout: Duration::from_secs(60),
        deadline: Some(Instant::now() + Duration::from_millis(50)),
        ..RepairOptions::default()
    };
    assert!(matches!(
        repair(d.path(), &desired(), &o),
        Err(ChainError::LockTimeout { .. })
    ));
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(fs::read_to_string(&f).unwrap(), CALICO);
    // The diagnosis needs no lock.
    assert_eq!(
        diagnose(d.path(), &desired()).unwrap().state,
        ChainState::Missing
    );
    drop(holder);
    assert!(
        repair(d.path(), &desired(), &opts())
            .unwrap()
            .file
            .is_some()
    );
}

/// Any uid can `flock` the conf dir (it needs only a descriptor), the lock
/// of older versions: held by nobody, it must not stop a repair, which
/// waits for it only [`crate::lock::OLD_LOCK_WAIT`]. Nobody cannot open
/// the lock file repairs now take.
#[test]
fn a_conf_dir_flocked_by_another_user_does_not_stop_a_repair() {
    testkit::require_root("flock as another uid");
    let d = TempDir::new("lock-nobody");
    fs::set_permissions(d.path(), Permissions::from_mode(0o755)).unwrap();
    let f = d.write("10-calico.conflist", CALICO);
    let holder = testkit::flock_as_nobody(d.path()).expect("nobody can flock the conf dir");
    let start = Instant::now();
    let o = RepairOptions {
        lock_timeout: Duration::from_secs(5),
        ..RepairOptions::default()
    };
    let r = repair(d.path(), &desired(), &o);
    let took = start.elapsed();
    drop(holder);
    assert!(r.unwrap().file.is_some(), "repaired");
    assert!(fs::read_to_string(&f).unwrap().contains(PLUGIN_TYPE));
    assert!(took < Duration::from_secs(2), "{took:?}");
    // The lock file: root's, 0600, and nobody cannot hold it.
    let lock = d.path().join(LOCK_FILE);
    let meta = fs::symlink_metadata(&lock).unwrap();
    assert!(meta.is_file());
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, 0o600));
    assert!(
        testkit::flock_as_nobody(&lock).is_none(),
        "nobody cannot open it"
    );
}

/// Older versions' writers (which lock the conf dir only) and ours still
/// exclude each other: a writer waits for the dir's flock held briefly,
/// and holds it while it writes.
#[test]
fn an_older_writer_holding_the_conf_dir_is_waited_for_briefly() {
    let d = TempDir::new("lock-old");
    let old = File::open(d.path()).unwrap();
    old.lock().unwrap();
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        drop(old);
    });
    let start = Instant::now();
    let held = lock_dir(d.path(), Duration::from_secs(5), None).unwrap();
    assert!(
        start.elapsed() >= Duration::from_millis(90),
        "{:?}",
        start.elapsed()
    );
    release.join().unwrap();
    // An older writer now waits for us.
    let again = File::open(d.path()).unwrap();
    assert!(
        again.try_lock().is_err(),
        "the conf dir is held with the lock"
    );
    drop(held);
    again.try_lock().expect("released with the lock");
}

/// The lock file is only ever root's regular file: a symlink in its place
/// or another owner's file is refused (no repair then, and the error says
/// what to do), a looser mode is tightened, and a lock file removed while
/// a writer waited on it is not the one it ends up holding.
#[test]
fn the_lock_file_is_roots_own_and_may_be_removed_at_any_time() {
    testkit::require_root("chown");
    // The name the test helpers leave out of their listings.
    assert_eq!(LOCK_FILE, testkit::names::LOCK_FILE);
    let d = TempDir::new("lock-file");
    let lock = d.path().join(LOCK_FILE);
    let elsewhere = d.write("elsewhere", "");
    symlink(&elsewhere, &lock).unwrap();
    let e = lock_dir(d.path(), Duration::from_millis(100), None).unwrap_err();
    assert!(
        e.to_string().contains("symlink") && e.to_string().contains("remove it"),
        "{e}"
    );
    fs::remove_file(&lock).unwrap();
    fs::write(&lock, "").unwrap();
    std::os::unix::fs::chown(&lock, Some(1000), None).unwrap();
    let e = lock_dir(d.path(), Duration::from_millis(100), None).unwrap_err();
    assert!(e.to_string().contains("owned by root"), "{e}");
    fs::remove_file(&lock).unwrap();
    fs::write(&lock, "").unwrap();
    fs::set_permissions(&lock, Permissions::from_mode(0o644)).unwrap();
    drop(lock_dir(d.path(), Duration::from_millis(100), None).unwrap());
    assert_eq!(fs::metadata(&lock).unwrap().mode() & 0o7777, 0o600);
    // Removed (an uninstall) while another writer waits: the waiter makes
    // and holds a new one, which a third writer then waits for.
    let first = lock_dir(d.path(), Duration::from_secs(1), None).unwrap();
    let dir = d.path().to_path_buf();
    let waiter = std::thread::spawn(move || lock_dir(&dir, Duration::from_secs(5), None));
    std::thread::sleep(Duration::from_millis(50));
    fs::remove_file(&lock).unwrap();
    drop(first);
    let second = waiter.join().unwrap().unwrap();
    assert!(lock.is_file(), "made anew");
    assert!(matches!(
        lock_dir(d.path(), Duration::from_millis(100), None),
        Err(ChainError::LockTimeout { .. })
    ));
    drop(second);
    assert!(remove_lock_file(d.path(), Duration::from_secs(1)).unwrap());
    assert!(!lock.exists());
    assert!(!remove_lock_file(d.path(), Duration::from_secs(1)).unwrap());
}

#[test]
fn remove_entries_restores_every_file_byte_for_byte() {
    let d = TempDir::new("remove");
    let kindnet = "{\n\t\"cniVersion\": \"0.3.1\",\n\t\"name\": \"kindnet\",\n\t\"plugins\": [\n\t{\n\t\t\"type\": \"ptp\"\n\t}\n\t]\n}";
    d.write("10-calico.conflist", CALICO);
    d.write("20-kindnet.conflist", kindnet);
    d.write("30-bridge.conf", r#"{"name":"br","type":"bridge"}"#);
    repair(d.path(), &desired(), &opts()).unwrap();
    // An old install's entry in a non-active file.
    let stray = plan::repaired(Kind::List, kindnet.as_bytes(), &desired()).unwrap();
    fs::write(d.path().join("20-kindnet.conflist"), stray).unwrap();
    let diag = diagnose(d.path(), &desired()).unwrap();
    assert_eq!(diag.stray, [d.path().join("20-kindnet.conflist")]);
    let mut removed = remove_entries(d.path(), &opts()).unwrap();
    removed.sort();
    assert_eq!(
        removed,
        [
            d.path().join("10-calico.conflist"),
            d.path().join("20-kindnet.conflist")
        ]
    );
    assert_eq!(d.read("10-calico.conflist"), CALICO);
    assert_eq!(d.read("20-kindnet.conflist"), kindnet);
    assert_eq!(d.read("30-bridge.conf"), r#"{"name":"br","type":"bridge"}"#);
    assert!(remove_entries(d.path(), &opts()).unwrap().is_empty());
}

#[test]
fn remove_entries_keeps_a_converted_conflist_and_linkerd_only_files() {
    let d = TempDir::new("remove2");
    d.write(
        "10-bridge.conf",
        r#"{"name":"br","cniVersion":"1.0.0","type":"bridge"}"#,
    );
    repair(d.path(), &desired(), &opts()).unwrap();
    let only = format!(
        r#"{{"name":"l","cniVersion":"1.0.0","plugins":[{}]}}"#,
        Value::from(desired())
    );
    d.write("90-linkerd.conflist", &only);
    assert_eq!(
        remove_entries(d.path(), &opts()).unwrap(),
        [d.path().join("10-bridge.conflist")]
    );
    assert_eq!(
        d.read("10-bridge.conflist"),
        r#"{"name":"br","cniVersion":"1.0.0","plugins":[{"name":"br","cniVersion":"1.0.0","type":"bridge"}]}"#
    );
    assert_eq!(d.read("90-linkerd.conflist"), only);
}

#[test]
fn no_primary_means_no_write() {
    let d = TempDir::new("noprimary");
    let r = repair(d.path(), &desired(), &opts()).unwrap();
    assert_eq!(r.before, ChainState::NoPrimaryConfig);
    assert!(r.file.is_none());
    assert!(d.names().is_empty());
    let diag = diagnose(d.path(), &desired()).unwrap();
    assert!(
        diag.to_string()
            .contains("never writes a config of its own"),
        "{diag}"
    );
    assert!(diagnose(&d.path().join("absent"), &desired()).is_err());
}

mod lost_update {
    //! Another writer changing the file after our read: either before our
    //! last look (an out-of-date base) or in the instant between that look
    //! and the swap (a test hook).

    use super::*;
    use crate::inline::testing::{before_next_swap, replace_from};
    use std::cell::Cell;
    use std::io::Write;
    use std::rc::Rc;

    fn calico_with(mtu: u32) -> String {
        CALICO.replace("1440", &mtu.to_string())
    }

    fn healthy(text: &str) -> bool {
        plan::analyze(Kind::List, text.as_bytes(), &desired()).state == ChainState::Healthy
    }

    #[test]
    fn newer_content_seen_at_the_last_look_is_repaired() {
        let d = TempDir::new("lost1");
        let f = d.write("10-calico.conflist", &calico_with(9000));
        assert!(replace_from(&f, calico_with(1440).as_bytes(), &desired()).unwrap());
        let text = fs::read_to_string(&f).unwrap();
        assert!(text.contains("9000") && healthy(&text), "{text}");
        assert_eq!(d.names(), ["10-calico.conflist"]);
    }

    #[test]
    fn half_written_content_is_left_alone() {
        let d = TempDir::new("lost2");
        let half = &CALICO[..50];
        let f = d.write("10-calico.conflist", half);
        let ino = fs::metadata(&f).unwrap().ino();
        assert!(!replace_from(&f, CALICO.as_bytes(), &desired()).unwrap());
        assert_eq!(fs::read_to_string(&f).unwrap(), half);
        assert_eq!(fs::metadata(&f).unwrap().ino(), ino);
        assert_eq!(d.names(), ["10-calico.conflist"]);
    }

    #[test]
    fn a_rename_in_the_last_instant_is_put_back_then_repaired() {
        let d = TempDir::new("lost3");
        let f = d.write("10-calico.conflist", CALICO);
        let (dir, target) = (d.path().to_path_buf(), f.clone());
        before_next_swap(move || {
            let tmp = dir.join(".primary.tmp");
            fs::write(&tmp, calico_with(7777)).unwrap();
            fs::rename(&tmp, &target).unwrap();
        });
        assert!(replace_from(&f, CALICO.as_bytes(), &desired()).unwrap());
        let text = fs::read_to_string(&f).unwrap();
        assert!(text.contains("7777") && healthy(&text), "{text}");
        assert_eq!(d.names(), ["10-calico.conflist"]);
    }

    #[test]
    fn without_rename_exchange_newer_content_is_repaired_by_rename() {
        // A file system without RENAME_EXCHANGE: an ordinary rename, made
        // only while the target still holds what the repair started from.
        crate::write::order::NO_EXCHANGE.set(true);
        let d = TempDir::new("no-exchange");
        let f = d.write("10-calico.conflist", CALICO);
        let target = f.clone();
        before_next_swap(move || fs::write(&target, calico_with(7777)).unwrap());
        assert!(replace_from(&f, CALICO.as_bytes(), &desired()).unwrap());
        let text = fs::read_to_string(&f).unwrap();
        assert!(text.contains("7777") && healthy(&text), "{text}");
        assert_eq!(d.names(), ["10-calico.conflist"]);
        // And a repair with nobody in the way.
        let d = TempDir::new("no-exchange-plain");
        let f = d.write("10-calico.conflist", CALICO);
        let r = repair(d.path(), &desired(), &opts()).unwrap();
        crate::write::order::NO_EXCHANGE.set(false);
        assert_eq!(r.file.as_deref(), Some(f.as_path()));
        assert!(healthy(&fs::read_to_string(&f).unwrap()));
        assert_eq!(d.names(), ["10-calico.conflist"]);
    }

    #[test]
    fn a_write_in_progress_is_put_back_as_the_same_file() {
        let d = TempDir::new("lost4");
        let f = d.write("10-calico.conflist", CALICO);
        let ino = fs::metadata(&f).unwrap().ino();
        let target = f.clone();
        // The primary opens the file (truncating it) and is still writing
        // when the swap happens.
        let writer = std::rc::Rc::new(std::cell::RefCell::new(None));
        let w = writer.clone();
        before_next_swap(move || {
            let mut file = fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&target)
                .unwrap();
            file.write_all(&calico_with(5555).as_bytes()[..60]).unwrap();
            *w.borrow_mut() = Some(file);
        });
        assert!(!replace_from(&f, CALICO.as_bytes(), &desired()).unwrap());
        // Its inode is back in place: the rest of its write lands in the
        // live file.
        assert_eq!(fs::metadata(&f).unwrap().ino(), ino);
        let mut file = writer.borrow_mut().take().unwrap();
        file.write_all(&calico_with(5555).as_bytes()[60..]).unwrap();
        drop(file);
        assert_eq!(fs::read_to_string(&f).unwrap(), calico_with(5555));
        assert_eq!(d.names(), ["10-calico.conflist"]);
    }

    /// A primary that writes again right before every swap of ours; `last`
    /// is the MTU it wrote last.
    fn writes_before_every_swap(target: std::path::PathBuf, last: Rc<Cell<u32>>) {
        before_next_swap(move || {
            last.set(last.get() + 1);
            fs::write(&target, calico_with(last.get())).unwrap();
            writes_before_every_swap(target.clone(), last.clone());
        });
    }

    #[test]
    fn a_writer_faster_than_the_repair_keeps_its_newest_content() {
        let d = TempDir::new("contended");
        let f = d.write("10-calico.conflist", CALICO);
        let last = Rc::new(Cell::new(2000));
        writes_before_every_swap(f.clone(), last.clone());
        // Once right after an exchange too: the put-backs then fall out of
        // step with our swaps, so the repair runs out of swaps holding
        // someone's content, which goes back in place once more.
        let target = f.clone();
        inline::testing::after_next_exchange(move || {
            fs::write(&target, calico_with(1000)).unwrap();
        });
        let r = replace_from(&f, CALICO.as_bytes(), &desired());
        before_next_swap(|| {});
        assert!(matches!(r, Err(ChainError::Contended { .. })), "{r:?}");
        // Their newest content, whole, and nothing of ours left.
        assert_eq!(fs::read_to_string(&f).unwrap(), calico_with(last.get()));
        assert_eq!(d.names(), ["10-calico.conflist"]);
    }

    #[test]
    fn a_healthy_write_in_the_last_instant_is_kept() {
        let d = TempDir::new("lost5");
        let f = d.write("10-calico.conflist", CALICO);
        let theirs = String::from_utf8(
            plan::repaired(Kind::List, calico_with(1).as_bytes(), &desired()).unwrap(),
        )
        .unwrap();
        let (dir, target, t) = (d.path().to_path_buf(), f.clone(), theirs.clone());
        before_next_swap(move || {
            let tmp = dir.join(".primary.tmp");
            fs::write(&tmp, &t).unwrap();
            fs::rename(&tmp, &target).unwrap();
        });
        assert!(!replace_from(&f, CALICO.as_bytes(), &desired()).unwrap());
        assert_eq!(fs::read_to_string(&f).unwrap(), theirs);
        assert_eq!(d.names(), ["10-calico.conflist"]);
    }
}

mod props {
    //! Properties of the repair on generated conflists of every layout.

    use super::*;
    use crate::text::{self, Style};
    use proptest::prelude::*;

    fn number() -> impl Strategy<Value = Value> {
        // Number texts serde_json keeps as written (arbitrary_precision).
        prop_oneof![
            any::<i64>().prop_map(|i| i.to_string()),
            prop::sample::select(vec![
                "123456789012345678901234567890",
                "1.50",
                "-0.0",
                "1e3",
                "2.5E-7",
            ])
            .prop_map(String::from),
        ]
        .prop_map(|t| serde_json::from_str::<Value>(&t).unwrap())
    }

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            number(),
            "[a-z\"\\\\\\]\\[{},:é\u{1F600} ]{0,8}".prop_map(Value::String),
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        leaf().prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::vec(("[a-zA-Z_\"-]{1,6}", inner), 0..4)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    fn primary() -> impl Strategy<Value = Value> {
        (
            prop::sample::select(vec![
                "calico",
                "portmap",
                "bandwidth",
                "cilium-cni",
                "tuning",
            ]),
            proptest::collection::vec(("[a-z]{1,6}", value()), 0..4),
        )
            .prop_map(|(t, kv)| {
                let mut m = serde_json::Map::new();
                m.insert("type".into(), t.into());
                for (k, v) in kv {
                    if k != "type" {
                        m.insert(k, v);
                    }
                }
                Value::Object(m)
            })
    }

    /// A linkerd entry: the desired one (maybe without its name), or stale.
    fn linkerd() -> impl Strategy<Value = Value> {
        (0..3u8).prop_map(|k| {
            let mut e = desired().into_map();
            match k {
                0 => {}
                1 => {
                    e.shift_remove("name");
                }
                _ => {
                    e.insert("log_level".into(), "debug".into());
                }
            }
            Value::Object(e)
        })
    }

    fn layout() -> impl Strategy<Value = (&'static str, &'static str)> {
        // (a sample of the layout, trailing text)
        (
            prop::sample::select(vec![
                "{\"a\":1}",
                "{\"a\": 1, \"b\": 2}",
                "{\n  \"a\": 1\n}",
                "{\n    \"a\":1\n}",
                "{\n\t\"a\": 1\n}",
                "{\r\n  \"a\": 1\r\n}",
            ]),
            prop::sample::select(vec!["", "\n", "\n\n", "  \n"]),
        )
    }

    fn conflist() -> impl Strategy<Value = (String, Vec<bool>)> {
        (
            proptest::collection::vec(primary(), 1..4),
            proptest::collection::vec((linkerd(), 0..5usize), 0..3),
            proptest::collection::vec(("x-[a-z]{1,4}", value()), 0..2),
            layout(),
        )
            .prop_map(|(primaries, ours, extra, (sample, trailing))| {
                let mut plugins = primaries;
                for (e, at) in ours {
                    let at = at.min(plugins.len());
                    plugins.insert(at, e);
                }
                let flags = plugins.iter().map(is_ours).collect();
                let mut top = serde_json::Map::new();
                top.insert("cniVersion".into(), "0.3.1".into());
                top.insert("name".into(), "k8s-pod-network".into());
                for (k, v) in extra.clone() {
                    top.insert(k, v);
                }
                top.insert("plugins".into(), Value::Array(plugins));
                top.insert("x-after".into(), Value::from(1));
                let style = Style::detect(sample);
                let mut s = style.value(&Value::Object(top), "");
                s.push_str(trailing);
                (s, flags)
            })
    }

    fn top(text: &[u8]) -> serde_json::Map<String, Value> {
        match serde_json::from_slice(text).unwrap() {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        #[test]
        fn repair_is_exact_and_idempotent((input, flags) in conflist()) {
            let want = desired();
            let fallbacks = plan::FALLBACKS.with(|n| n.get());
            let state = plan::analyze(Kind::List, input.as_bytes(), &want).state;
            let out = plan::repaired(Kind::List, input.as_bytes(), &want);
            let Some(out) = out else {
                prop_assert_eq!(state, ChainState::Healthy);
                return Ok(());
            };
            prop_assert!(state.is_repairable());
            let outs = String::from_utf8(out.clone()).unwrap();
            // Exactly one linkerd entry, last, the desired one.
            let t = top(&out);
            let list = t["plugins"].as_array().unwrap().clone();
            let ours: Vec<usize> = (0..list.len()).filter(|&i| is_ours(&list[i])).collect();
            prop_assert_eq!(ours, vec![list.len() - 1]);
            prop_assert!(differing_keys(list.last().unwrap().as_object().unwrap(), &want).is_empty());
            // Every other plugin and member as before, in order.
            let before = top(input.as_bytes());
            let kept: Vec<&Value> = list.iter().filter(|p| !is_ours(p)).collect();
            let orig: Vec<&Value> = before["plugins"].as_array().unwrap().iter().filter(|p| !is_ours(p)).collect();
            prop_assert_eq!(kept.len(), orig.len());
            prop_assert_eq!(flags.iter().filter(|f| !**f).count(), orig.len());
            for (a, b) in kept.iter().zip(&orig) {
                prop_assert_eq!(a.to_string(), b.to_string());
            }
            let keys = |m: &serde_json::Map<String, Value>| m.keys().cloned().collect::<Vec<_>>();
            prop_assert_eq!(keys(&t), keys(&before));
            for (k, v) in &before {
                if k != "plugins" {
                    prop_assert_eq!(t[k].to_string(), v.to_string());
                }
            }
            // Byte-identical outside the plugins array.
            let a = text::find_plugins(&input).unwrap();
            let b = text::find_plugins(&outs).unwrap();
            prop_assert_eq!(&input[..a.open], &outs[..b.open]);
            prop_assert_eq!(&input[a.close..], &outs[b.close..]);
            // Idempotent.
            prop_assert_eq!(plan::analyze(Kind::List, &out, &want).state, ChainState::Healthy);
            prop_assert!(plan::repaired(Kind::List, &out, &want).is_none());
            // Uninstall gives back the input when it held no entry of ours.
            let back = plan::without_entries(&out).unwrap();
            if !flags.contains(&true) {
                prop_assert_eq!(String::from_utf8(back).unwrap(), input);
            }
            // All of it by editing the text, never by re-serializing.
            prop_assert_eq!(plan::FALLBACKS.with(|n| n.get()), fallbacks);
        }

        #[test]
        fn single_plugin_files_convert_exactly(
            p in primary(),
            (sample, trailing) in layout(),
        ) {
            let mut m = p.as_object().unwrap().clone();
            m.insert("name".into(), "net".into());
            m.insert("cniVersion".into(), "1.0.0".into());
            let mut input = Style::detect(sample).value(&Value::Object(m.clone()), "");
            input.push_str(trailing);
            let want = desired();
            let fallbacks = plan::FALLBACKS.with(|n| n.get());
            let out = plan::repaired(Kind::Single, input.as_bytes(), &want).unwrap();
            prop_assert_eq!(plan::FALLBACKS.with(|n| n.get()), fallbacks);
            let t = top(&out);
            prop_assert_eq!(t.keys().collect::<Vec<_>>(), vec!["name", "cniVersion", "plugins"]);
            prop_assert_eq!(&t["name"], &m["name"]);
            prop_assert_eq!(&t["cniVersion"], &m["cniVersion"]);
            let list = t["plugins"].as_array().unwrap();
            prop_assert_eq!(list.len(), 2);
            prop_assert_eq!(list[0].to_string(), Value::Object(m).to_string());
            prop_assert_eq!(plan::analyze(Kind::List, &out, &want).state, ChainState::Healthy);
            let end = format!("}}{trailing}");
            prop_assert!(String::from_utf8(out).unwrap().ends_with(&end));
        }

        /// Whatever bytes the active file holds: a state, never a panic.
        #[test]
        fn any_bytes_analyze(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            for kind in [Kind::List, Kind::Single] {
                let _ = plan::analyze(kind, &bytes, &desired());
                let _ = plan::repaired(kind, &bytes, &desired());
                let _ = plan::without_entries(&bytes);
                if let Ok(s) = std::str::from_utf8(&bytes) {
                    let _ = text::find_plugins(s);
                }
            }
        }
    }
}

#[test]
fn a_path_outside_any_dir_is_fine() {
    assert_eq!(write::parent(Path::new("x")), Path::new("."));
}

#[test]
fn repair_waits_for_its_required_file() {
    // The plugin requires its kubeconfig: gone during uninstall, so an ADD in
    // flight cannot chain the node again.
    let d = TempDir::new("requires");
    let f = d.write("10-calico.conflist", CALICO);
    let kubeconfig = d.path().join("ZZZ-linkerd-cni-kubeconfig");
    let o = RepairOptions {
        requires: Some(kubeconfig.clone()),
        ..RepairOptions::default()
    };
    let r = repair(d.path(), &desired(), &o).unwrap();
    assert_eq!(r.file, None, "{r:?}");
    assert_eq!(r.before, ChainState::Missing);
    assert_eq!(r.withheld.as_deref(), Some(kubeconfig.as_path()), "{r:?}");
    assert_eq!(fs::read_to_string(&f).unwrap(), CALICO);

    fs::write(&kubeconfig, "apiVersion: v1\n").unwrap();
    let r = repair(d.path(), &desired(), &o).unwrap();
    assert!(r.file.is_some(), "{r:?}");
    assert!(diagnose(d.path(), &desired()).unwrap().is_healthy());
}

/// The primary's newer content in the kill tests: recognisable.
const CALICO_NEWER: &str = r#"{
  "name": "k8s-pod-network",
  "cniVersion": "0.3.1",
  "plugins": [{"type": "calico", "mtu": 9000, "ipam": {"type": "calico-ipam"}}]
}
"#;

/// And the one after.
const CALICO_NEWEST: &str = r#"{
  "name": "k8s-pod-network",
  "cniVersion": "0.3.1",
  "plugins": [{"type": "calico", "mtu": 8000, "ipam": {"type": "calico-ipam"}}]
}
"#;

/// Names the scenario a child process of the kill tests runs, and its dir.
const KILL_CHILD_ENV: &str = "LCNI_CHAIN_TEST_KILL_CHILD";

/// Writes `text` to `path` as a primary does: a whole new file renamed in.
fn primary_writes(path: &Path, text: &str) {
    let tmp = write::parent(path).join("primary-writing");
    fs::write(&tmp, text).expect("write");
    fs::rename(&tmp, path).expect("rename");
}

/// kill -9 of this very process, at this very point.
fn kill_myself() -> ! {
    let pid = std::process::id().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &pid])
        .status();
    loop {
        std::thread::park();
    }
}

/// Not a test of its own: the child process of the kill tests (a no-op
/// unless they started it). The primary writes in the instant before our
/// exchange, and the process dies right after an exchange.
#[test]
fn kill_child() {
    let Ok(spec) = std::env::var(KILL_CHILD_ENV) else {
        return;
    };
    let (scenario, dir) = spec.split_once(':').expect("scenario:dir");
    let dir = Path::new(dir).to_path_buf();
    let file = dir.join("10-calico.conflist");
    let f = file.clone();
    inline::testing::before_next_swap(move || primary_writes(&f, CALICO_NEWER));
    match scenario {
        // Killed right after the exchange that displaced the primary's write.
        "exchange" => inline::testing::after_next_exchange(|| kill_myself()),
        // The primary writes once more after our exchange; we put its first
        // write back (displacing the second) and are killed right then.
        "restore" => {
            let f = file.clone();
            inline::testing::after_next_exchange(move || primary_writes(&f, CALICO_NEWEST));
            inline::testing::after_next_exchange(|| kill_myself());
        }
        other => panic!("unknown scenario {other}"),
    }
    let r = repair(&dir, &desired(), &opts());
    panic!("the repair was to be killed, it ended: {r:?}");
}

/// Runs `scenario` of [`kill_child`] on a conf dir holding CALICO, and
/// returns the dir after the kill.
fn killed_in(scenario: &str) -> TempDir {
    let d = TempDir::new(&format!("kill-{scenario}"));
    d.write("10-calico.conflist", CALICO);
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "tests::kill_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(KILL_CHILD_ENV, format!("{scenario}:{}", d.path().display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(9),
        "the child was not killed: {status}"
    );
    d
}

/// The one file left, with the entry, last.
fn only_config_is(d: &TempDir, name: &str) -> String {
    assert_eq!(d.names(), [name]);
    assert!(diagnose(d.path(), &desired()).unwrap().is_healthy());
    d.read(name)
}

fn only_config_is_healthy(d: &TempDir) -> String {
    only_config_is(d, "10-calico.conflist")
}

#[test]
fn a_kill_right_after_the_exchange_loses_no_primary_write() {
    let d = killed_in("exchange");
    // The primary's write is parked under a temp name; in place is what we
    // computed from the older content.
    let text = d.read("10-calico.conflist");
    assert!(text.contains("portmap") && !text.contains("9000"), "{text}");
    let parked: Vec<_> = d
        .names()
        .into_iter()
        .filter(|n| n.starts_with(TEMP_PREFIX))
        .collect();
    assert_eq!(parked.len(), 1, "{parked:?}");
    assert_eq!(d.read(&parked[0]), CALICO_NEWER);
    let r = repair(d.path(), &desired(), &opts()).unwrap();
    assert!(r.file.is_some(), "{r:?}");
    assert!(recovered(&r).contains("put back"), "{r:?}");
    // The primary's write, with our entry: nothing lost.
    let text = only_config_is_healthy(&d);
    assert!(text.contains("9000") && !text.contains("portmap"), "{text}");
}

#[test]
fn a_kill_while_putting_a_displaced_write_back_loses_no_newer_write() {
    let d = killed_in("restore");
    // In place: the primary's first write, put back; parked: its second.
    let text = d.read("10-calico.conflist");
    assert_eq!(text, CALICO_NEWER);
    let parked: Vec<_> = d
        .names()
        .into_iter()
        .filter(|n| n.starts_with(TEMP_PREFIX))
        .collect();
    assert_eq!(parked.len(), 1, "{parked:?}");
    assert_eq!(d.read(&parked[0]), CALICO_NEWEST);
    repair(d.path(), &desired(), &opts()).unwrap();
    let text = only_config_is_healthy(&d);
    assert!(text.contains("8000"), "{text}");
}

#[test]
fn a_conversion_killed_after_retiring_a_rewritten_conf_puts_it_back() {
    // What a kill leaves when the primary rewrote its .conf just before the
    // conversion retired it: the list built from the older content in
    // place, the newer .conf under a temp name.
    let d = TempDir::new("grave");
    let old = r#"{"name":"br","cniVersion":"0.4.0","type":"bridge","mtu":1500}"#;
    let newer = r#"{"name":"br","cniVersion":"0.4.0","type":"bridge","mtu":9000}"#;
    let list = plan::repaired(Kind::Single, old.as_bytes(), &desired()).unwrap();
    let dst = d.path().join("10-bridge.conflist");
    fs::write(&dst, &list).unwrap();
    let grave = write::Intent::Grave {
        json: false,
        list: write::name_digest(&dst),
        base: write::digest(old.as_bytes()),
        content: write::digest(&list),
    }
    .path_in(d.path());
    fs::write(&grave, newer).unwrap();
    let r = repair(d.path(), &desired(), &opts()).unwrap();
    assert!(recovered(&r).contains("put back"), "{r:?}");
    let text = only_config_is(&d, "10-bridge.conflist");
    assert!(text.contains("9000"), "{text}");

    // Killed after retiring the very content it converted: just removed.
    let d = TempDir::new("grave-same");
    fs::write(d.path().join("10-bridge.conflist"), &list).unwrap();
    let grave = write::Intent::Grave {
        json: false,
        list: write::name_digest(&dst),
        base: write::digest(old.as_bytes()),
        content: write::digest(&list),
    }
    .path_in(d.path());
    fs::write(&grave, old).unwrap();
    repair(d.path(), &desired(), &opts()).unwrap();
    let text = only_config_is(&d, "10-bridge.conflist");
    assert!(text.contains("1500"), "{text}");
}

#[test]
fn displaced_content_rewritten_since_and_our_own_temp_files_are_removed() {
    let d = TempDir::new("superseded");
    let f = d.write("10-calico.conflist", CALICO_NEWEST);
    let target = write::name_digest(&f);
    // Displaced by an exchange that put in content the primary has
    // replaced since: the primary's newest write wins, the parked one goes.
    let parked = write::Intent::Swap {
        back: false,
        target,
        expected: write::digest(CALICO.as_bytes()),
        put: Some(write::digest(b"what we put in")),
    }
    .path_in(d.path());
    fs::write(&parked, CALICO_NEWER).unwrap();
    // Our new content, never exchanged.
    let ours = write::Intent::Swap {
        back: false,
        target,
        expected: write::digest(CALICO_NEWEST.as_bytes()),
        put: Some(write::digest(b"ours")),
    }
    .path_in(d.path());
    fs::write(&ours, "ours").unwrap();
    // And a plain temp file.
    fs::write(write::temp_path(d.path(), None), "half").unwrap();
    let r = repair(d.path(), &desired(), &opts()).unwrap();
    assert!(recovered(&r).contains("removed 3 leftover"), "{r:?}");
    let text = only_config_is(&d, "10-calico.conflist");
    assert!(text.contains("8000"), "{text}");
}

#[test]
fn the_repair_is_in_place_before_the_disk_is_waited_for() {
    let d = TempDir::new("order");
    d.write("10-calico.conflist", CALICO);
    write::order::take();
    let r = repair(d.path(), &desired(), &opts()).unwrap();
    assert!(r.file.is_some(), "{r:?}");
    // The runtime sees the repair at the exchange; our content reaches the
    // disk before the primary's version it displaced is removed.
    assert_eq!(
        write::order::take(),
        ["exchange", "fsync file", "remove displaced", "fsync dir"]
    );
    only_config_is_healthy(&d);
}

/// What a crash right after our exchange leaves when our content had not
/// reached the disk: `lost` in place, the primary's version it displaced
/// parked under the swap's intent.
fn crashed_with_the_repair_lost(tag: &str, lost: &[u8]) -> TempDir {
    let d = TempDir::new(tag);
    let f = d.path().join("10-calico.conflist");
    let repaired = plan::repaired(Kind::List, CALICO.as_bytes(), &desired()).unwrap();
    fs::write(&f, lost).unwrap();
    let parked = write::Intent::Swap {
        back: false,
        target: write::name_digest(&f),
        expected: write::digest(CALICO.as_bytes()),
        put: Some(write::digest(&repaired)),
    }
    .path_in(d.path());
    fs::write(&parked, CALICO).unwrap();
    d
}

#[test]
fn a_crash_that_lost_the_repair_puts_the_primarys_version_back() {
    // Nothing (delayed allocation), or zeros of the size (a size on disk
    // without its data).
    for (tag, lost) in [("lost-empty", vec![]), ("lost-zeros", vec![0u8; 1269])] {
        let d = crashed_with_the_repair_lost(tag, &lost);
        let r = repair(d.path(), &desired(), &opts()).unwrap();
        assert!(
            recovered(&r).contains("a crash lost the repair"),
            "{tag}: {r:?}"
        );
        let text = only_config_is_healthy(&d);
        // The primary's config, whole, with our entry.
        assert_eq!(
            text.as_bytes(),
            plan::repaired(Kind::List, CALICO.as_bytes(), &desired()).unwrap(),
            "{tag}"
        );
    }
    // A config the primary wrote since is its newest: the parked version goes.
    let d = crashed_with_the_repair_lost("lost-rewritten", b"");
    d.write("10-calico.conflist", CALICO_NEWEST);
    repair(d.path(), &desired(), &opts()).unwrap();
    let text = only_config_is_healthy(&d);
    assert!(text.contains("8000"), "{text}");
}

/// Options with symlinks resolved under `host_root`.
fn under(host_root: &Path) -> RepairOptions {
    RepairOptions {
        host_root: host_root.to_path_buf(),
        ..RepairOptions::default()
    }
}

/// Names in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != crate::LOCK_FILE)
        .collect();
    v.sort();
    v
}

#[test]
fn symlinks_leading_inside_the_conf_dir_are_written_through() {
    for (tag, how) in [("rel", 0), ("abs", 1), ("dotdot", 2)] {
        let d = TempDir::new(&format!("link-in-{tag}"));
        fs::create_dir(d.path().join("real")).unwrap();
        let target = d.path().join("real/calico.conflist");
        fs::write(&target, CALICO).unwrap();
        let conf_name = d.path().file_name().unwrap().to_str().unwrap();
        let to = match how {
            0 => "real/calico.conflist".to_string(),
            1 => target.display().to_string(),
            // Out and back in: still inside.
            _ => format!("../{conf_name}/real/calico.conflist"),
        };
        let link = d.path().join("10-calico.conflist");
        symlink(&to, &link).unwrap();
        let diag = diagnose(d.path(), &desired()).unwrap();
        assert_eq!(
            (&diag.state, &diag.refused),
            (&ChainState::Missing, &None),
            "{tag}"
        );
        let r = repair(d.path(), &desired(), &opts()).unwrap();
        assert_eq!(r.file.as_deref(), Some(link.as_path()), "{tag}: {r:?}");
        assert!(
            fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert!(fs::read_to_string(&target).unwrap().contains("linkerd-cni"));
        assert!(
            diagnose(d.path(), &desired()).unwrap().is_healthy(),
            "{tag}"
        );
        assert_eq!(names_in(&d.path().join("real")), ["calico.conflist"]);
    }
}

#[test]
fn a_symlink_leading_outside_the_conf_dir_is_refused_unless_allowed() {
    let d = TempDir::new("link-out");
    let elsewhere = TempDir::new("link-out-target");
    let target = elsewhere.write("calico.conflist", CALICO);
    symlink(&target, d.path().join("10-calico.conflist")).unwrap();
    // Also through a relative link that climbs out.
    let d2 = TempDir::new("link-out-rel");
    let rel = format!(
        "../{}/calico.conflist",
        elsewhere.path().file_name().unwrap().to_str().unwrap()
    );
    symlink(&rel, d2.path().join("10-calico.conflist")).unwrap();
    for d in [&d, &d2] {
        let diag = diagnose(d.path(), &desired()).unwrap();
        assert_eq!(diag.state, ChainState::Missing);
        let why = diag.refused.clone().expect("refused");
        assert!(
            why.contains("outside the conf dir")
                && why.contains(&target.display().to_string())
                && why.contains("chain_write_outside_conf_dir")
                && why.contains("LINKERD_CNI_CHAIN_WRITE_OUTSIDE_CONF_DIR"),
            "{why}"
        );
        assert!(!diag.needs_repair() && !diag.is_healthy());
        let shown = diag.to_string();
        assert!(
            shown.contains("refused:") && shown.contains("outside the conf dir"),
            "{shown}"
        );
        let e = repair(d.path(), &desired(), &opts()).unwrap_err();
        assert!(matches!(e, ChainError::Refused { .. }), "{e}");
        assert!(e.to_string().contains("outside the conf dir"), "{e}");
        // Nothing written there, not even a temp file.
        assert_eq!(fs::read_to_string(&target).unwrap(), CALICO);
        assert_eq!(elsewhere.names(), ["calico.conflist"]);
    }
    // Allowed explicitly: written through, and nothing left there.
    let allow = RepairOptions {
        write_outside_conf_dir: true,
        ..RepairOptions::default()
    };
    assert_eq!(
        diagnose_with(d.path(), &desired(), &allow).unwrap().refused,
        None
    );
    assert!(repair(d.path(), &desired(), &allow).unwrap().file.is_some());
    assert!(fs::read_to_string(&target).unwrap().contains("linkerd-cni"));
    assert_eq!(elsewhere.names(), ["calico.conflist"]);
    // Uninstall leaves what it may not write.
    let removed = remove_entries(d.path(), &opts()).unwrap();
    assert!(removed.is_empty(), "{removed:?}");
    assert!(fs::read_to_string(&target).unwrap().contains("linkerd-cni"));
    assert_eq!(remove_entries(d.path(), &allow).unwrap().len(), 1);
    assert_eq!(fs::read_to_string(&target).unwrap(), CALICO);
}

#[test]
fn absolute_symlink_targets_resolve_under_the_host_root() {
    // The installer's view: the host's / mounted at <host>.
    let host = TempDir::new("hostroot");
    let conf = host.path().join("etc/cni/net.d");
    fs::create_dir_all(conf.join("real")).unwrap();
    let target = conf.join("real/calico.conflist");
    fs::write(&target, CALICO).unwrap();
    fs::create_dir_all(host.path().join("opt")).unwrap();
    let outside = host.path().join("opt/calico.conflist");
    fs::write(&outside, CALICO).unwrap();
    // As the host sees them.
    symlink(
        "/etc/cni/net.d/real/calico.conflist",
        conf.join("10-calico.conflist"),
    )
    .unwrap();
    symlink("/opt/calico.conflist", conf.join("20-calico.conflist")).unwrap();
    // `..` stops at the host's root, as on the host.
    symlink(
        "../../../../../../../etc/cni/net.d/real/calico.conflist",
        conf.join("30-calico.conflist"),
    )
    .unwrap();
    // Under the container's root the absolute target is not there.
    let wrong = diagnose(&conf, &desired()).unwrap();
    assert!(matches!(wrong.state, ChainState::Invalid { .. }), "{wrong}");

    let o = under(host.path());
    let diag = diagnose_with(&conf, &desired(), &o).unwrap();
    assert_eq!(
        (&diag.state, &diag.refused),
        (&ChainState::Missing, &None),
        "{diag}"
    );
    assert!(repair(&conf, &desired(), &o).unwrap().file.is_some());
    assert!(fs::read_to_string(&target).unwrap().contains("linkerd-cni"));
    let diag = diagnose_with(&conf, &desired(), &o).unwrap();
    assert!(diag.is_healthy(), "{diag}");
    // The other two: one outside the conf dir (as the host resolves it),
    // one inside, and already repaired through the first.
    let listing = crate::owned::list(&conf, &o).unwrap();
    let refused: Vec<_> = listing
        .links
        .iter()
        .filter(|l| l.refused.is_some())
        .map(|l| l.path.clone())
        .collect();
    assert_eq!(refused, [conf.join("20-calico.conflist")]);
    assert_eq!(
        listing.real(&conf.join("30-calico.conflist")).unwrap(),
        target
    );
    assert_eq!(fs::read_to_string(&outside).unwrap(), CALICO);
}

#[test]
fn leftovers_where_symlinks_lead_are_cleaned() {
    let d = TempDir::new("link-leftovers");
    fs::create_dir(d.path().join("real")).unwrap();
    fs::write(d.path().join("real/calico.conflist"), CALICO).unwrap();
    symlink("real/calico.conflist", d.path().join("10-calico.conflist")).unwrap();
    let inside = write::temp_path(&d.path().join("real"), None);
    fs::write(&inside, "half").unwrap();
    // Left outside by an older version that wrote there: ours by name.
    let elsewhere = TempDir::new("link-leftovers-out");
    elsewhere.write("other.conflist", CALICO);
    symlink(
        elsewhere.path().join("other.conflist"),
        d.path().join("20-other.conflist"),
    )
    .unwrap();
    let outside = write::temp_path(elsewhere.path(), None);
    fs::write(&outside, "half").unwrap();
    let diag = diagnose(d.path(), &desired()).unwrap();
    let mut want = vec![inside.clone(), outside.clone()];
    want.sort();
    assert_eq!(diag.leftovers, want);
    assert!(diag.needs_repair());
    let r = repair(d.path(), &desired(), &opts()).unwrap();
    assert!(recovered(&r).contains("removed 2 leftover"), "{r:?}");
    assert_eq!(names_in(&d.path().join("real")), ["calico.conflist"]);
    assert_eq!(elsewhere.names(), ["other.conflist"]);
    assert!(diagnose(d.path(), &desired()).unwrap().is_healthy());
}

#[test]
fn a_symlink_loop_is_reported_not_followed_forever() {
    let d = TempDir::new("link-loop");
    symlink("b.json", d.path().join("a.conflist")).unwrap();
    symlink("a.conflist", d.path().join("b.json")).unwrap();
    let diag = diagnose(d.path(), &desired()).unwrap();
    let ChainState::Invalid { reason } = &diag.state else {
        panic!("{diag}");
    };
    assert!(reason.contains("symlinks to follow"), "{reason}");
    assert!(!diag.needs_repair());
}
