//! What each service account of `deploy/` may do, walked from every
//! binding in the manifests that applies to it (by ServiceAccount, by user
//! name, or by the groups every service account is in), through the roles
//! they reference, to one grant per verb, resource and scope:
//!
//! - `linkerd-cni-plugin`, whose token is the one the node keeps (the
//!   kubeconfig in its conf dir), gets pods and namespaces and Service
//!   `default/kubernetes`, and nothing else;
//! - `linkerd-cni`, the DaemonSet's, keeps what the installer and the
//!   repair controller need, only in its pods' projected tokens;
//! - the ValidatingAdmissionPolicy of `deploy/linkerd-cni-admission.yaml`
//!   matches that account and every mutation its RBAC allows on nodes and
//!   pods.
//!
//! A binding to a role the manifests do not hold (a built-in one such as
//! `view`), an aggregated ClusterRole or a wildcard fails the walk: its
//! rights could not be told from the manifests.

use std::collections::BTreeSet;

use serde_json::{Value, json};

const NAMESPACE: &str = "linkerd-cni";
const PLUGIN_ACCOUNT: &str = "linkerd-cni-plugin";
/// The installer's default `LINKERD_CNI_STARTUP_TAINT`.
const STARTUP_TAINT: &str = "linkerd.io/cni-not-ready";

fn documents(file: &str) -> Vec<Value> {
    let path = format!("{}/../deploy/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

/// Every object of `deploy/`.
fn deploy() -> Vec<Value> {
    let mut docs = documents("linkerd-cni.yaml");
    docs.extend(documents("linkerd-cni-admission.yaml"));
    docs
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            s.as_str()
                .unwrap_or_else(|| panic!("not a string: {s}"))
                .to_string()
        })
        .collect()
}

/// One thing a service account may do. `namespace` None: in every
/// namespace (or a cluster-scoped resource); `names` None: any object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Grant {
    verb: String,
    group: String,
    /// With its subresource, as RBAC names it (`serviceaccounts/token`).
    resource: String,
    namespace: Option<String>,
    names: Option<Vec<String>>,
}

fn grant(verb: &str, group: &str, resource: &str, ns: Option<&str>, names: &[&str]) -> Grant {
    Grant {
        verb: verb.into(),
        group: group.into(),
        resource: resource.into(),
        namespace: ns.map(String::from),
        names: (!names.is_empty()).then(|| names.iter().map(|n| n.to_string()).collect()),
    }
}

/// Whether a binding's subjects include `namespace/account`, directly or
/// through a group every service account (or every identity) is in.
fn binds(binding: &Value, namespace: &str, account: &str) -> bool {
    strings_of_subjects(binding).iter().any(|(kind, name, ns)| {
        match kind.as_str() {
            "ServiceAccount" => {
                // A RoleBinding's subject without a namespace is in the
                // binding's.
                let ns = ns
                    .clone()
                    .or_else(|| binding["metadata"]["namespace"].as_str().map(String::from));
                name == account && ns.as_deref() == Some(namespace)
            }
            "User" => *name == format!("system:serviceaccount:{namespace}:{account}"),
            "Group" => [
                "system:authenticated".to_string(),
                "system:serviceaccounts".to_string(),
                format!("system:serviceaccounts:{namespace}"),
            ]
            .contains(name),
            other => panic!("unknown subject kind {other:?} in {binding}"),
        }
    })
}

fn strings_of_subjects(binding: &Value) -> Vec<(String, String, Option<String>)> {
    binding["subjects"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            (
                s["kind"].as_str().unwrap_or_default().to_string(),
                s["name"].as_str().unwrap_or_default().to_string(),
                s["namespace"].as_str().map(String::from),
            )
        })
        .collect()
}

/// The role a binding references, from the manifests.
fn role_of<'a>(docs: &'a [Value], binding: &Value) -> &'a Value {
    let kind = binding["roleRef"]["kind"].as_str().unwrap();
    let name = &binding["roleRef"]["name"];
    let found: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == kind && d["metadata"]["name"] == *name)
        .filter(|d| {
            kind == "ClusterRole" || d["metadata"]["namespace"] == binding["metadata"]["namespace"]
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "the {kind} {name} that {} references is not in deploy/: its rights cannot be told",
        binding["metadata"]["name"]
    );
    found[0]
}

/// Every grant of `namespace/account`, walked from every binding.
fn grants_of(docs: &[Value], namespace: &str, account: &str) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for binding in docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRoleBinding" || d["kind"] == "RoleBinding")
        .filter(|b| binds(b, namespace, account))
    {
        let role = role_of(docs, binding);
        assert!(
            role.get("aggregationRule").is_none(),
            "aggregated ClusterRole {}: its rules come from elsewhere",
            role["metadata"]["name"]
        );
        // A RoleBinding scopes whatever it references to its namespace.
        let scope = (binding["kind"] == "RoleBinding").then(|| {
            binding["metadata"]["namespace"]
                .as_str()
                .unwrap()
                .to_string()
        });
        for rule in role["rules"].as_array().into_iter().flatten() {
            assert!(
                rule.get("nonResourceURLs").is_none(),
                "nonResourceURLs in {}",
                role["metadata"]["name"]
            );
            let names = strings(&rule["resourceNames"]);
            for verb in strings(&rule["verbs"]) {
                for group in strings(&rule["apiGroups"]) {
                    for resource in strings(&rule["resources"]) {
                        for s in [&verb, &group, &resource] {
                            assert!(!s.contains('*'), "wildcard {s:?} in {rule}");
                        }
                        out.insert(Grant {
                            verb: verb.clone(),
                            group: group.clone(),
                            resource,
                            namespace: scope.clone(),
                            names: (!names.is_empty()).then(|| names.clone()),
                        });
                    }
                }
            }
        }
    }
    out
}

/// Whether `grants` allow this request (`namespace` None: cluster scope
/// or every namespace; `name` None: a request without a name, e.g. list).
fn may(
    grants: &BTreeSet<Grant>,
    verb: &str,
    resource: &str,
    namespace: Option<&str>,
    name: Option<&str>,
) -> bool {
    let (group, resource) = resource.split_once(':').unwrap_or(("", resource));
    grants.iter().any(|g| {
        g.verb == verb
            && g.group == group
            && g.resource == resource
            && (g.namespace.is_none() || g.namespace.as_deref() == namespace)
            && g.names
                .as_ref()
                .is_none_or(|ns| name.is_some_and(|n| ns.iter().any(|x| x == n)))
    })
}

fn daemonset(docs: &[Value]) -> &Value {
    let ds = of_kind(docs, "DaemonSet");
    assert_eq!(ds.len(), 1);
    ds[0]
}

/// The DaemonSet's service account: (namespace, name).
fn daemonset_account(docs: &[Value]) -> (String, String) {
    let ds = daemonset(docs);
    (
        ds["metadata"]["namespace"].as_str().unwrap().to_string(),
        ds["spec"]["template"]["spec"]["serviceAccountName"]
            .as_str()
            .unwrap()
            .to_string(),
    )
}

#[test]
fn the_node_token_gets_pods_namespaces_and_the_kubernetes_service_and_nothing_else() {
    let docs = deploy();
    let accounts = of_kind(&docs, "ServiceAccount");
    assert!(
        accounts.iter().any(|a| {
            a["metadata"]["name"] == PLUGIN_ACCOUNT && a["metadata"]["namespace"] == NAMESPACE
        }),
        "no ServiceAccount {NAMESPACE}/{PLUGIN_ACCOUNT}"
    );
    let grants = grants_of(&docs, NAMESPACE, PLUGIN_ACCOUNT);
    assert_eq!(
        grants,
        BTreeSet::from([
            grant("get", "", "pods", None, &[]),
            grant("get", "", "namespaces", None, &[]),
            grant("get", "", "services", Some("default"), &["kubernetes"]),
        ]),
        "everything {NAMESPACE}/{PLUGIN_ACCOUNT} may do"
    );

    // The same, asked the way the API server would.
    assert!(may(
        &grants,
        "get",
        "pods",
        Some("emojivoto"),
        Some("web-1")
    ));
    assert!(may(&grants, "get", "namespaces", None, Some("emojivoto")));
    assert!(may(
        &grants,
        "get",
        "services",
        Some("default"),
        Some("kubernetes")
    ));
    for (verb, resource, ns, name) in [
        ("list", "pods", None, None),
        ("watch", "pods", None, None),
        ("delete", "pods", Some("emojivoto"), Some("web-1")),
        ("patch", "nodes", None, Some("node-1")),
        ("get", "nodes", None, Some("node-1")),
        ("get", "services", Some("emojivoto"), Some("kubernetes")),
        ("get", "services", Some("default"), Some("other")),
        ("list", "services", Some("default"), None),
        ("get", "secrets", Some(NAMESPACE), Some("x")),
        (
            "create",
            "serviceaccounts/token",
            Some(NAMESPACE),
            Some(PLUGIN_ACCOUNT),
        ),
        ("create", "events.k8s.io:events", Some("emojivoto"), None),
        (
            "get",
            "apps:daemonsets",
            Some(NAMESPACE),
            Some("linkerd-cni"),
        ),
    ] {
        assert!(
            !may(&grants, verb, resource, ns, name),
            "{PLUGIN_ACCOUNT} may {verb} {resource} {ns:?}/{name:?}"
        );
    }
}

#[test]
fn the_daemonsets_account_keeps_the_installers_and_the_repair_controllers_rights() {
    let docs = deploy();
    let (ns, account) = daemonset_account(&docs);
    assert_ne!(
        account, PLUGIN_ACCOUNT,
        "the DaemonSet runs as the plugin's account"
    );
    let grants = grants_of(&docs, &ns, &account);
    let here = Some(NAMESPACE);
    assert_eq!(
        grants,
        BTreeSet::from([
            // The repair controller: its node's pods, and an Event per deletion.
            grant("list", "", "pods", None, &[]),
            grant("watch", "", "pods", None, &[]),
            grant("delete", "", "pods", None, &[]),
            // Its answers to the plugin's lookups: a pod or namespace the
            // watches have not seen yet, every namespace's annotations,
            // and Service default/kubernetes alone.
            grant("get", "", "pods", None, &[]),
            grant("get", "", "namespaces", None, &[]),
            grant("list", "", "namespaces", None, &[]),
            grant("watch", "", "namespaces", None, &[]),
            grant("get", "", "services", Some("default"), &["kubernetes"]),
            grant("list", "", "services", Some("default"), &["kubernetes"]),
            grant("watch", "", "services", Some("default"), &["kubernetes"]),
            grant("create", "events.k8s.io", "events", None, &[]),
            // The startup taint.
            grant("get", "", "nodes", None, &[]),
            grant("patch", "", "nodes", None, &[]),
            // The plugin's tokens, and the uninstall decision at SIGTERM.
            grant(
                "create",
                "",
                "serviceaccounts/token",
                here,
                &[PLUGIN_ACCOUNT]
            ),
            grant("get", "", "pods", here, &[]),
            grant("get", "", "namespaces", here, &[NAMESPACE]),
            grant("get", "apps", "daemonsets", here, &[]),
        ]),
        "everything {ns}/{account} may do"
    );
    // It cannot mint tokens of its own account; it reads the pods and
    // namespaces the plugin asks it about.
    assert!(!may(
        &grants,
        "create",
        "serviceaccounts/token",
        here,
        Some(&account)
    ));
    assert!(may(
        &grants,
        "create",
        "serviceaccounts/token",
        here,
        Some(PLUGIN_ACCOUNT)
    ));
    assert!(may(
        &grants,
        "get",
        "pods",
        Some("emojivoto"),
        Some("web-1")
    ));
    assert!(may(&grants, "get", "namespaces", None, Some("emojivoto")));
    assert!(!may(
        &grants,
        "get",
        "services",
        Some("emojivoto"),
        Some("kubernetes")
    ));

    // The installer gets its node's name, and the DaemonSet tolerates the
    // startup taint (it tolerates every taint).
    let spec = &daemonset(&docs)["spec"]["template"]["spec"];
    assert_eq!(spec["tolerations"], json!([{"operator": "Exists"}]));
    let env = spec["containers"][0]["env"].as_array().unwrap();
    let node = env
        .iter()
        .find(|e| e["name"] == "LINKERD_CNI_NODE_NAME")
        .expect("LINKERD_CNI_NODE_NAME in the installer's env");
    assert_eq!(node["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
    assert!(
        env.iter().all(|e| e["name"] != "LINKERD_CNI_STARTUP_TAINT"),
        "the admission policy names the default startup taint"
    );
}

/// The admission operation a verb's request goes through.
fn operation(verb: &str) -> &'static str {
    match verb {
        "create" => "CREATE",
        "update" | "patch" => "UPDATE",
        "delete" | "deletecollection" => "DELETE",
        other => panic!("{other} is not a mutation"),
    }
}

#[test]
fn the_admission_policy_narrows_every_node_and_pod_mutation_of_the_daemonsets_account() {
    let docs = documents("linkerd-cni-admission.yaml");
    let policies = of_kind(&docs, "ValidatingAdmissionPolicy");
    let bindings = of_kind(&docs, "ValidatingAdmissionPolicyBinding");
    assert_eq!((policies.len(), bindings.len(), docs.len()), (1, 1, 2));
    let (policy, binding) = (policies[0], bindings[0]);
    assert_eq!(policy["apiVersion"], "admissionregistration.k8s.io/v1");
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    assert!(
        binding["spec"].get("matchResources").is_none(),
        "the binding narrows what the policy matches"
    );
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");

    // It matches exactly the DaemonSet's service account.
    let (ns, account) = daemonset_account(&deploy());
    let conditions = policy["spec"]["matchConditions"].as_array().unwrap();
    assert_eq!(conditions.len(), 1);
    assert_eq!(
        conditions[0]["expression"].as_str().unwrap().trim(),
        format!("request.userInfo.username == \"system:serviceaccount:{ns}:{account}\"")
    );

    // Every mutation that account's RBAC allows on nodes and pods goes
    // through the policy, and nothing else does.
    let mutations: BTreeSet<(String, String)> = grants_of(&deploy(), &ns, &account)
        .into_iter()
        .filter(|g| g.group.is_empty() && ["nodes", "pods"].contains(&g.resource.as_str()))
        .filter(|g| !["get", "list", "watch"].contains(&g.verb.as_str()))
        .map(|g| (g.resource, operation(&g.verb).to_string()))
        .collect();
    assert_eq!(
        mutations,
        BTreeSet::from([
            ("nodes".to_string(), "UPDATE".to_string()),
            ("pods".to_string(), "DELETE".to_string())
        ])
    );
    let mut matched = BTreeSet::new();
    for rule in policy["spec"]["matchConstraints"]["resourceRules"]
        .as_array()
        .unwrap()
    {
        assert_eq!(rule["apiGroups"], json!([""]), "{rule}");
        assert_eq!(rule["apiVersions"], json!(["v1"]), "{rule}");
        for resource in strings(&rule["resources"]) {
            for op in strings(&rule["operations"]) {
                matched.insert((resource.clone(), op));
            }
        }
    }
    assert_eq!(matched, mutations);

    // The node is the one the request's token was issued on, and the taint
    // the only one it may remove is the installer's.
    let text = serde_json::to_string(&policy["spec"]).unwrap();
    assert!(text.contains(r#"request.userInfo.extra[\"authentication.kubernetes.io/node-name\"]"#));
    let taint = policy["spec"]["variables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "startupTaint")
        .expect("a startupTaint variable");
    assert_eq!(taint["expression"], format!("\"{STARTUP_TAINT}\""));
    let validations = policy["spec"]["validations"].as_array().unwrap();
    for needle in [
        "oldObject.metadata.name == variables.nodeName",
        "oldObject.spec.nodeName == variables.nodeName",
        "variables.oldTaints.filter(t, t.key != variables.startupTaint)",
        // The pods the repair controller watches, never a mirror pod.
        r#""linkerd.io/control-plane-ns" in oldObject.metadata.labels"#,
        r#""kubernetes.io/config.mirror" in oldObject.metadata.annotations"#,
    ] {
        assert!(
            validations
                .iter()
                .any(|v| v["expression"].as_str().unwrap().contains(needle)),
            "no validation checks {needle}"
        );
    }
}
