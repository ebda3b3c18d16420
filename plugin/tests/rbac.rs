//! deploy/linkerd-cni.yaml grants the token in the node's kubeconfig no
//! more than the plugin reads (get on pods and namespaces anywhere, get on
//! the one Service `default/kubernetes`), what the repair controller needs
//! (pods list, watch and delete; events create), and, for the installer's
//! startup taint, get and patch on nodes.

use serde_json::Value;

fn manifest() -> Vec<Value> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/linkerd-cni.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn grants(role: &Value, resource: &str) -> Vec<Value> {
    role["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| {
            r["resources"]
                .as_array()
                .is_some_and(|rs| rs.iter().any(|x| x == resource))
        })
        .cloned()
        .collect()
}

fn binds_the_service_account(binding: &Value) -> bool {
    binding["subjects"].as_array().is_some_and(|s| {
        s.iter().any(|s| {
            s["kind"] == "ServiceAccount"
                && s["name"] == "linkerd-cni"
                && s["namespace"] == "linkerd-cni"
        })
    })
}

#[test]
fn services_are_readable_only_as_default_kubernetes() {
    let docs = manifest();
    for role in of_kind(&docs, "ClusterRole") {
        assert!(
            grants(role, "services").is_empty(),
            "a ClusterRole grants services: {role}"
        );
    }
    let roles: Vec<&Value> = of_kind(&docs, "Role")
        .into_iter()
        .filter(|r| r["metadata"]["namespace"] == "default")
        .filter(|r| !grants(r, "services").is_empty())
        .collect();
    assert_eq!(roles.len(), 1, "one Role in default grants services");
    let rules = grants(roles[0], "services");
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0]["verbs"], serde_json::json!(["get"]));
    assert_eq!(rules[0]["resourceNames"], serde_json::json!(["kubernetes"]));
    assert_eq!(rules[0]["apiGroups"], serde_json::json!([""]));

    let name = roles[0]["metadata"]["name"].clone();
    assert!(
        of_kind(&docs, "RoleBinding").iter().any(|b| {
            b["metadata"]["namespace"] == "default"
                && b["roleRef"]["kind"] == "Role"
                && b["roleRef"]["name"] == name
                && binds_the_service_account(b)
        }),
        "no RoleBinding in default binds the Role to linkerd-cni/linkerd-cni"
    );
}

#[test]
fn cluster_wide_the_plugin_reads_pods_and_namespaces_the_repair_controller_deletes_pods() {
    let docs = manifest();
    let roles: Vec<&Value> = of_kind(&docs, "ClusterRole")
        .into_iter()
        .filter(|r| r["metadata"]["name"] == "linkerd-cni")
        .collect();
    assert_eq!(roles.len(), 1);
    assert_eq!(
        roles[0]["rules"],
        serde_json::json!([
            {"apiGroups": [""], "resources": ["pods", "namespaces"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch", "delete"]},
            {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]}
        ])
    );
    let name = roles[0]["metadata"]["name"].clone();
    assert!(of_kind(&docs, "ClusterRoleBinding").iter().any(|b| {
        b["roleRef"]["kind"] == "ClusterRole"
            && b["roleRef"]["name"] == name
            && binds_the_service_account(b)
    }));
}

#[test]
fn nodes_only_get_and_patch_for_the_startup_taint() {
    let docs = manifest();
    let roles: Vec<&Value> = of_kind(&docs, "ClusterRole")
        .into_iter()
        .filter(|r| !grants(r, "nodes").is_empty())
        .collect();
    assert_eq!(roles.len(), 1, "one ClusterRole grants nodes");
    assert_eq!(
        roles[0]["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}])
    );
    let name = roles[0]["metadata"]["name"].clone();
    assert!(of_kind(&docs, "ClusterRoleBinding").iter().any(|b| {
        b["roleRef"]["kind"] == "ClusterRole"
            && b["roleRef"]["name"] == name
            && binds_the_service_account(b)
    }));
    // Every ClusterRole is one of the two.
    assert_eq!(of_kind(&docs, "ClusterRole").len(), 2);

    // The installer gets its node's name, and the DaemonSet tolerates the
    // taint (it tolerates every taint).
    let ds = of_kind(&docs, "DaemonSet")[0];
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(
        spec["tolerations"],
        serde_json::json!([{"operator": "Exists"}])
    );
    let env = spec["containers"][0]["env"].as_array().unwrap();
    let node = env
        .iter()
        .find(|e| e["name"] == "LINKERD_CNI_NODE_NAME")
        .expect("LINKERD_CNI_NODE_NAME in the installer's env");
    assert_eq!(node["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
}
