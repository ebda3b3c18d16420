//! The Kubernetes side of a node: testkit's fake API server listening
//! inside the node namespace (where the plugin runs, so its loopback is the
//! node's), the kubeconfig written where the plugin's entry names it, and
//! the pods the plugin looks up.
//!
//! A kubeconfig in place also switches on the plugin's chain repair, which
//! works only while the kubeconfig its entry names exists.

use testkit::FakeApiServer;
use testkit::objects::Pod as ApiPod;

use crate::node::{Node, PodSpec};

/// The namespace of the test's application pods: not exempt, so the
/// plugin asks the API about them.
pub const APP_NAMESPACE: &str = "emojivoto";

impl Node {
    /// Starts the fake API server inside this node's namespace and writes
    /// its kubeconfig (mode 0600) to [`Node::kubeconfig_path`]. It serves
    /// [`APP_NAMESPACE`] (no annotations) from the start; pods are added with
    /// [`serve_meshed`] and [`serve_unmeshed`]. Stops on drop.
    pub fn start_api_server(&self) -> FakeApiServer {
        self.start_api_server_with(testkit::pki::TestPki::new())
    }

    /// [`Node::start_api_server`], serving `pki`'s certificate (e.g.
    /// [`testkit::pki::TestPki::rsa`]).
    pub fn start_api_server_with(&self, pki: testkit::pki::TestPki) -> FakeApiServer {
        let api = self.api_server_serving(pki);
        let written = api
            .write_kubeconfig(&self.conf_dir())
            .unwrap_or_else(|e| panic!("cannot write the kubeconfig: {e}"));
        assert_eq!(written, self.kubeconfig_path(), "kubeconfig name drifted");
        api
    }

    /// The fake API server inside this node, without a kubeconfig: for
    /// tests where the installer writes it.
    pub fn start_api_server_only(&self) -> FakeApiServer {
        self.api_server_serving(testkit::pki::TestPki::new())
    }

    /// This node's name in the API (`spec.nodeName` of its pods): what
    /// the node agent watches.
    pub fn kube_name(&self) -> String {
        format!("node-{}", self.id())
    }

    fn api_server_serving(&self, pki: testkit::pki::TestPki) -> FakeApiServer {
        let api = FakeApiServer::start_in_netns_with(self.netns().path(), pki)
            .unwrap_or_else(|e| panic!("cannot start the fake API server in the node: {e}"));
        api.add_namespace(APP_NAMESPACE, &[]);
        api
    }
}

/// Serves a pod as linkerd's injector leaves it in CNI mode (a
/// `linkerd-proxy` container, no `linkerd-init`) and returns what the
/// kubelet would tell CNI about it.
pub fn serve_meshed(api: &FakeApiServer, name: &str) -> PodSpec {
    api.add_pod(&ApiPod::meshed(APP_NAMESPACE, name));
    PodSpec::kubernetes(APP_NAMESPACE, name)
}

/// Serves a pod without a proxy: the plugin looks it up and leaves it be.
pub fn serve_unmeshed(api: &FakeApiServer, name: &str) -> PodSpec {
    api.add_pod(&ApiPod::new(APP_NAMESPACE, name));
    PodSpec::kubernetes(APP_NAMESPACE, name)
}

/// Serves `pod` as the scheduler leaves it bound to `node`, a change its
/// watches see (so a node agent answers for it from its watch, as for a
/// pod the kubelet starts), and returns what the kubelet would tell CNI
/// about it.
pub fn serve_on(api: &FakeApiServer, node: &Node, pod: &ApiPod) -> PodSpec {
    api.put_pod(testkit::objects::on_node(pod.json(), &node.kube_name()));
    PodSpec::kubernetes(pod.namespace(), pod.name())
}

/// The API path of a pod of [`APP_NAMESPACE`], for request counts.
pub fn pod_path(name: &str) -> String {
    testkit::objects::pod_path(APP_NAMESPACE, name)
}
