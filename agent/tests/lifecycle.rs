//! Start-up, shutdown, uninstall, the readiness check and configuration
//! errors, with the real installer binary on a temp "node".

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use nix::sys::signal::Signal;

use common::*;
use testkit::names::file_names;

const RESYNC: Duration = Duration::from_secs(1);
const FAST: &[(&str, &str)] = &[("LINKERD_CNI_RESYNC_SECONDS", "1")];

/// SIGTERM: exit 0 within a second, with everything left in place, so an
/// upgrade or a restart does not unchain pods.
#[test]
fn sigterm_keeps_the_chain_and_exits_zero() {
    for watch in ["true", "false"] {
        let node = Node::new(&format!("sigterm-{watch}"));
        node.write_by_rename("10-calico.conflist", &calico_text(0));
        let mut inst = node.start(&[
            ("LINKERD_CNI_RESYNC_SECONDS", "30"),
            ("LINKERD_CNI_WATCH", watch),
        ]);
        node.wait_healthy(RESYNC + GRACE).unwrap();
        let before = fs::read(node.conf("10-calico.conflist")).unwrap();

        let t = Instant::now();
        inst.signal(Signal::SIGTERM);
        let status = inst
            .wait_exit(Duration::from_secs(1))
            .unwrap_or_else(|| panic!("still running 1 s after SIGTERM\n{}", inst.log()));
        eprintln!("watch {watch}: exited {:?} after SIGTERM", t.elapsed());
        assert!(status.success(), "{status:?}\n{}", inst.log());
        assert_eq!(fs::read(node.conf("10-calico.conflist")).unwrap(), before);
        node.healthy().unwrap();
        for f in [KUBECONFIG_NAME, ENTRY_FILE] {
            assert!(node.conf(f).exists(), "{f} removed");
        }
        assert!(node.bin_dir.join("linkerd-cni").exists());
    }
}

/// `uninstall`: the entry leaves every conflist first (each back to its
/// original bytes), then the kubeconfig and the persisted entry, then the
/// binary. The order is observed from outside, with inotify.
#[test]
fn uninstall_order_and_byte_identical_conflists() {
    let node = Node::new("uninstall");
    let calico = calico_text(0);
    node.write_by_rename("10-calico.conflist", &calico);
    let mut inst = node.start(FAST);
    node.wait_healthy(RESYNC + GRACE).unwrap();
    inst.signal(Signal::SIGTERM);
    assert!(inst.wait_exit(Duration::from_secs(2)).unwrap().success());
    // A stray entry in a non-active file (left by an older installer).
    let mut stray = common::calico(5);
    stray["plugins"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"type": "linkerd-cni", "name": "old"}));
    node.write_by_rename(
        "20-old.conflist",
        &(serde_json::to_string_pretty(&stray).unwrap() + "\n"),
    );

    let watch = Inotify::init(InitFlags::IN_NONBLOCK).unwrap();
    let conf_wd = watch
        .add_watch(
            &node.conf_dir,
            AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_DELETE | AddWatchFlags::IN_CLOSE_WRITE,
        )
        .unwrap();
    let bin_wd = watch
        .add_watch(&node.bin_dir, AddWatchFlags::IN_DELETE)
        .unwrap();

    let out = node.run(&["uninstall"], &[]);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");

    let mut order = vec![];
    while let Ok(events) = watch.read_events() {
        if events.is_empty() {
            break;
        }
        for e in events {
            let name = e
                .name
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let dir = if e.wd == conf_wd {
                "conf"
            } else if e.wd == bin_wd {
                "bin"
            } else {
                continue;
            };
            order.push(format!("{dir}/{name}"));
        }
    }
    let pos = |n: &str| {
        order
            .iter()
            .position(|e| e == n)
            .unwrap_or_else(|| panic!("{n} not touched: {order:?}"))
    };
    let calico_done = pos("conf/10-calico.conflist");
    let stray_done = pos("conf/20-old.conflist");
    let kubeconfig_gone = pos(&format!("conf/{KUBECONFIG_NAME}"));
    let entry_gone = pos(&format!("conf/{ENTRY_FILE}"));
    let binary_gone = pos("bin/linkerd-cni");
    assert!(
        calico_done.max(stray_done) < kubeconfig_gone.min(entry_gone),
        "{order:?}"
    );
    assert!(kubeconfig_gone.max(entry_gone) < binary_gone, "{order:?}");

    assert_eq!(
        fs::read_to_string(node.conf("10-calico.conflist")).unwrap(),
        calico
    );
    let stray_after: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(node.conf("20-old.conflist")).unwrap()).unwrap();
    assert_eq!(stray_after, common::calico(5));
    assert_eq!(
        file_names(&node.conf_dir),
        ["10-calico.conflist", "20-old.conflist"]
    );
    assert!(file_names(&node.bin_dir).is_empty());
    // Nor the lock file every repair took (which file_names leaves out).
    assert!(
        !node.conf_dir.join(testkit::names::LOCK_FILE).exists(),
        "the uninstall left the conf dir's lock file"
    );
    // Idempotent: a second uninstall finds nothing to do and succeeds.
    let again = node.run(&["uninstall"], &[]);
    assert!(again.status.success());
    assert_eq!(
        fs::read_to_string(node.conf("10-calico.conflist")).unwrap(),
        calico
    );
}

/// LINKERD_CNI_UNINSTALL_ON_EXIT=true: SIGTERM uninstalls, then exits 0.
/// The binary stays a while after the unchain: a pod start that loaded the
/// chain before it still runs linkerd-cni.
#[test]
fn uninstall_on_exit() {
    let node = Node::new("uninstall-on-exit");
    let calico = calico_text(0);
    node.write_by_rename("10-calico.conflist", &calico);
    let mut inst = node.start(&[
        ("LINKERD_CNI_RESYNC_SECONDS", "1"),
        ("LINKERD_CNI_UNINSTALL_ON_EXIT", "true"),
    ]);
    node.wait_healthy(RESYNC + GRACE).unwrap();
    inst.signal(Signal::SIGTERM);
    assert!(
        wait_until(GRACE, || file_names(&node.conf_dir)
            == ["10-calico.conflist"]),
        "not unchained: {:?}\n{}",
        file_names(&node.conf_dir),
        inst.log()
    );
    let unchained = Instant::now();
    assert_eq!(
        fs::read_to_string(node.conf("10-calico.conflist")).unwrap(),
        calico
    );
    assert_eq!(file_names(&node.bin_dir), ["linkerd-cni"], "{}", inst.log());
    let status = inst
        .wait_exit(UNINSTALL_DRAIN + Duration::from_secs(3))
        .unwrap();
    assert!(
        unchained.elapsed() >= UNINSTALL_DRAIN - Duration::from_secs(1),
        "the binary went {:?} after the unchain",
        unchained.elapsed()
    );
    assert!(status.success(), "{}", inst.log());
    assert_eq!(
        fs::read_to_string(node.conf("10-calico.conflist")).unwrap(),
        calico
    );
    assert_eq!(file_names(&node.conf_dir), ["10-calico.conflist"]);
    assert!(file_names(&node.bin_dir).is_empty());
}

/// `check` (the readiness probe): 0 when healthy; 1 with the reason for a
/// missing entry, a stale kubeconfig, a missing binary.
#[test]
fn check_exit_codes() {
    let node = Node::new("check");
    node.write_by_rename("10-calico.conflist", &calico_text(0));
    let check = || {
        let out = node.run(&["check"], &[]);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };

    // Nothing installed yet.
    let (code, why) = check();
    assert_eq!(code, Some(1), "{why}");
    assert!(why.contains("missing"), "{why}");

    let mut inst = node.start(FAST);
    node.wait_healthy(RESYNC + GRACE).unwrap();
    inst.signal(Signal::SIGTERM);
    assert!(inst.wait_exit(Duration::from_secs(2)).unwrap().success());
    let (code, why) = check();
    assert_eq!(code, Some(0), "{why}");
    let healthy_bytes = fs::read(node.conf("10-calico.conflist")).unwrap();

    // The primary rewrote its file without the entry.
    node.write_by_rename("10-calico.conflist", &calico_text(1));
    let (code, why) = check();
    assert_eq!(code, Some(1), "{why}");
    assert!(
        why.contains("10-calico.conflist") && why.contains("missing"),
        "{why}"
    );
    fs::write(node.conf("10-calico.conflist"), &healthy_bytes).unwrap();
    assert_eq!(check().0, Some(0));

    // The kubelet rotated the token while nobody rewrote the kubeconfig.
    node.rotate_service_account("token-2", "CA-1");
    let (code, why) = check();
    assert_eq!(code, Some(1), "{why}");
    assert!(why.contains("kubeconfig") && why.contains("token"), "{why}");
    node.rotate_service_account("token-1", "CA-1");
    assert_eq!(check().0, Some(0));

    // The binary is gone.
    fs::remove_file(node.bin_dir.join("linkerd-cni")).unwrap();
    let (code, why) = check();
    assert_eq!(code, Some(1), "{why}");
    assert!(why.contains("linkerd-cni is missing"), "{why}");
}

/// Bad configuration: exit non-zero at once, naming the variable.
#[test]
fn invalid_configuration_names_the_variable() {
    let node = Node::new("badconf");
    for (var, value) in [
        ("LINKERD_CNI_RESYNC_SECONDS", "soon"),
        ("LINKERD_CNI_WATCH", "maybe"),
        ("LINKERD_CNI_UNINSTALL_ON_EXIT", "yes"),
        ("KUBERNETES_SERVICE_PORT", "http"),
        ("KUBERNETES_SERVICE_HOST", ""),
        ("CNI_NETWORK_CONFIG", "[\"not an object\"]"),
        ("CNI_NETWORK_CONFIG_FILE", "/nonexistent/template.json"),
        ("DEST_CNI_NET_DIR", "relative/net.d"),
        ("SKIP_TLS_VERIFY", "sure"),
    ] {
        for args in [&[][..], &["check"], &["uninstall"]] {
            // Unset, it is none of uninstall's business (see
            // uninstall_and_status_need_only_what_they_use).
            if value.is_empty() && args == ["uninstall"] {
                continue;
            }
            let out = node.run(args, &[(var, value)]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{var}={value} {args:?}: {err}");
            assert!(err.contains(var), "{var}={value}: {err}");
        }
    }
    // Nothing was written anywhere.
    assert!(file_names(&node.conf_dir).is_empty());
    assert!(file_names(&node.bin_dir).is_empty());
    // No linkerd-cni in the image's bin dir.
    let empty = node.root.join("empty");
    fs::create_dir(&empty).unwrap();
    let out = node.run(&[], &[("CONTAINER_CNI_BIN_DIR", empty.to_str().unwrap())]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("CONTAINER_CNI_BIN_DIR"));
}

/// No primary config yet: say so once, write no config; chain the primary's
/// config as soon as it appears.
#[test]
fn no_primary_config_waits_and_writes_nothing() {
    let node = Node::new("noprimary");
    let inst = node.start(&[
        ("LINKERD_CNI_RESYNC_SECONDS", "0.2"),
        ("LINKERD_CNI_WATCH", "false"),
    ]);
    // The first pass has written what it writes before it says this.
    assert!(
        inst.wait_log("no primary CNI config", Duration::from_secs(30)),
        "{}",
        inst.log()
    );
    assert_eq!(file_names(&node.conf_dir), [ENTRY_FILE, KUBECONFIG_NAME]);
    // Several more passes (0.2 s apart) must not say it again: that takes
    // time, not an event.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(file_names(&node.conf_dir), [ENTRY_FILE, KUBECONFIG_NAME]);
    assert_eq!(
        inst.log().matches("no primary CNI config").count(),
        1,
        "{}",
        inst.log()
    );
    node.write_by_rename("10-calico.conflist", &calico_text(0));
    node.wait_healthy(Duration::from_millis(200) + GRACE)
        .unwrap();
}

/// Start-up installs the binary and the kubeconfig; a restart finds them
/// current and rewrites nothing; a changed or non-executable binary is
/// replaced (never in place: the inode changes).
#[test]
fn binaries_and_kubeconfig_are_written_only_when_needed() {
    let node = Node::new("idempotent");
    node.write_by_rename("10-calico.conflist", &calico_text(0));
    let bin = node.bin_dir.join("linkerd-cni");
    let mut inst = node.start(FAST);
    node.wait_healthy(RESYNC + GRACE).unwrap();
    inst.signal(Signal::SIGTERM);
    assert!(inst.wait_exit(Duration::from_secs(2)).unwrap().success());
    assert_eq!(
        fs::read(&bin).unwrap(),
        fs::read(node.image_bin.join("linkerd-cni")).unwrap()
    );
    assert_eq!(fs::metadata(&bin).unwrap().mode() & 0o777, 0o755);
    let kc = node.kubeconfig().unwrap();
    let doc: serde_json::Value = serde_json::from_str(&kc).unwrap();
    let cluster = &doc["clusters"][0]["cluster"];
    assert_eq!(
        cluster["server"],
        format!("https://127.0.0.1:{NO_API_PORT}"),
        "{kc}"
    );
    assert_eq!(cluster["certificate-authority-data"], "Q0EtMQ==", "{kc}");
    assert_eq!(doc["current-context"], "linkerd-cni-context", "{kc}");

    let inode = |p: &std::path::Path| fs::metadata(p).unwrap().ino();
    let files = [
        bin.clone(),
        node.conf(KUBECONFIG_NAME),
        node.conf(ENTRY_FILE),
        node.conf("10-calico.conflist"),
    ];
    let before: Vec<u64> = files.iter().map(|p| inode(p)).collect();
    let mut inst = node.start(FAST);
    assert!(
        inst.wait_log("is chained in", RESYNC + GRACE),
        "{}",
        inst.log()
    );
    let after: Vec<u64> = files.iter().map(|p| inode(p)).collect();
    assert_eq!(
        before,
        after,
        "a restart rewrote a current file\n{}",
        inst.log()
    );
    inst.signal(Signal::SIGTERM);
    assert!(inst.wait_exit(Duration::from_secs(2)).unwrap().success());

    // A different binary (an upgrade) and a non-executable one.
    fs::write(&bin, "old version").unwrap();
    let old = inode(&bin);
    let inst = node.start(FAST);
    assert!(wait_until(RESYNC + GRACE, || fs::read(&bin).unwrap()
        == fs::read(node.image_bin.join("linkerd-cni")).unwrap()));
    assert_ne!(inode(&bin), old);
    fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    assert!(wait_until(RESYNC + GRACE, || fs::metadata(&bin)
        .unwrap()
        .mode()
        & 0o777
        == 0o755));
    assert!(inst.wait_log("not executable", GRACE), "{}", inst.log());
}

/// Uninstall on a node whose conf dir is gone: no config can name the
/// plugin, so the binary goes too.
#[test]
fn uninstall_without_a_conf_dir() {
    let node = Node::new("uninstall-noconf");
    fs::copy(
        node.image_bin.join("linkerd-cni"),
        node.bin_dir.join("linkerd-cni"),
    )
    .unwrap();
    fs::remove_dir(&node.conf_dir).unwrap();
    let out = node.run(&["uninstall"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(file_names(&node.bin_dir).is_empty());
}

/// Temp files an interrupted write left (ours, recognised by name) go at
/// start: in the bin dir, and in the conf dir (under its lock) even before
/// any primary config exists, when no repair would remove them. Other
/// dotfiles stay.
#[test]
fn leftover_temp_files_are_removed_at_start() {
    let node = Node::new("leftovers");
    let bin_tmp = node.bin_dir.join(".linkerd-cni-tmp-1-2-3");
    let conf_tmp = node.conf(".linkerd-cni-tmp-4-5-6");
    let other = node.conf(".other-tmp");
    for p in [&bin_tmp, &conf_tmp, &other] {
        fs::write(p, "half").unwrap();
    }
    let inst = node.start(FAST);
    assert!(
        wait_until(RESYNC + GRACE, || !bin_tmp.exists() && !conf_tmp.exists()),
        "{}",
        inst.log()
    );
    assert!(other.exists());
    // The line follows the removal: wait for it too, not just look.
    assert!(
        inst.wait_log("a temp file left by an interrupted write", GRACE),
        "{}",
        inst.log()
    );
}

/// The heartbeat the plugin reads: in the plugin's state dir under the
/// mount prefix (the manifest's template names none: the default
/// /run/linkerd-cni), never in the conf dir; renewed every pass while the
/// kubeconfig is current, absent while it cannot be written, removed by an
/// uninstall.
#[test]
fn heartbeat_in_the_state_dir_while_the_kubeconfig_is_current() {
    use linkerd_cni_state::heartbeat::{self, Liveness};
    let node = Node::new("heartbeat");
    let state_dir = node.prefix.join("run/linkerd-cni");
    let beat = state_dir.join(heartbeat::HEARTBEAT_FILE);
    node.rotate_service_account("", "CA-1");
    node.write_by_rename("10-calico.conflist", &calico_text(0));
    let mut inst = node.start(&[
        ("LINKERD_CNI_RESYNC_SECONDS", "1"),
        ("LINKERD_CNI_UNINSTALL_ON_EXIT", "true"),
    ]);
    assert!(
        inst.wait_log("cannot write the kubeconfig", RESYNC + GRACE),
        "{}",
        inst.log()
    );
    // Two more passes without a kubeconfig: still no beat.
    std::thread::sleep(RESYNC * 2);
    assert!(!beat.exists(), "a beat without a current kubeconfig");

    node.rotate_service_account("token-2", "CA-1");
    node.wait_healthy(RESYNC + GRACE).unwrap();
    assert!(
        wait_until(RESYNC + GRACE, || beat.exists()),
        "{}",
        inst.log()
    );
    assert!(
        matches!(
            heartbeat::liveness(&state_dir, None),
            Liveness::Alive { .. }
        ),
        "{:?}",
        heartbeat::liveness(&state_dir, None)
    );
    let first = fs::read_to_string(&beat).unwrap();
    assert!(first.contains("\"resync_seconds\":1"), "{first}");
    assert!(
        wait_until(RESYNC * 2 + GRACE, || fs::read_to_string(&beat)
            .is_ok_and(|b| b != first)),
        "not renewed by the next pass"
    );
    assert!(
        !file_names(&node.conf_dir)
            .iter()
            .any(|n| n.contains("heartbeat")),
        "{:?}",
        file_names(&node.conf_dir)
    );

    inst.signal(Signal::SIGTERM);
    assert!(
        inst.wait_exit(UNINSTALL_DRAIN + Duration::from_secs(3))
            .unwrap()
            .success()
    );
    assert!(!beat.exists(), "the uninstall left the heartbeat");
}

/// `uninstall` needs only the places it cleans: without the API server's
/// address, the template and a listable image bin dir (none of which it
/// uses), it removes everything, the heartbeat in the state dir the entry
/// file names included; `status` goes on without the image bin dir.
#[test]
fn uninstall_and_status_need_only_what_they_use() {
    use linkerd_cni_state::heartbeat;
    let node = Node::new("uninstall-bare");
    let calico = calico_text(0);
    node.write_by_rename("10-calico.conflist", &calico);
    let beat = node
        .prefix
        .join("run/linkerd-cni")
        .join(heartbeat::HEARTBEAT_FILE);
    let mut inst = node.start(FAST);
    node.wait_healthy(RESYNC + GRACE).unwrap();
    assert!(
        wait_until(RESYNC + GRACE, || beat.exists()),
        "{}",
        inst.log()
    );
    inst.signal(Signal::SIGTERM);
    assert!(inst.wait_exit(Duration::from_secs(2)).unwrap().success());

    let bare = |args: &[&str], extra: &[(String, String)]| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_linkerd-cni-agent"));
        c.args(args)
            .env_clear()
            .env("CONTAINER_MOUNT_PREFIX", &node.prefix)
            .env("DEST_CNI_NET_DIR", HOST_CONF_DIR)
            .env("DEST_CNI_BIN_DIR", "/opt/cni/bin")
            .env("LINKERD_CNI_SERVICE_ACCOUNT_DIR", &node.sa_dir)
            .env("CONTAINER_CNI_BIN_DIR", node.root.join("no-such-dir"));
        for (k, v) in extra {
            c.env(k, v);
        }
        c.output().unwrap()
    };

    // status: the rest of the environment as the pod has it.
    let full: Vec<(String, String)> = node
        .env()
        .into_iter()
        .filter(|(k, _)| {
            k.starts_with("KUBERNETES_")
                || k.starts_with("CNI_NETWORK")
                || k == "LINKERD_CNI_PLUGIN_TOKEN"
        })
        .collect();
    let out = bare(&["status"], &full);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_ne!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("mode:") && text.contains("chain:"), "{text}");
    // status with nothing but the places: the chain judged against the
    // entry file, readiness said to be unknown and why.
    let out = bare(&["status"], &[]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("chain:         healthy")
            && text.contains("ready:         unknown: KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT, CNI_NETWORK_CONFIG not set"),
        "{text}"
    );

    let out = bare(&["uninstall"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(file_names(&node.conf_dir), vec!["10-calico.conflist"]);
    assert_eq!(
        fs::read_to_string(node.conf("10-calico.conflist")).unwrap(),
        calico
    );
    assert!(file_names(&node.bin_dir).is_empty());
    assert!(!beat.exists(), "the heartbeat is left");
}
