//! The plugin against the environments real nodes have: proxy variables in
//! the runtime's environment, broken or insecure kubeconfigs, API servers
//! that hang mid-handshake. Network traffic stays on 127.0.0.1.

mod common;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;

use serde_json::json;
use testkit::objects::Pod;
use testkit::{FakeApiServer, TempDir};

use common::{cni_env, failed, netconf, run_plugin, stderr, stdout_json};

/// A TCP listener on 127.0.0.1 that counts the connections it gets and
/// holds each one open (as an unresponsive proxy, or a server whose TLS
/// handshake never starts) until dropped.
struct Listener {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Listener {
    fn start() -> Listener {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (connections.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            for conn in l.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                c.fetch_add(1, Ordering::SeqCst);
                held.extend(conn.ok());
            }
        });
        Listener {
            addr,
            connections,
            stop,
            thread: Some(thread),
        }
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept.
        if TcpStream::connect(self.addr).is_ok()
            && let Some(t) = self.thread.take()
        {
            let _ = t.join();
        }
    }
}

#[test]
fn proxy_variables_in_the_environment_are_not_used() {
    let api = FakeApiServer::start();
    let dir = TempDir::new("lcni-proxy").unwrap();
    let kubeconfig = api.write_kubeconfig(dir.path()).unwrap();
    api.add_pod(&Pod::new("emojivoto", "web-0"));
    let proxy = Listener::start();
    let proxy_url = format!("http://{}", proxy.addr);

    let mut env = cni_env(
        "ADD",
        std::path::Path::new("/run/netns/unused"),
        Some(("emojivoto", "web-0")),
    );
    for var in [
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
        "ALL_PROXY",
        "all_proxy",
    ] {
        env.push((var.into(), proxy_url.clone()));
    }
    // A NO_PROXY that does not cover 127.0.0.1.
    env.push(("NO_PROXY".into(), "example.com".into()));
    let out = run_plugin(&env, &netconf(&kubeconfig, json!({})));

    assert_eq!(
        proxy.connections(),
        0,
        "the plugin connected to the proxy from its environment; stderr:\n{}",
        stderr(&out)
    );
    assert!(out.status.success(), "stderr:\n{}", stderr(&out));
    assert!(stdout_json(&out).get("code").is_none());
    assert_eq!(api.requests(&Pod::new("emojivoto", "web-0").path()), 1);
}

/// A kubeconfig for a server at `addr` that trusts `api`'s CA.
fn kubeconfig_for(api: &FakeApiServer, server: &str, dir: &std::path::Path) -> std::path::PathBuf {
    let text = api.kubeconfig_yaml().replace(
        &format!("https://[{}]:{}", api.addr().ip(), api.addr().port()),
        server,
    );
    let path = dir.join("kubeconfig");
    std::fs::write(&path, text).unwrap();
    path
}

fn decide(
    kubeconfig: &std::path::Path,
    budget: f64,
) -> Result<linkerd_cni::pod::Plan, linkerd_cni::pod::Stop> {
    let env = cni_env(
        "ADD",
        std::path::Path::new("/run/netns/unused"),
        Some(("emojivoto", "web-0")),
    );
    let mut conf = netconf(kubeconfig, json!({}));
    conf["kubernetes"]["api-budget-seconds"] = json!(budget);
    let inv = common::invocation(&env, &conf);
    let config = linkerd_cni::config::PluginConfig::from_map(&inv.conf.raw)?;
    linkerd_cni::pod::decide(&inv, &config)
}

#[test]
fn tls_handshake_that_hangs_after_tcp_connected_is_named() {
    let api = FakeApiServer::start();
    let dir = TempDir::new("lcni-tlshang").unwrap();
    // Accepts TCP, never answers the ClientHello.
    let silent = Listener::start();
    let kubeconfig = kubeconfig_for(&api, &format!("https://{}", silent.addr), dir.path());
    let e = failed(decide(&kubeconfig, 1.0));
    assert!(silent.connections() >= 1);
    assert!(
        e.msg.contains("TLS handshake") && e.msg.contains("TCP connection"),
        "{e}"
    );
    assert!(!e.msg.contains("(connect)"), "{e}");
}

#[test]
fn server_that_accepts_tls_but_never_answers_is_named() {
    let api = FakeApiServer::start();
    api.set_mode(testkit::Mode::Slow(std::time::Duration::from_secs(5)));
    let dir = TempDir::new("lcni-noanswer").unwrap();
    let kubeconfig = api.write_kubeconfig(dir.path()).unwrap();
    let e = failed(decide(&kubeconfig, 1.0));
    assert!(e.msg.contains("connected, but no answer"), "{e}");
    assert!(
        !e.msg.contains("TLS") && !e.msg.contains("(connect)"),
        "{e}"
    );
}

#[test]
fn cni_netns_naming_the_plugins_own_namespace_is_refused() {
    let api = FakeApiServer::start();
    let dir = TempDir::new("lcni-ownns").unwrap();
    let kubeconfig = api.write_kubeconfig(dir.path()).unwrap();
    api.add_pod(&Pod::meshed("emojivoto", "web-0"));
    api.add_namespace("emojivoto", &[]);
    let env = cni_env(
        "ADD",
        std::path::Path::new("/proc/self/ns/net"),
        Some(("emojivoto", "web-0")),
    );
    let out = run_plugin(&env, &netconf(&kubeconfig, json!({})));
    let v = stdout_json(&out);
    assert_eq!(v["code"], 101, "{v}\n{}", stderr(&out));
    let msg = v["msg"].as_str().unwrap().to_string() + v["details"].as_str().unwrap_or("");
    assert!(
        msg.contains("refusing network namespace /proc/self/ns/net"),
        "{msg}"
    );
}

#[test]
fn check_without_prev_result_is_refused() {
    let dir = TempDir::new("lcni-check").unwrap();
    // An exempt pod: CHECK would have nothing to verify and no API call.
    let env = cni_env(
        "CHECK",
        std::path::Path::new("/run/netns/unused"),
        Some(("kube-system", "coredns-0")),
    );
    let mut conf = netconf(&dir.path().join("kubeconfig"), json!({}));
    conf["cniVersion"] = json!("1.0.0");
    conf.as_object_mut().unwrap().remove("prevResult");
    let out = run_plugin(&env, &conf);
    assert!(!out.status.success(), "CHECK without prevResult passed");
    let v = stdout_json(&out);
    assert_eq!(v["code"], 7, "{v}");
    assert!(v["msg"].as_str().unwrap().contains("prevResult"), "{v}");

    // With it, the same CHECK passes.
    let conf = netconf(&dir.path().join("kubeconfig"), json!({}));
    let out = run_plugin(&env, &conf);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn plain_http_is_refused_unless_allowed() {
    let api = FakeApiServer::start();
    let dir = TempDir::new("lcni-http").unwrap();
    let server = Listener::start();
    let kubeconfig = kubeconfig_for(&api, &format!("http://{}", server.addr), dir.path());
    let e = failed(decide(&kubeconfig, 1.0));
    assert_eq!(
        server.connections(),
        0,
        "the token went out over plain http: {e}"
    );
    assert_eq!(e.code, 100);
    assert!(e.msg.contains("refusing plain http://"), "{e}");
    assert!(e.details.contains("kubernetes.allow-plain-http"), "{e}");

    // Allowed explicitly: the call is made (and warned about).
    let env = cni_env(
        "ADD",
        std::path::Path::new("/run/netns/unused"),
        Some(("emojivoto", "web-0")),
    );
    let mut conf = netconf(&kubeconfig, json!({}));
    conf["kubernetes"]["allow-plain-http"] = json!(true);
    conf["kubernetes"]["api-budget-seconds"] = json!(0.5);
    let out = run_plugin(&env, &conf);
    assert!(server.connections() >= 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("plain http://"),
        "no warning: {}",
        stderr(&out)
    );
}

#[test]
fn tls_verification_off_is_warned_about() {
    let api = FakeApiServer::start();
    api.add_pod(&Pod::new("emojivoto", "web-0"));
    let dir = TempDir::new("lcni-insecure").unwrap();
    let text = api.kubeconfig_yaml();
    let ca_line = text
        .lines()
        .find(|l| l.contains("certificate-authority-data"))
        .unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        text.replace(ca_line, "    insecure-skip-tls-verify: true"),
    )
    .unwrap();
    let env = cni_env(
        "ADD",
        std::path::Path::new("/run/netns/unused"),
        Some(("emojivoto", "web-0")),
    );
    let out = run_plugin(&env, &netconf(&kubeconfig, json!({})));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("TLS verification is off"),
        "no warning: {}",
        stderr(&out)
    );
}

#[test]
fn chain_status_shows_weak_transports() {
    let api = FakeApiServer::start();
    let dir = TempDir::new("lcni-status").unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let text = api.kubeconfig_yaml();
    let ca_line = text
        .lines()
        .find(|l| l.contains("certificate-authority-data"))
        .unwrap();
    std::fs::write(
        &kubeconfig,
        text.replace(ca_line, "    insecure-skip-tls-verify: true"),
    )
    .unwrap();
    let conf_dir = dir.path().join("net.d");
    std::fs::create_dir(&conf_dir).unwrap();
    std::fs::write(
        conf_dir.join("10-bridge.conflist"),
        r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"}]}"#,
    )
    .unwrap();
    let entry = dir.path().join("entry.json");
    std::fs::write(
        &entry,
        json!({"name": "linkerd-cni", "type": "linkerd-cni",
               "kubernetes": {"kubeconfig": kubeconfig}})
        .to_string(),
    )
    .unwrap();
    let out = std::process::Command::new(common::BIN)
        .args(["chain", "status", "--conf-dir"])
        .arg(&conf_dir)
        .arg("--entry")
        .arg(&entry)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("warning: kubeconfig") && stdout.contains("TLS verification is off"),
        "{stdout}\n{}",
        stderr(&out)
    );
}
