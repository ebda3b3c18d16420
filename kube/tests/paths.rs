//! Names go into API paths as one segment each, percent-encoded: a
//! namespace or pod name holding `/`, `?`, `#`, `%` or `..` cannot reach
//! another object, whatever the caller checked.

use std::time::Duration;

use linkerd_cni_kube::{Client, kubeconfig};
use testkit::objects::Pod;
use testkit::{FakeApiServer, TempDir};

#[test]
fn a_name_cannot_reach_another_object() {
    let api = FakeApiServer::start();
    let dir = TempDir::new("lcni-kube-paths").unwrap();
    let kc = api.write_kubeconfig(dir.path()).unwrap();
    api.add_pod(&Pod::new("kube-system", "coredns"));
    api.add_namespace("kube-system", &[]);
    let client = || Client::new(kubeconfig::load(&kc).unwrap(), Duration::from_secs(5));

    // As it is, the pod is there.
    assert!(client().pod("kube-system", "coredns").is_ok());
    for (namespace, name) in [
        ("kube-system/pods/coredns?", "web-0"),
        ("kube-system/pods/coredns#", "web-0"),
        ("kube-system", "coredns?x=1"),
        ("kube-system/pods", "coredns"),
        ("..", "coredns"),
    ] {
        let got = client().pod(namespace, name);
        assert!(got.is_err(), "{namespace:?} {name:?} fetched {got:?}");
    }
    assert!(client().namespace("kube-system/pods/coredns?").is_err());
}

/// An API server whose CA and certificate have RSA keys (kubeadm's
/// default; testkit's is ECDSA) is verified and read; one whose CA is not
/// the kubeconfig's is refused.
#[test]
fn an_rsa_keyed_api_server_is_verified() {
    let api = FakeApiServer::start_with(testkit::pki::TestPki::rsa());
    let dir = TempDir::new("lcni-kube-rsa").unwrap();
    let kc = api.write_kubeconfig(dir.path()).unwrap();
    api.add_pod(&Pod::new("kube-system", "coredns"));
    let config = kubeconfig::load(&kc).unwrap();
    let got = Client::new(config, Duration::from_secs(5)).pod("kube-system", "coredns");
    assert!(got.is_ok(), "{got:?}");

    // The same server, trusted through another CA: refused.
    let other = FakeApiServer::start();
    let other_dir = TempDir::new("lcni-kube-rsa-other").unwrap();
    let other_kc = other.write_kubeconfig(other_dir.path()).unwrap();
    let text = std::fs::read_to_string(&other_kc)
        .unwrap()
        .replace(&other.url(), &api.url())
        .replace(other.token(), api.token());
    assert!(text.contains(api.token()), "{text}");
    std::fs::write(&other_kc, text).unwrap();
    let got = Client::new(kubeconfig::load(&other_kc).unwrap(), Duration::from_secs(5))
        .pod("kube-system", "coredns");
    assert!(got.is_err(), "an unknown CA's server was read: {got:?}");
}
