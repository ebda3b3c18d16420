//! The image and the manifests agree with the controller: the one
//! container of `deploy/linkerd-cni.yaml` (the installer, which repairs
//! too) and the repair-controller container the upstream `linkerd2-cni`
//! chart renders with `repairController.enabled=true` run a file the
//! Dockerfile puts in the image, with arguments and environment the
//! controller accepts, and probe the paths and port it serves.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{CommandFactory, Parser};
use linkerd_cni_agent::repair::args::Args;
use serde_json::{Value, json};

fn repo_file(rel: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The Dockerfile's instructions, continuation lines joined.
fn dockerfile_lines() -> Vec<String> {
    repo_file("Dockerfile")
        .replace("\\\n", " ")
        .lines()
        .map(str::to_string)
        .collect()
}

/// Destination -> source of every `COPY --from=<stage>` of the final stage.
fn image_files() -> BTreeMap<String, String> {
    let lines = dockerfile_lines();
    let last_from = lines
        .iter()
        .rposition(|l| l.starts_with("FROM "))
        .expect("a FROM line");
    lines[last_from..]
        .iter()
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let copies_a_build =
                words.first() == Some(&"COPY") && words.iter().any(|w| w.starts_with("--from="));
            match words.as_slice() {
                [.., src, dest] if copies_a_build => Some((dest.to_string(), src.to_string())),
                _ => None,
            }
        })
        .collect()
}

/// The packages `cargo build` builds in the build stage.
fn built_packages() -> Vec<String> {
    let build = dockerfile_lines()
        .into_iter()
        .find(|l| l.starts_with("RUN ") && l.contains("cargo build"))
        .expect("a cargo build line");
    let words: Vec<&str> = build.split_whitespace().collect();
    words
        .windows(2)
        .filter(|w| w[0] == "-p")
        .map(|w| w[1].to_string())
        .collect()
}

fn deploy_docs() -> Vec<Value> {
    serde_saphyr::from_multiple(&repo_file("deploy/linkerd-cni.yaml")).expect("valid YAML")
}

fn deployed_container() -> Value {
    let ds = deploy_docs()
        .into_iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("a DaemonSet");
    let containers = ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(containers.len(), 1, "deploy/ runs one container");
    containers[0].clone()
}

/// The image's entrypoint, the Dockerfile's `ENTRYPOINT ["..."]`.
fn entrypoint() -> String {
    let line = dockerfile_lines()
        .into_iter()
        .find(|l| l.starts_with("ENTRYPOINT "))
        .expect("an ENTRYPOINT");
    let words: Vec<String> = serde_json::from_str(line["ENTRYPOINT ".len()..].trim())
        .unwrap_or_else(|e| panic!("{line}: {e}"));
    words[0].clone()
}

/// The container the upstream chart renders (its template, with the
/// defaults: securityContext on, IPv6 on or off), reduced to what the image
/// and the binary must match.
fn upstream_containers() -> Vec<Value> {
    ["[::]:9990", "0.0.0.0:9990"]
        .into_iter()
        .map(|addr| {
            json!({
                "name": "repair-controller",
                "env": [
                    {"name": "LINKERD_CNI_REPAIR_CONTROLLER_NODE_NAME",
                     "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "LINKERD_CNI_REPAIR_CONTROLLER_POD_NAME",
                     "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                ],
                "command": ["/usr/lib/linkerd/linkerd-cni-repair-controller"],
                "args": ["--admin-addr", addr, "--log-format", "plain", "--log-level", "info"],
                "livenessProbe": {"httpGet": {"path": "/live", "port": "repair-admin"}},
                "readinessProbe": {"httpGet": {"path": "/ready", "port": "repair-admin"}},
                "ports": [{"containerPort": 9990, "name": "repair-admin"}],
            })
        })
        .collect()
}

/// The environment variable the controller reads `id` from.
fn env_of(id: &str) -> String {
    Args::command()
        .get_arguments()
        .find(|a| a.get_id() == id)
        .and_then(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .unwrap_or_else(|| panic!("no environment variable for {id}"))
}

fn check_container(c: &Value, origin: &str) {
    let files = image_files();
    let command: Vec<&str> = c["command"]
        .as_array()
        .unwrap_or_else(|| panic!("{origin}: no command"))
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let src = files
        .get(command[0])
        .unwrap_or_else(|| panic!("{origin}: {} is not in the image: {files:?}", command[0]));
    assert!(
        src.ends_with("/linkerd-cni-agent"),
        "{origin}: {} comes from {src}",
        command[0]
    );
    assert!(
        built_packages().contains(&"linkerd-cni-agent".to_string()),
        "the Dockerfile does not build the controller: {:?}",
        built_packages()
    );

    // The arguments parse; the node and pod names come from the
    // environment, under the names the controller reads.
    let args: Vec<&str> = c["args"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap()).collect())
        .unwrap_or_default();
    let mut argv = command.clone();
    argv.extend(&args);
    argv.extend(["--node-name", "n", "--controller-pod-name", "p"]);
    let parsed = Args::try_parse_from(&argv).unwrap_or_else(|e| panic!("{origin}: {e}"));
    let env: BTreeMap<&str, &str> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap(),
                e["valueFrom"]["fieldRef"]["fieldPath"]
                    .as_str()
                    .unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        env.get(env_of("node_name").as_str()),
        Some(&"spec.nodeName"),
        "{origin}"
    );
    assert_eq!(
        env.get(env_of("controller_pod_name").as_str()),
        Some(&"metadata.name"),
        "{origin}"
    );

    // The probes reach the admin server, on paths it serves (the tests
    // against the fake API server GET them).
    let port_name = c["livenessProbe"]["httpGet"]["port"].as_str().unwrap();
    let port = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == port_name)
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("{origin}: no port {port_name}"));
    assert_eq!(u64::from(parsed.admin_addr.port()), port, "{origin}");
    assert_eq!(
        c["readinessProbe"]["httpGet"]["port"], port_name,
        "{origin}"
    );
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/live", "{origin}");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/ready", "{origin}");
}

/// The variables of a container's `env` with their downward-API field
/// (empty for a plain value).
fn fields(c: &Value) -> BTreeMap<String, String> {
    c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["valueFrom"]["fieldRef"]["fieldPath"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
            )
        })
        .collect()
}

/// deploy/'s container runs the image's entrypoint, the agent under the
/// installer's name, with the variable that makes it repair too and the
/// controller's variables it needs; its probes are the installer's
/// `check`, and it opens no port.
#[test]
fn the_deployed_container_runs_the_installer_which_repairs() {
    let c = deployed_container();
    assert!(
        c.get("command").is_none() && c.get("args").is_none(),
        "{c:#}"
    );
    let entry = entrypoint();
    let src = image_files()
        .get(&entry)
        .cloned()
        .unwrap_or_else(|| panic!("{entry} is not in the image"));
    assert!(
        src.ends_with("/linkerd-cni-agent"),
        "{entry} comes from {src}"
    );
    assert!(
        !entry.ends_with(&format!("/{}", linkerd_cni_agent::REPAIR_CONTROLLER)),
        "the entrypoint runs the installer's command line: {entry}"
    );

    let env = fields(&c);
    let switch = linkerd_cni_agent::repair::cli::SWITCH;
    assert_eq!(switch, env_of("node_name"));
    assert_eq!(env.get(switch).map(String::as_str), Some("spec.nodeName"));
    assert_eq!(
        env.get(&env_of("controller_pod_name")).map(String::as_str),
        Some("metadata.name")
    );
    let known: Vec<String> = Args::command()
        .get_arguments()
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .collect();
    for name in env.keys() {
        assert!(
            !name.starts_with("LINKERD_CNI_REPAIR_CONTROLLER_") || known.contains(name),
            "the controller reads no {name}"
        );
    }

    let defaults =
        Args::try_parse_from(["x", "--node-name", "n", "--controller-pod-name", "p"]).unwrap();
    // Both probes are the installer's, neither on a port any pod can
    // reach: readiness the node chained, liveness the process answering
    // on its admin socket. No port is opened (metrics are off), and the
    // controller's admin address is unset, which beside the installer
    // opens none.
    assert_eq!(
        c["readinessProbe"]["exec"]["command"],
        json!([entry, "check"])
    );
    assert_eq!(
        c["livenessProbe"]["exec"]["command"],
        json!([entry, "check", "--live"])
    );
    assert!(c.get("ports").is_none(), "{c:#}");
    for id in ["admin_addr", "admin_ip"] {
        assert!(!env.contains_key(&env_of(id)), "{id}: {env:?}");
    }

    // The chain check reads the conf dir where the controller looks by
    // default (the installer's mount, writable); the lookup socket goes
    // to the plugin's state dir, where it looks by default.
    let mounts = c["volumeMounts"].as_array().unwrap();
    let mount = |name: &str| {
        mounts
            .iter()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("{name} not mounted"))
    };
    assert_eq!(
        mount("cni-net-dir")["mountPath"],
        defaults.cni_net_dir.display().to_string()
    );
    let state = mount("cni-state-dir");
    assert_eq!(state["mountPath"], defaults.state_dir.display().to_string());
    assert_ne!(state["readOnly"], true);
}

/// uid 0, for the lookup and admin sockets (root's, served by root), with
/// the one capability the installer needs (CHOWN, see capabilities.rs) and
/// no other.
#[test]
fn the_deployed_container_has_chown_alone() {
    let c = deployed_container();
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsUser"], 0, "{sc:#}");
    assert_eq!(sc["privileged"], false, "{sc:#}");
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(sc["capabilities"]["add"], json!(["CHOWN"]), "{sc:#}");
}

#[test]
fn the_upstream_charts_container_runs_what_the_image_holds() {
    for c in upstream_containers() {
        check_container(&c, "the linkerd2-cni chart");
    }
}

#[test]
fn the_cluster_role_allows_what_the_controller_does() {
    let role = deploy_docs()
        .into_iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "linkerd-cni")
        .expect("ClusterRole linkerd-cni");
    let allows = |group: &str, resource: &str, verb: &str| {
        role["rules"].as_array().unwrap().iter().any(|r| {
            let has = |k: &str, v: &str| r[k].as_array().is_some_and(|a| a.iter().any(|x| x == v));
            has("apiGroups", group) && has("resources", resource) && has("verbs", verb)
        })
    };
    for verb in ["list", "watch", "delete"] {
        assert!(allows("", "pods", verb), "pods {verb}");
    }
    assert!(allows("events.k8s.io", "events", "create"));
    // Events are always created, never patched: no more is needed.
    assert!(!allows("events.k8s.io", "events", "patch"));
}
