//! What keeps a node usable through the installer's life: no entry without
//! a kubeconfig the plugin can use, and the `linkerd2-cni` chart's preStop
//! hook (`/bin/sh -c "kill -15 1; sleep 15s"`) working with this image's
//! `/bin/sh`, `linkerd-cni-sh`, against the installer running as PID 1.

mod common;

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use testkit::names::file_names;

const RESYNC: Duration = Duration::from_secs(1);
const FAST: &[(&str, &str)] = &[("LINKERD_CNI_RESYNC_SECONDS", "1")];
const SH: &str = env!("CARGO_BIN_EXE_linkerd-cni-sh");
/// The chart's install-cni preStop hook, word for word.
const PRESTOP: [&str; 3] = ["/bin/sh", "-c", "kill -15 1; sleep 15s"];

/// No service-account token (automountServiceAccountToken off, a wrong
/// LINKERD_CNI_SERVICE_ACCOUNT_DIR): the binary goes in, but no kubeconfig
/// and no entry, the chain is left alone, and `check` says why. The token
/// appears: the node is chained.
#[test]
fn no_token_no_entry() {
    let node = Node::new("no-token");
    let calico = calico_text(0);
    node.write_by_rename("10-calico.conflist", &calico);
    fs::remove_file(node.sa_dir.join("token")).unwrap();
    let inst = node.start(FAST);
    assert!(
        inst.wait_log("writing no entry", RESYNC + GRACE),
        "{}",
        inst.log()
    );
    // A few passes more: still nothing.
    assert!(
        !wait_until(RESYNC * 2, || file_names(&node.conf_dir).len() > 1),
        "{:?}\n{}",
        file_names(&node.conf_dir),
        inst.log()
    );
    assert_eq!(
        fs::read_to_string(node.conf("10-calico.conflist")).unwrap(),
        calico
    );
    assert_eq!(file_names(&node.conf_dir), ["10-calico.conflist"]);
    let out = node.run(&["check"], &[]);
    let why = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{why}");
    assert!(
        why.contains("cannot read the service-account token")
            && why.contains(node.sa_dir.join("token").to_str().unwrap()),
        "{why}"
    );

    fs::write(node.sa_dir.join("..data/token"), "token-1").unwrap();
    fs::remove_file(node.sa_dir.join("token")).ok();
    std::os::unix::fs::symlink("..data/token", node.sa_dir.join("token")).unwrap();
    node.wait_healthy(RESYNC + GRACE)
        .unwrap_or_else(|e| panic!("{e}\n{}", inst.log()));
    assert_eq!(node.run(&["check"], &[]).status.code(), Some(0));
}

/// An empty token, an empty CA and a missing CA (without SKIP_TLS_VERIFY)
/// are as unusable as no token.
#[test]
fn unusable_credentials_no_entry() {
    for (case, file, content) in [
        ("empty-token", "token", Some("  \n")),
        ("empty-ca", "ca.crt", Some("")),
        ("missing-ca", "ca.crt", None),
    ] {
        let node = Node::new(case);
        node.write_by_rename("10-calico.conflist", &calico_text(0));
        let target = node.sa_dir.join("..data").join(file);
        match content {
            Some(c) => fs::write(&target, c).unwrap(),
            None => fs::remove_file(&target).unwrap(),
        }
        let inst = node.start(FAST);
        assert!(
            inst.wait_log("writing no entry", RESYNC + GRACE),
            "{case}: {}",
            inst.log()
        );
        assert_eq!(file_names(&node.conf_dir), ["10-calico.conflist"], "{case}");
        let out = node.run(&["check"], &[]);
        let why = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{case}: {why}");
        assert!(why.contains(file), "{case}: {why}");
    }
}

/// The image puts `linkerd-cni-sh` at `/bin/sh`, built by the Dockerfile's
/// build, which builds this package.
#[test]
fn dockerfile_puts_the_tiny_sh_at_bin_sh() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Dockerfile");
    let text = fs::read_to_string(&path).unwrap();
    // Continuation lines joined, as Docker reads them.
    let text = text.replace("\\\n", " ");
    let copies: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.first().is_some_and(|c| c.eq_ignore_ascii_case("COPY")))
        .collect();
    let to_sh: Vec<_> = copies
        .iter()
        .filter(|w| w.last() == Some(&"/bin/sh"))
        .collect();
    assert_eq!(to_sh.len(), 1, "one COPY to /bin/sh in {}", path.display());
    let sources: Vec<&&str> = to_sh[0][1..to_sh[0].len() - 1]
        .iter()
        .filter(|w| !w.starts_with("--"))
        .collect();
    assert_eq!(sources.len(), 1, "{:?}", to_sh[0]);
    assert_eq!(
        Path::new(sources[0]).file_name().unwrap(),
        "linkerd-cni-sh",
        "{:?}",
        to_sh[0]
    );
    // The build stage takes linkerd-cni-sh out of cargo's target dir.
    assert!(
        text.contains("release/linkerd-cni-sh"),
        "the build stage does not pick up linkerd-cni-sh in {}",
        path.display()
    );
    let pkg = env!("CARGO_PKG_NAME");
    assert!(
        text.lines().any(|l| l.contains("cargo build")
            && (l.contains(&format!("-p {pkg}"))
                || l.contains(&format!("--package {pkg}"))
                || l.contains("--workspace"))),
        "no `cargo build` of {pkg} (which builds linkerd-cni-sh) in {}",
        path.display()
    );
}

/// The chart's preStop command line, with this image's `/bin/sh`, in a PID
/// namespace where the installer is PID 1 (as in its container): the
/// installer gets SIGTERM and exits 0, leaving the node chained (a
/// rolling update, as far as it can tell). Needs root (namespaces).
#[test]
fn charts_prestop_hook_stops_the_installer() {
    testkit::require_root("runs the installer as PID 1 of a new PID namespace");
    let node = Node::new("prestop");
    node.write_by_rename("10-calico.conflist", &calico_text(0));
    let log = node.root.join("pid1.log");
    let mut pid1 = Guard(
        Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "--"])
            .arg(env!("CARGO_BIN_EXE_linkerd-cni-agent"))
            .env_clear()
            .envs(node.env())
            .env("LINKERD_CNI_RESYNC_SECONDS", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .expect("cannot run unshare (util-linux): this test needs it, and root"),
    );
    node.wait_healthy(RESYNC + GRACE).unwrap_or_else(|e| {
        panic!(
            "{e}\n{}\n(unshare --pid needs root)",
            fs::read_to_string(&log).unwrap_or_default()
        )
    });
    // The installer: unshare's only child, PID 1 inside.
    let children = fs::read_to_string(format!("/proc/{0}/task/{0}/children", pid1.0.id())).unwrap();
    let installer: u32 = children.split_whitespace().next().unwrap().parse().unwrap();

    let t = Instant::now();
    let mut hook = Guard(
        Command::new("nsenter")
            .args(["--target", &installer.to_string(), "--pid", "--mount", "--"])
            .arg(SH)
            .args(&PRESTOP[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot run nsenter (util-linux)"),
    );
    let status = wait_exit(&mut pid1.0, Duration::from_secs(5)).unwrap_or_else(|| {
        panic!(
            "the installer still runs 5 s after the preStop hook started\n{}",
            fs::read_to_string(&log).unwrap_or_default()
        )
    });
    eprintln!(
        "installer (PID 1) exited {:?} after the hook started",
        t.elapsed()
    );
    let text = fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "{status:?}\n{text}");
    assert!(text.contains("SIGTERM: exiting"), "{text}");
    // PID 1 gone, the kernel ends the namespace: the hook's `sleep 15s` is
    // cut short, as the runtime does when the container stops.
    assert!(
        wait_exit(&mut hook.0, Duration::from_secs(5)).is_some(),
        "the hook outlived its PID namespace"
    );
    node.healthy().unwrap();
}

/// Anything but kill and sleep: exit 127, nothing run, and a message that
/// says what this `/bin/sh` is.
#[test]
fn tiny_sh_refuses_anything_else() {
    let dir = std::env::temp_dir().join(format!("lcni-sh-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let marker = dir.join("marker");
    for args in [
        vec![
            "-c".to_string(),
            format!("kill -15 1; touch {}", marker.display()),
        ],
        vec!["-c".into(), "echo hi".into()],
        vec!["script.sh".into()],
        vec![],
    ] {
        let out = Command::new(SH).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(127), "{args:?}: {err}");
        assert!(err.contains("not a shell"), "{err}");
    }
    assert!(!marker.exists());
    fs::remove_dir_all(&dir).ok();

    // What it does run: a signal to a process of ours.
    let mut child = Guard(Command::new("sleep").arg("30").spawn().unwrap());
    let out = Command::new(SH)
        .args(["-c", &format!("kill -15 {}; sleep 0.1s", child.0.id())])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = wait_exit(&mut child.0, Duration::from_secs(5)).expect("sleep survived kill -15");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(st.signal(), Some(15));
}

fn wait_exit(c: &mut std::process::Child, within: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(s) = c.try_wait().unwrap() {
            return Some(s);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Kills and reaps its child on drop if it still runs (a test failed
/// half-way); never signals a reaped (possibly reused) pid.
struct Guard(std::process::Child);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The plugin's token to be minted (the default, deploy/'s) with no API
/// server to ask: the node is chained with a kubeconfig that holds no
/// token, never this pod's own (which under deploy/'s RBAC may delete pods
/// and patch Nodes), and `check` says the node is not ready for it.
#[test]
fn no_api_server_to_mint_from_puts_no_token_on_disk() {
    let node = Node::new("no-mint");
    node.write_by_rename("10-calico.conflist", &calico_text(0));
    let own = fs::read_to_string(node.sa_dir.join("token")).unwrap();
    let inst = node.start(&[
        ("LINKERD_CNI_RESYNC_SECONDS", "1"),
        ("LINKERD_CNI_PLUGIN_TOKEN", "mint"),
    ]);
    node.wait_healthy(RESYNC + GRACE)
        .unwrap_or_else(|e| panic!("{e}\n{}", inst.log()));
    assert!(
        inst.wait_log("no token for the plugin yet", GRACE),
        "{}",
        inst.log()
    );
    let kc = node.kubeconfig().expect("a kubeconfig");
    let doc: serde_json::Value = serde_json::from_str(&kc).unwrap();
    assert_eq!(doc["users"][0]["user"], serde_json::json!({}), "{kc}");
    assert!(!kc.contains(own.trim()), "{kc}");
    let out = node.run(&["check"], &[("LINKERD_CNI_PLUGIN_TOKEN", "mint")]);
    let why = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{why}");
    assert!(why.contains("holds no token yet"), "{why}");
}

/// A token in the node's kubeconfig claiming times no clock can hold
/// (`iat` and `exp` of 2^63 s and more): `status` and `check` report on
/// it, and the installer's loop, in either token mode, replaces it; none
/// aborts (the release build aborts on a panic, and the file would make
/// every restart abort again).
#[test]
fn a_token_claiming_times_no_clock_holds_aborts_nothing() {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
    for (iat, exp) in [(1u64 << 63, u64::MAX), (1000, u64::MAX)] {
        for mode in ["own", "mint"] {
            let node = Node::new("huge-claims");
            node.write_by_rename("10-calico.conflist", &calico_text(0));
            let claims = format!(
                r#"{{"sub":"system:serviceaccount:linkerd-cni:linkerd-cni-plugin","iat":{iat},"exp":{exp},"kubernetes.io":{{"node":{{"name":"node-1"}}}}}}"#
            );
            let token = format!(
                "{}.{}.{}",
                b64(r#"{"alg":"RS256"}"#),
                b64(&claims),
                b64("sig")
            );
            let kc = serde_json::json!({
                "apiVersion": "v1", "kind": "Config",
                "users": [{"name": "linkerd-cni", "user": {"token": token}}],
            });
            fs::write(node.conf(KUBECONFIG_NAME), kc.to_string()).unwrap();
            let env = [
                ("LINKERD_CNI_PLUGIN_TOKEN", mode),
                ("LINKERD_CNI_NODE_NAME", "node-1"),
            ];
            for args in [&["status"][..], &["check"]] {
                let o = node.run(args, &env);
                let out = String::from_utf8_lossy(&o.stdout);
                assert_eq!(
                    o.status.code(),
                    Some(1),
                    "{mode} {args:?} {iat} {exp}: {out}\n{}",
                    String::from_utf8_lossy(&o.stderr)
                );
                if args == ["status"] {
                    assert!(out.contains("credential:"), "{out}");
                }
            }
            let mut inst = node.start(&[FAST, &env[..]].concat());
            node.wait_healthy(RESYNC + GRACE)
                .unwrap_or_else(|e| panic!("{mode} {iat} {exp}: {e}\n{}", inst.log()));
            assert!(
                wait_until(RESYNC + GRACE, || node
                    .kubeconfig()
                    .is_some_and(|k| !k.contains(&token))),
                "{mode} {iat} {exp}: the token is kept\n{}",
                inst.log()
            );
            assert!(inst.running(), "{mode} {iat} {exp}: {}", inst.log());
        }
    }
}

/// A failed TokenRequest is one log line, not one per attempt: the API
/// path once, the cause, and what to do.
#[test]
fn a_failed_token_request_is_one_line_with_the_cause_and_what_to_do() {
    let node = Node::new("mint-log");
    node.write_by_rename("10-calico.conflist", &calico_text(0));
    // A CA the client takes: the request itself is made, and refused.
    node.rotate_service_account("token-1", TEST_CA);
    let inst = node.start(&[
        ("LINKERD_CNI_RESYNC_SECONDS", "1"),
        ("LINKERD_CNI_PLUGIN_TOKEN", "mint"),
    ]);
    assert!(
        inst.wait_log("cannot mint the plugin's token", Duration::from_secs(20)),
        "{}",
        inst.log()
    );
    // Whatever the pass logs after the failure is in too.
    node.wait_healthy(RESYNC + GRACE)
        .unwrap_or_else(|e| panic!("{e}\n{}", inst.log()));
    let log = inst.log();
    let path = "/serviceaccounts/";
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(path)).collect();
    assert!(!lines.is_empty(), "{log}");
    for l in &lines {
        assert_eq!(l.matches(path).count(), 1, "the path more than once: {l}");
        assert!(l.contains("cannot mint the plugin's token"), "{log}");
        assert!(l.to_lowercase().contains("refused"), "no cause: {l}");
        assert!(l.contains("check that the API server"), "no remedy: {l}");
    }
}

/// A self-signed CA certificate (its key thrown away): something the API
/// client accepts as a CA, for a server that is never reached.
const TEST_CA: &str = "\
-----BEGIN CERTIFICATE-----\n\
MIIBkzCCATmgAwIBAgIURLAoPl7vO+uDQc7CPq2UIkR3+fgwCgYIKoZIzj0EAwIw\n\
HjEcMBoGA1UEAwwTbGlua2VyZC1jbmktdGVzdC1jYTAgFw0yNjEyMDEyMzI4MDha\n\
GA8yMTI2MTEwNzIzMjgwOFowHjEcMBoGA1UEAwwTbGlua2VyZC1jbmktdGVzdC1j\n\
YTBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABP4yqekg6JyR3SPrxznIuvh6+SUi\n\
peuzWgsv/4mXwnKLCgU4DeBSMYNvmoHu+lXfKkPLIbKAltx/pUkufgA3CdCjUzBR\n\
MB0GA1UdDgQWBBRvQ523G8k+b2Yvr+wbBvqKEnatVTAfBgNVHSMEGDAWgBRvQ523\n\
G8k+b2Yvr+wbBvqKEnatVTAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0gA\n\
MEUCIQD+prK5SRVEtQJjS34PLj2FGRBEFyXcrpjR3UaJJAFHUAIgDu2JMRW9kNvb\n\
/zJ3IzyxzBTe6YHQ6f9rPapSKIPRizI=\n\
-----END CERTIFICATE-----\n";
