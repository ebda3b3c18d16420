//! [`request`], the installer's TokenRequest for the plugin's
//! ServiceAccount, against the fake API server: bound to the Node where the
//! server supports it, else unbound; the lifetime asked for, or the
//! server's cap; 403 (the linkerd2-cni chart's RBAC) and 404 (no such
//! account) each have their error.

use std::time::{Duration, SystemTime};

use linkerd_cni_kube::{ApiError, Client, kubeconfig, token};

use super::{Credential, LIFETIME, Minted, plugin_access, request};
use crate::api;
use crate::config::Config;
use testkit::{FakeApiServer, TempDir, TokenPolicy};

const NS: &str = "linkerd-cni";
const SA: &str = "linkerd-cni-plugin";
const DAY: Duration = LIFETIME;

/// A TokenRequest for ServiceAccount `NS/SA`, bound to `node` when given.
fn mint(api: &FakeApiServer, node: Option<&str>) -> Result<Minted, ApiError> {
    let dir = TempDir::new("lcni-kube-token").unwrap();
    let kc = api.write_kubeconfig(dir.path()).unwrap();
    let config = kubeconfig::load(&kc).unwrap();
    api::blocking(config, Duration::from_secs(5), async |a| {
        request(a, NS, SA, node).await
    })
    .unwrap()
}

#[test]
fn bound_to_the_node_where_supported() {
    let api = FakeApiServer::start();
    let m = mint(&api, Some("node-1")).unwrap();
    assert!(m.node_bound);
    let c = token::claims(&m.token).unwrap();
    assert_eq!(c.subject, token::subject(NS, SA));
    assert_eq!(c.node.as_deref(), Some("node-1"));
    assert_eq!(c.lifetime(), DAY);
    let asked = &api.token_requests()[0];
    assert_eq!(asked["spec"]["expirationSeconds"], 86_400);
    assert_eq!(asked["spec"]["boundObjectRef"]["kind"], "Node");

    // An older server refuses the binding: asked again, unbound.
    api.set_tokens(TokenPolicy {
        node_binding: false,
        max_lifetime: Some(Duration::from_secs(600)),
        ..TokenPolicy::default()
    });
    let m = mint(&api, Some("node-1")).unwrap();
    assert!(!m.node_bound);
    let c = token::claims(&m.token).unwrap();
    assert_eq!(c.node, None);
    assert_eq!(c.lifetime(), Duration::from_secs(600), "the server's cap");
    assert!(c.remaining(SystemTime::now()) > Duration::from_secs(500));
    assert_eq!(api.token_requests().len(), 3);
}

#[test]
fn refusals_have_their_errors() {
    let api = FakeApiServer::start();
    api.set_tokens(TokenPolicy {
        allowed: false,
        ..TokenPolicy::default()
    });
    let e = mint(&api, Some("node-1")).err().unwrap();
    assert!(
        matches!(e, ApiError::Unauthorized { status: 403, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("HTTP 403"), "{e}");

    let api = FakeApiServer::start();
    api.delete_account(NS, SA);
    let e = mint(&api, None).err().unwrap();
    assert!(matches!(e, ApiError::NotFound { .. }), "{e}");

    // A minted token dies with its account.
    let api = FakeApiServer::start();
    let m = mint(&api, None).unwrap();
    let dir = TempDir::new("lcni-kube-token").unwrap();
    let kc = dir.path().join("kc");
    std::fs::write(&kc, api.kubeconfig_yaml().replace(api.token(), &m.token)).unwrap();
    let plugin = Client::new(kubeconfig::load(&kc).unwrap(), Duration::from_secs(5));
    api.add_namespace("default", &[]);
    assert!(plugin.namespace("default").is_ok());
    api.delete_account(NS, SA);
    let e = plugin.namespace("default").err().unwrap();
    assert!(e.to_string().contains("HTTP 401"), "{e}");
}

/// The installer's side of a node whose API server is `api`: this pod's
/// own token and CA in its service-account dir, the node's conf dir under
/// a temporary mount prefix.
struct Node {
    _dir: TempDir,
    cfg: Config,
}

fn node(api: &FakeApiServer) -> Node {
    let dir = TempDir::new("lcni-credential").unwrap();
    let sa = dir.path().join("serviceaccount");
    std::fs::create_dir_all(&sa).unwrap();
    std::fs::create_dir_all(dir.path().join("etc/cni/net.d")).unwrap();
    std::fs::write(sa.join("token"), api.token()).unwrap();
    std::fs::write(sa.join("ca.crt"), api.ca_pem()).unwrap();
    let (root, sa, port) = (
        dir.path().display().to_string(),
        sa.display().to_string(),
        api.addr().port().to_string(),
    );
    let cfg = Config::from_env(|k| {
        match k {
            "KUBERNETES_SERVICE_HOST" => Some("127.0.0.1"),
            "KUBERNETES_SERVICE_PORT" => Some(port.as_str()),
            "CNI_NETWORK_CONFIG" => Some(r#"{"type":"linkerd-cni"}"#),
            "LINKERD_CNI_POD_NAMESPACE" => Some(NS),
            "LINKERD_CNI_NODE_NAME" => Some("node-1"),
            "LINKERD_CNI_SERVICE_ACCOUNT_DIR" => Some(sa.as_str()),
            "CONTAINER_MOUNT_PREFIX" => Some(root.as_str()),
            _ => None,
        }
        .map(str::to_string)
    })
    .unwrap();
    Node { _dir: dir, cfg }
}

/// One pass's credential work: the token chosen, written into the node's
/// kubeconfig; what the kubeconfig holds then.
fn pass(c: &mut Credential, cfg: &Config) -> Option<String> {
    let t = c.token(cfg).unwrap();
    crate::kubeconfig::ensure(cfg, t.as_deref()).unwrap();
    crate::kubeconfig::file_token(cfg)
}

fn token_path() -> String {
    format!("/api/v1/namespaces/{NS}/serviceaccounts/{SA}/token")
}

/// A 403 on the TokenRequest under RBAC that grants it (a binding not yet
/// in effect, an authorization webhook) never puts this pod's own token on
/// the node's disk: asked again within the attempt, the plugin's token
/// lands; refused for longer, the kubeconfig holds none until it does.
/// Only when a review says this pod may not ask (the linkerd2-cni chart's
/// RBAC) does it fall back to its own token.
#[test]
fn a_forbidden_token_request_falls_back_only_when_a_review_says_no() {
    let api = FakeApiServer::start();
    let n = node(&api);
    api.fail_next_on(&token_path(), 1, 403);
    let mut c = Credential::default();
    let t = pass(&mut c, &n.cfg).expect("a token in the kubeconfig");
    assert_ne!(t, api.token(), "this pod's own token on the node's disk");
    assert_eq!(token::claims(&t).unwrap().subject, token::subject(NS, SA));

    // Refused for the whole attempt, the review allowing: no fallback.
    let api = FakeApiServer::start();
    let n = node(&api);
    api.fail_next_on(&token_path(), 3, 403);
    let mut c = Credential::default();
    assert_eq!(pass(&mut c, &n.cfg), None, "no token until one is minted");
    assert_eq!(api.requests(super::SELF_SUBJECT_ACCESS_REVIEW_PATH), 1);
    c.next_try = None;
    let t = pass(&mut c, &n.cfg).expect("minted once the 403s stop");
    assert_eq!(token::claims(&t).unwrap().subject, token::subject(NS, SA));

    // The review denying: the fallback, as under the chart's RBAC.
    let api = FakeApiServer::start();
    let n = node(&api);
    api.set_tokens(TokenPolicy {
        allowed: false,
        ..TokenPolicy::default()
    });
    let mut c = Credential::default();
    assert_eq!(pass(&mut c, &n.cfg).as_deref(), Some(api.token()));
    assert!(c.fallback.is_some());
}

/// The plugin's token revoked (its ServiceAccount deleted and created
/// again): once the plugin counts rejections, the review the installer
/// then asks with that token gets 401, and the next pass mints another
/// and writes it, instead of keeping the trusted one for half its
/// lifetime.
#[test]
fn a_revoked_plugin_token_is_replaced_after_the_plugins_rejections() {
    let api = FakeApiServer::start();
    let n = node(&api);
    let mut c = Credential::default();
    let first = pass(&mut c, &n.cfg).expect("minted");
    api.revoke_token(&first);
    // Trusted: not asked about on every pass.
    assert_eq!(pass(&mut c, &n.cfg).as_ref(), Some(&first));
    assert_eq!(api.token_requests().len(), 1);
    // The plugin's rejections rose: the installer asks about its access.
    assert_eq!(plugin_access(&mut c, &n.cfg, None), None, "no finding");
    let second = pass(&mut c, &n.cfg).expect("minted again");
    assert_ne!(second, first);
    assert_eq!(api.token_requests().len(), 2);
    assert_eq!(pass(&mut c, &n.cfg), Some(second), "kept");
}
