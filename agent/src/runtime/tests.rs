//! [`select`] and [`cached_double_attachments`] on in-memory hosts, one case per
//! table row.

use super::*;

/// A host of `(path, content)` files; `Err` content: unreadable.
struct Fake {
    files: BTreeMap<PathBuf, Result<String, String>>,
}

fn host(files: &[(&str, Result<&str, &str>)]) -> Fake {
    Fake {
        files: files
            .iter()
            .map(|(p, c)| {
                (
                    PathBuf::from(p),
                    c.map(str::to_string).map_err(str::to_string),
                )
            })
            .collect(),
    }
}

impl HostFiles for Fake {
    fn read(&self, path: &Path) -> Result<Option<String>, String> {
        self.files.get(path).cloned().transpose()
    }

    fn list(&self, dir: &Path) -> Result<Option<Vec<String>>, String> {
        let names: BTreeSet<String> = self
            .files
            .keys()
            .filter_map(|p| p.strip_prefix(dir).ok())
            .filter_map(|rest| rest.components().next())
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        Ok((!names.is_empty()).then(|| names.into_iter().collect()))
    }
}

const MAIN: &str = "/etc/containerd/config.toml";
const K3S: &str = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml";
const RKE2: &str = "/var/lib/rancher/rke2/agent/etc/containerd/config.toml";

fn v1x(n: &str) -> String {
    format!(
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".cni]\n  bin_dir = \"/opt/cni/bin\"\n  max_conf_num = {n}\n"
    )
}

fn v2x(n: &str) -> String {
    format!("version = 3\n[plugins.'io.containerd.cri.v1.runtime'.cni]\nmax_conf_num = {n}\n")
}

fn mode(files: &[(&str, Result<&str, &str>)]) -> Selection {
    select(&host(files))
}

#[track_caller]
fn owned(files: &[(&str, Result<&str, &str>)], why: &str) {
    let s = mode(files);
    assert_eq!(s.mode, ChainMode::Owned, "{s:?}");
    assert!(s.reason.contains(why), "{s:?}");
}

#[track_caller]
fn inline(files: &[(&str, Result<&str, &str>)], why: &str) {
    let s = mode(files);
    assert_eq!(s.mode, ChainMode::Inline, "{s:?}");
    assert!(s.reason.contains(why), "{s:?}");
}

#[test]
fn containerd_max_conf_num_one_is_owned() {
    owned(
        &[(MAIN, Ok(&v1x("1")))],
        "max_conf_num is 1 (in /etc/containerd/config.toml",
    );
    owned(&[(MAIN, Ok(&v2x("1")))], "max_conf_num is 1");
    // Version-1 configs.
    owned(
        &[(MAIN, Ok("[plugins.cri.cni]\nmax_conf_num = 1\n"))],
        "max_conf_num is 1",
    );
}

#[test]
fn containerd_max_conf_num_unset_is_owned() {
    owned(
        &[(
            MAIN,
            Ok(
                "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".cni]\nconf_dir = \"/etc/cni/net.d\"\n",
            ),
        )],
        "max_conf_num is unset (default 1",
    );
    // An empty file is containerd's defaults.
    owned(&[(MAIN, Ok(""))], "unset");
    owned(
        &[(
            K3S,
            Ok("[plugins.'io.containerd.grpc.v1.cri'.containerd]\nsnapshotter = \"overlayfs\"\n"),
        )],
        K3S,
    );
    owned(&[(RKE2, Ok(""))], RKE2);
}

#[test]
fn containerd_max_conf_num_zero_or_two_is_inline() {
    inline(
        &[(MAIN, Ok(&v1x("0")))],
        "max_conf_num is 0 (in /etc/containerd/config.toml): it loads all",
    );
    inline(&[(MAIN, Ok(&v2x("2")))], "max_conf_num is 2");
    inline(&[(K3S, Ok(&v1x("0")))], K3S);
    inline(&[(MAIN, Ok(&v1x("-1")))], "unknown number");
    // Inline dotted keys, not tables.
    inline(
        &[(
            MAIN,
            Ok("plugins.\"io.containerd.grpc.v1.cri\".cni.max_conf_num = 0\n"),
        )],
        "max_conf_num is 0",
    );
    // One runtime proving it is not enough when another path says not.
    inline(&[(MAIN, Ok(&v1x("1"))), (RKE2, Ok(&v1x("3")))], RKE2);
}

#[test]
fn containerd_imports_later_override_earlier() {
    let main = "imports = [\"/etc/containerd/conf.d/*.toml\"]\n".to_string() + &v1x("1");
    // A drop-in sets 0: it overrides the main file.
    inline(
        &[
            (MAIN, Ok(&main)),
            ("/etc/containerd/conf.d/10-cni.toml", Ok(&v1x("0"))),
            ("/etc/containerd/conf.d/README", Ok("not toml {")),
        ],
        "max_conf_num is 0 (in /etc/containerd/conf.d/10-cni.toml)",
    );
    // ...and a later drop-in puts it back to 1.
    owned(
        &[
            (MAIN, Ok(&main)),
            ("/etc/containerd/conf.d/10-cni.toml", Ok(&v1x("0"))),
            ("/etc/containerd/conf.d/20-cni.toml", Ok(&v1x("1"))),
        ],
        "max_conf_num is 1 (in /etc/containerd/conf.d/20-cni.toml; read /etc/containerd/config.toml and 2 imported files)",
    );
    // An import overrides the main file.
    inline(
        &[
            (
                MAIN,
                Ok(&("imports = [\"extra.toml\"]\n".to_string() + &v1x("1"))),
            ),
            ("/etc/containerd/extra.toml", Ok(&v2x("0"))),
        ],
        "max_conf_num is 0 (in /etc/containerd/extra.toml)",
    );
    // Nested imports, relative to the importing file; a cycle is loaded once.
    inline(
        &[
            (MAIN, Ok("imports = [\"conf.d/a.toml\"]\n")),
            (
                "/etc/containerd/conf.d/a.toml",
                Ok("imports = [\"../more/[b-c].toml\", \"/etc/containerd/config.toml\"]\n"),
            ),
            ("/etc/containerd/more/b.toml", Ok("")),
            ("/etc/containerd/more/c.toml", Ok(&v1x("2"))),
        ],
        "max_conf_num is 2 (in /etc/containerd/more/c.toml)",
    );
    // A glob matching nothing is no file.
    owned(
        &[(MAIN, Ok("imports = [\"/etc/containerd/conf.d/*.toml\"]\n"))],
        "unset",
    );
}

#[test]
fn crio_default_network_set_is_inline_unset_is_owned() {
    owned(
        &[(
            "/etc/crio/crio.conf",
            Ok("[crio.network]\nnetwork_dir = \"/etc/cni/net.d/\"\n"),
        )],
        "cni_default_network is unset (read /etc/crio/crio.conf)",
    );
    inline(
        &[(
            "/etc/crio/crio.conf",
            Ok("[crio.network]\ncni_default_network = \"k8s-pod-network\"\n"),
        )],
        "cni_default_network is \"k8s-pod-network\" (in /etc/crio/crio.conf)",
    );
    // A drop-in pins it; a later one (lexical order) clears it again.
    inline(
        &[
            ("/etc/crio/crio.conf", Ok("")),
            (
                "/etc/crio/crio.conf.d/10-net.conf",
                Ok("[crio.network]\ncni_default_network = \"cilium\"\n"),
            ),
            (
                "/etc/crio/crio.conf.d/05-other.toml",
                Ok("[crio.network]\ncni_default_network = \"ignored\"\n"),
            ),
        ],
        "\"cilium\" (in /etc/crio/crio.conf.d/10-net.conf)",
    );
    owned(
        &[
            (
                "/etc/crio/crio.conf.d/10-net.conf",
                Ok("[crio.network]\ncni_default_network = \"cilium\"\n"),
            ),
            (
                "/etc/crio/crio.conf.d/20-net.conf",
                Ok("[crio.network]\ncni_default_network = \"\"\n"),
            ),
        ],
        "unset (read 2 files in /etc/crio)",
    );
}

#[test]
fn unreadable_or_absent_settings_are_inline_with_the_reason() {
    inline(&[], "no containerd or CRI-O settings found");
    inline(
        &[(MAIN, Err("permission denied"))],
        "cannot read /etc/containerd/config.toml: permission denied",
    );
    inline(
        &[(MAIN, Ok("[plugins\nmax_conf_num = 1"))],
        "cannot parse /etc/containerd/config.toml (line 1)",
    );
    inline(
        &[(MAIN, Ok("imports = [\"/opt/k8s/containerd.toml\"]\n"))],
        "imports /opt/k8s/containerd.toml, which does not exist here",
    );
    inline(
        &[
            (MAIN, Ok("imports = [\"/etc/containerd/conf.d/*.toml\"]\n")),
            ("/etc/containerd/conf.d/x.toml", Err("I/O error")),
        ],
        "cannot read /etc/containerd/conf.d/x.toml",
    );
    inline(&[(MAIN, Ok(&v1x("\"1\"")))], "is a string, not an integer");
    inline(&[(MAIN, Ok("imports = \"/etc/x.toml\"\n"))], "not a list");
    inline(
        &[("/etc/crio/crio.conf", Ok("[crio.network\n"))],
        "cannot parse /etc/crio/crio.conf",
    );
    inline(
        &[(
            "/etc/crio/crio.conf",
            Ok("[crio.network]\ncni_default_network = 1\n"),
        )],
        "not a string",
    );
    // An unreadable CRI-O file spoils a containerd proof.
    inline(
        &[
            (MAIN, Ok(&v1x("1"))),
            ("/etc/crio/crio.conf", Err("permission denied")),
        ],
        "cannot read /etc/crio/crio.conf",
    );
}

#[test]
fn settings_dirs_are_those_holding_what_select_reads() {
    let dirs = |files: &[(&str, Result<&str, &str>)]| {
        settings_dirs(&host(files))
            .into_iter()
            .map(|(d, names)| format!("{}: {}", d.display(), names.join(" ")))
            .collect::<Vec<_>>()
    };
    // Nothing there: nothing to watch (no warning about absent paths).
    assert!(dirs(&[]).is_empty());
    // containerd (k3s's path), its imports by glob, relative and absolute,
    // nested; a directory an import names but that does not exist is left
    // to the resync.
    assert_eq!(
        dirs(&[
            (
                "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
                Ok("imports = [\"conf.d/*.toml\", \"/etc/extra/one.toml\", \"/absent/x.toml\"]\n"),
            ),
            (
                "/var/lib/rancher/k3s/agent/etc/containerd/conf.d/10-a.toml",
                Ok("imports = [\"/etc/nested/n.toml\"]\n"),
            ),
            ("/etc/extra/one.toml", Ok("")),
            ("/etc/nested/n.toml", Ok("")),
        ]),
        [
            "/var/lib/rancher/k3s/agent/etc/containerd: config.toml",
            "/var/lib/rancher/k3s/agent/etc/containerd/conf.d: *.toml",
            "/etc/extra: one.toml",
            "/etc/nested: n.toml",
        ]
    );
    // A file that does not parse still has its directory watched; CRI-O's
    // main file and drop-ins.
    assert_eq!(
        dirs(&[
            ("/etc/containerd/config.toml", Ok("[plugins\n")),
            ("/etc/crio/crio.conf", Ok("")),
            ("/etc/crio/crio.conf.d/10-a.conf", Ok("")),
        ]),
        [
            "/etc/containerd: config.toml",
            "/etc/crio: crio.conf crio.conf.d",
            "/etc/crio/crio.conf.d: *.conf",
        ]
    );
}

#[test]
fn go_style_name_patterns() {
    for (p, n, want) in [
        ("*.toml", "a.toml", Some(true)),
        ("*.toml", "a.conf", Some(false)),
        ("?-x", "1-x", Some(true)),
        ("[0-9]*", "10-a", Some(true)),
        ("[^0-9]*", "10-a", Some(false)),
        ("\\*", "*", Some(true)),
        ("a[", "a", None),
        ("*", "", Some(true)),
        ("[a-c]x", "bx", Some(true)),
        ("[z-a]", "b", Some(false)),
        ("[^z-a]", "b", Some(true)),
        ("[^]", "a", None),
        ("a\\", "a", None),
        ("[.-]?", "-x", Some(true)),
        ("a.b", "axb", Some(false)),
        ("[a&&b]", "&", Some(true)),
    ] {
        assert_eq!(name_matches(p, n), want, "{p} vs {n}");
    }
}

fn cached(id: &str, net: &str, ifname: &str) -> (String, String) {
    (
        format!("{net}-{id}-{ifname}"),
        serde_json::json!({
            "kind": "cniCacheV1",
            "containerId": id,
            "networkName": net,
            "ifName": ifname,
            "result": {"cniVersion": "1.0.0"}
        })
        .to_string(),
    )
}

#[test]
fn two_attachments_of_one_network_in_one_sandbox() {
    let entries = [
        cached("abc", "k8s-pod-network", "eth0"),
        cached("abc", "k8s-pod-network", "eth1"),
        cached("def", "k8s-pod-network", "eth0"),
        // Two networks in one sandbox (Multus-style): not the same one twice.
        cached("ghi", "k8s-pod-network", "eth0"),
        cached("ghi", "other", "net1"),
        ("garbage".to_string(), "{not json".to_string()),
    ];
    let paths: Vec<(String, &str)> = entries
        .iter()
        .map(|(name, text)| (format!("{RESULTS_DIR}/{name}"), text.as_str()))
        .collect();
    let files: Vec<(&str, Result<&str, &str>)> = paths
        .iter()
        .map(|(p, text)| (p.as_str(), Ok(*text)))
        .collect();
    let found = cached_double_attachments(&host(&files)).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains(
            "sandbox abc is attached to network \"k8s-pod-network\" 2 times (eth0, eth1)"
        ),
        "{found:?}"
    );
    let h = host(&[
        ("/var/lib/cni/results/a", Ok(&entries[0].1)),
        ("/var/lib/cni/results/b", Ok(&entries[1].1)),
    ]);
    assert_eq!(cached_double_attachments(&h).map(|v| v.len()), Some(1));
    assert_eq!(cached_double_attachments(&host(&[])), None);
}
