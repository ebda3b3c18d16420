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
    assert!(
        client()
            .daemonset("kube-system/pods/coredns?", "x")
            .is_err()
    );
}
