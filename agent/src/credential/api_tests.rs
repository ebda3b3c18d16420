//! [`request`], the installer's TokenRequest for the plugin's
//! ServiceAccount, against the fake API server: bound to the Node where the
//! server supports it, else unbound; the lifetime asked for, or the
//! server's cap; 403 (the linkerd2-cni chart's RBAC) and 404 (no such
//! account) each have their error.

use std::time::{Duration, SystemTime};

use linkerd_cni_kube::{Client, kubeconfig, token};

use super::{LIFETIME, Minted, TokenError, request};
use crate::api;
use testkit::{FakeApiServer, TempDir, TokenPolicy};

const NS: &str = "linkerd-cni";
const SA: &str = "linkerd-cni-plugin";
const DAY: Duration = LIFETIME;

/// A TokenRequest for ServiceAccount `NS/SA`, bound to `node` when given.
fn mint(api: &FakeApiServer, node: Option<&str>) -> Result<Minted, TokenError> {
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
    assert!(matches!(e, TokenError::Forbidden { .. }), "{e}");
    assert!(e.to_string().contains("HTTP 403"), "{e}");

    let api = FakeApiServer::start();
    api.delete_account(NS, SA);
    let e = mint(&api, None).err().unwrap();
    assert!(matches!(e, TokenError::NoAccount { .. }), "{e}");

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
