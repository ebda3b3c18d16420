//! The plugin binary as a runtime runs it: environment, stdin, stdout, exit
//! code.

mod common;

use std::process::Command;

use common::{BIN, exempt_env, run, stdout_json};
use serde_json::Value;
use testkit::TempDir;

fn add_env() -> Vec<(&'static str, &'static str)> {
    exempt_env("ADD")
}

/// What Calico's 0.3.1 conflist makes a runtime send to the last plugin.
/// A literal, not built from testkit's chart template: it is the runtime's
/// bytes, and the test judges that stdout keeps their key order and number
/// spelling (`0.30000000000000000004`), which a value built in memory would
/// not show. `@STATE@`: the state dir ([`calico_add`]).
const CALICO_ADD: &str = r#"{
  "cniVersion": "0.3.1",
  "name": "k8s-pod-network",
  "type": "linkerd-cni",
  "log_level": "debug",
  "chain_heal": false,
  "state_dir": "@STATE@",
  "kubernetes": {"kubeconfig": "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"},
  "linkerd": {"incoming-proxy-port": 4143, "outgoing-proxy-port": 4140, "proxy-uid": 2102,
              "inbound-ports-to-ignore": ["4191","4190"], "iptables-mode": "legacy"},
  "prevResult": {
    "cniVersion": "0.3.1",
    "interfaces": [{"name": "cali5ad3b6c0e1f"}, {"name": "eth0", "sandbox": "/var/run/netns/cni-1234"}],
    "ips": [{"version": "4", "interface": 1, "address": "10.244.1.17/32"}],
    "routes": [{"dst": "0.0.0.0/0"}],
    "dns": {},
    "x-vendor": {"ratio": 0.30000000000000000004, "big": 123456789012345678901234567890}
  }
}"#;

/// [`CALICO_ADD`] with a state dir of the test's own (where the ADD's
/// outcome is counted), not the machine's.
fn calico_add(state: &TempDir) -> String {
    CALICO_ADD.replace("@STATE@", state.path().to_str().unwrap())
}

#[test]
fn version_lists_all_seven() {
    let o = run(&[("CNI_COMMAND", "VERSION")], br#"{"cniVersion":"0.3.1"}"#);
    assert!(o.status.success());
    let v = stdout_json(&o);
    assert_eq!(v["cniVersion"], "0.3.1");
    assert_eq!(
        v["supportedVersions"],
        serde_json::json!([
            "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"
        ])
    );
}

#[test]
fn add_prints_calico_prev_result_unchanged() {
    let state = TempDir::new("binary").unwrap();
    let add = calico_add(&state);
    let o = run(&add_env(), add.as_bytes());
    assert!(
        o.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let conf: Value = serde_json::from_str(&add).unwrap();
    // preserve_order + arbitrary_precision: equal text means equal order and numbers.
    assert_eq!(
        serde_json::to_string(&stdout_json(&o)).unwrap(),
        serde_json::to_string(&conf["prevResult"]).unwrap()
    );
}

#[test]
fn garbage_stdin_is_a_cni_error_and_nothing_else() {
    let state = TempDir::new("binary").unwrap();
    let bad_key = format!(r#"{{"linkerd":"x","state_dir":{:?}}}"#, state.path());
    for garbage in [&b"{{{"[..], b"\xff\xfe", b"[]", b"42", bad_key.as_bytes()] {
        let o = run(&add_env(), garbage);
        assert!(!o.status.success());
        let v = stdout_json(&o);
        let code = v["code"].as_u64().unwrap();
        assert!(code == 6 || code == 7, "code {code} for {garbage:?}");
        assert!(v["msg"].as_str().is_some_and(|m| !m.is_empty()));
    }
}

#[test]
fn del_succeeds_without_netns_or_prev_result() {
    let conf = br#"{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"linkerd-cni"}"#;
    for netns in [None, Some(""), Some("/var/run/netns/does-not-exist")] {
        let mut vars = vec![
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "abc"),
            ("CNI_IFNAME", "eth0"),
        ];
        if let Some(n) = netns {
            vars.push(("CNI_NETNS", n));
        }
        let o = run(&vars, conf);
        assert!(
            o.status.success(),
            "netns {netns:?}: {}",
            String::from_utf8_lossy(&o.stdout)
        );
        assert!(o.stdout.is_empty());
    }
}

#[test]
fn log_lines_name_the_container_and_the_pod() {
    // Chain healing is off in CALICO_ADD and the pod is exempt: the lines
    // are the ADD's own.
    let state = TempDir::new("binary").unwrap();
    let o = run(&add_env(), calico_add(&state).as_bytes());
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "log_level debug, yet nothing on stderr");
    for line in lines {
        assert!(
            line.contains("container=3f1c2b9a7e pod=kube-system/coredns-1 "),
            "{line}"
        );
    }
}

#[test]
fn logs_never_reach_stdout() {
    // log_level debug in the config: plenty to log, none of it on stdout.
    let state = TempDir::new("binary").unwrap();
    let o = run(&add_env(), calico_add(&state).as_bytes());
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(out.trim_start().starts_with('{') && out.trim_end().ends_with('}'));
    assert_eq!(out.lines().count(), 1);
}

#[test]
fn help_and_version_for_people() {
    let o = Command::new(BIN)
        .arg("--help")
        .env_clear()
        .output()
        .unwrap();
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(help.contains("USAGE"));
    // The settings: where they are listed, a section that exists.
    assert!(
        help.contains("docs/configuration.md") && help.contains("\"Plugin config keys\""),
        "{help}"
    );
    let doc = testkit::docs::configuration(env!("CARGO_MANIFEST_DIR"));
    assert!(doc.contains("\n## Plugin config keys\n"));
    let o = Command::new(BIN)
        .arg("version")
        .env_clear()
        .output()
        .unwrap();
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("linkerd-cni "));
    let o = Command::new(BIN)
        .arg("frobnicate")
        .env_clear()
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn binary_is_statically_linked() {
    let o = Command::new("ldd").arg(BIN).output().expect("ldd");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        text.contains("not a dynamic executable") || text.contains("statically linked"),
        "ldd says: {text}"
    );
}
