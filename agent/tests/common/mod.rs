//! A throwaway "node" for running the real installer binary: a temp dir
//! holding the host's conf and bin dirs under a mount prefix, the image's
//! bin dir, and a service-account dir laid out as the kubelet does
//! (`..data` symlink to a timestamped dir). Everything is removed on drop,
//! and installer processes are killed on drop, also when a test fails.
//!
//! The chain checks here are independent of `linkerd_cni_chain`, so the
//! tests do not trust the library under test to judge itself.

#![allow(dead_code)]

/// How the installer's temp files start (spelled here, not taken from the
/// library: see above).
const OUR_TEMP_PREFIX: &str = ".linkerd-cni-tmp-";

/// No temp file of ours in `dir`: the repair there has settled. A repair
/// is in place (what the runtime loads) before its fsync, and the version
/// it displaced is removed only after that, so a repaired file can still
/// have our temp file beside it for a moment.
pub fn settled(dir: &std::path::Path) -> bool {
    !testkit::names::file_names(dir)
        .iter()
        .any(|n| n.starts_with(OUR_TEMP_PREFIX))
}

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::symlink;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use testkit::installer::ChartEnv;
pub use testkit::installer::InstallerProcess as Installer;
pub use testkit::wait_until;

/// How long an uninstall keeps the plugin binary after taking the entry
/// out of the configs (the installer's `UNINSTALL_DRAIN`): pod starts that
/// loaded the old chain still run it.
pub const UNINSTALL_DRAIN: Duration = Duration::from_secs(5);

/// Scheduling slack on top of a bound the installer promises: CI machines
/// are small and shared, and a bound is about the design, not about speed.
/// A loopback port nothing listens on (tcpmux, never run): the API server
/// these tests do not run.
pub const NO_API_PORT: u16 = 1;

pub const GRACE: Duration = Duration::from_millis(750);

pub const HOST_CONF_DIR: &str = "/etc/cni/net.d";
pub const KUBECONFIG_NAME: &str = "ZZZ-linkerd-cni-kubeconfig";
pub const ENTRY_FILE: &str = "ZZZ-linkerd-cni-entry";

/// A Calico conflist as Calico's installer writes it; `mtu` doubles as a
/// version number in the storm tests.
pub fn calico(version: u64) -> Value {
    json!({
      "name": "k8s-pod-network",
      "cniVersion": "0.3.1",
      "plugins": [
        {
          "type": "calico",
          "log_level": "info",
          "log_file_path": "/var/log/calico/cni/cni.log",
          "datastore_type": "kubernetes",
          "nodename": "node-1",
          "mtu": 1000 + version,
          "ipam": { "type": "calico-ipam" },
          "policy": { "type": "k8s" },
          "kubernetes": { "kubeconfig": "/etc/cni/net.d/calico-kubeconfig" }
        },
        { "type": "portmap", "snat": true, "capabilities": { "portMappings": true } },
        { "type": "bandwidth", "capabilities": { "bandwidth": true } }
      ]
    })
}

pub fn calico_text(version: u64) -> String {
    let mut s = serde_json::to_string_pretty(&calico(version)).unwrap();
    s.push('\n');
    s
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

pub struct Node {
    _dir: testkit::TempDir,
    pub root: PathBuf,
    pub prefix: PathBuf,
    pub conf_dir: PathBuf,
    pub bin_dir: PathBuf,
    pub image_bin: PathBuf,
    pub sa_dir: PathBuf,
    sa_generation: AtomicU32,
}

impl Node {
    pub fn new(tag: &str) -> Node {
        Node::in_dir(testkit::TempDir::new(&format!("inst-{tag}")).expect("temp dir"))
    }

    /// A node on a memory file system where there is one (see
    /// [`testkit::TempDir::in_memory`]).
    pub fn in_memory(tag: &str) -> Node {
        Node::in_dir(testkit::TempDir::in_memory(&format!("inst-{tag}")).expect("temp dir"))
    }

    fn in_dir(dir: testkit::TempDir) -> Node {
        let root = dir.path().to_path_buf();
        let prefix = root.join("host");
        let conf_dir = prefix.join("etc/cni/net.d");
        let bin_dir = prefix.join("opt/cni/bin");
        let image_bin = root.join("image/opt/cni/bin");
        let sa_dir = root.join("serviceaccount");
        for d in [&conf_dir, &bin_dir, &image_bin, &sa_dir] {
            fs::create_dir_all(d).unwrap();
        }
        // Any bytes do: the installer copies, it never runs the plugin.
        fs::write(
            image_bin.join("linkerd-cni"),
            format!(
                "#!/bin/sh\n# fake linkerd-cni for {}\nexit 0\n",
                root.display()
            ),
        )
        .unwrap();
        let node = Node {
            _dir: dir,
            root,
            prefix,
            conf_dir,
            bin_dir,
            image_bin,
            sa_dir,
            sa_generation: AtomicU32::new(0),
        };
        node.rotate_service_account("token-1", "CA-1");
        node
    }

    /// The chart's environment, with the manifest's entry template.
    /// The chart's variables, with an API server address on loopback where
    /// nothing listens (these tests run no API server: a call is refused at
    /// once) and no plugin ServiceAccount, so the kubeconfig holds this
    /// pod's own token as upstream's does (minting is the conformance
    /// tests', against a fake API server).
    pub fn env(&self) -> Vec<(String, String)> {
        let mut vars = ChartEnv {
            mount_prefix: self.prefix.clone(),
            image_bin: self.image_bin.clone(),
            service_account: self.sa_dir.clone(),
            dest_conf_dir: HOST_CONF_DIR.into(),
            dest_bin_dir: "/opt/cni/bin".into(),
            api_host: "127.0.0.1".into(),
            api_port: NO_API_PORT,
            template: testkit::chart::template().into(),
        }
        .vars();
        vars.push(("LINKERD_CNI_PLUGIN_TOKEN".into(), "own".into()));
        vars
    }

    fn command(&self, args: &[&str], extra: &[(&str, &str)]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_linkerd-cni-agent"));
        c.args(args).env_clear().envs(self.env());
        for (k, v) in extra {
            c.env(k, v);
        }
        c
    }

    /// Starts the installer's loop; stderr goes to a log file.
    pub fn start(&self, extra: &[(&str, &str)]) -> Installer {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let log = self.root.join(format!("installer-{n}.log"));
        Installer::spawn(self.command(&[], extra), log)
    }

    /// Runs a subcommand to completion.
    pub fn run(&self, args: &[&str], extra: &[(&str, &str)]) -> Output {
        self.command(args, extra)
            .output()
            .expect("run the installer")
    }

    /// [`Node::run`], killed if still running after `limit`: `None` then.
    /// For inputs that must not make it block.
    pub fn run_within(&self, args: &[&str], limit: Duration) -> Option<Output> {
        let mut c = self.command(args, &[]);
        testkit::output_within(c.stdin(std::process::Stdio::null()), limit)
    }

    pub fn conf(&self, name: &str) -> PathBuf {
        self.conf_dir.join(name)
    }

    /// Writes a conf-dir file as most agents do: temp file, then rename.
    pub fn write_by_rename(&self, name: &str, content: &str) {
        let tmp = self.root.join(format!(".{name}.tmp"));
        fs::write(&tmp, content).unwrap();
        // Same filesystem (both under root): the rename is atomic.
        fs::rename(&tmp, self.conf(name)).unwrap();
    }

    /// Writes a conf-dir file in place, as some agents do.
    pub fn write_in_place(&self, name: &str, content: &str) {
        let mut f = File::create(self.conf(name)).unwrap();
        f.write_all(content.as_bytes()).unwrap();
    }

    /// Rotates the service-account files the way the kubelet's atomic
    /// writer does: a new timestamped dir, a `..data_tmp` symlink to it,
    /// renamed over `..data`, then the old dir removed. `token` and `ca.crt`
    /// are symlinks through `..data`.
    pub fn rotate_service_account(&self, token: &str, ca: &str) {
        let g = self.sa_generation.fetch_add(1, Ordering::Relaxed);
        let ts = format!("..2026_01_01_00_00_{g:02}.{}", 100 + g);
        let dir = self.sa_dir.join(&ts);
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("token"), token).unwrap();
        fs::write(dir.join("ca.crt"), ca).unwrap();
        fs::write(dir.join("namespace"), "linkerd-cni").unwrap();
        let old = fs::read_link(self.sa_dir.join("..data")).ok();
        let tmp = self.sa_dir.join("..data_tmp");
        symlink(&ts, &tmp).unwrap();
        fs::rename(&tmp, self.sa_dir.join("..data")).unwrap();
        for f in ["token", "ca.crt", "namespace"] {
            let link = self.sa_dir.join(f);
            if fs::symlink_metadata(&link).is_err() {
                symlink(format!("..data/{f}"), &link).unwrap();
            }
        }
        if let Some(old) = old {
            fs::remove_dir_all(self.sa_dir.join(old)).unwrap();
        }
    }

    /// A conf-dir file parsed; None while absent or half-written.
    pub fn read_conflist(&self, name: &str) -> Option<Value> {
        let text = fs::read_to_string(self.conf(name)).ok()?;
        serde_json::from_str(&text).ok()
    }

    pub fn kubeconfig(&self) -> Option<String> {
        fs::read_to_string(self.conf(KUBECONFIG_NAME)).ok()
    }

    /// The active config: the first `*.conf`/`*.conflist`/`*.json` file in
    /// bytewise name order, as containerd picks it.
    pub fn active(&self) -> Option<PathBuf> {
        let mut names: Vec<String> = fs::read_dir(&self.conf_dir)
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| {
                [".conf", ".conflist", ".json"]
                    .iter()
                    .any(|x| n.ends_with(x))
            })
            .collect();
        names.sort();
        names.first().map(|n| self.conf(n))
    }

    /// Ok when the active conflist ends with exactly one linkerd-cni entry,
    /// rendered from the template for this node. Returns the conflist.
    pub fn healthy(&self) -> Result<Value, String> {
        let active = self.active().ok_or("no active config")?;
        let text = fs::read_to_string(&active).map_err(|e| e.to_string())?;
        let v: Value = serde_json::from_str(&text).map_err(|e| format!("{e}: {text:?}"))?;
        let plugins = v["plugins"].as_array().ok_or("no plugins array")?;
        let ours: Vec<usize> = plugins
            .iter()
            .enumerate()
            .filter(|(_, p)| p["type"] == "linkerd-cni")
            .map(|(i, _)| i)
            .collect();
        if ours.len() != 1 || ours[0] + 1 != plugins.len() {
            return Err(format!(
                "linkerd-cni entries at {ours:?} of {}",
                plugins.len()
            ));
        }
        let last = &plugins[plugins.len() - 1];
        let want_kc = format!("{HOST_CONF_DIR}/{KUBECONFIG_NAME}");
        if last["kubernetes"]["kubeconfig"] != want_kc.as_str()
            || last["cni_conf_dir"] != HOST_CONF_DIR
            || last["linkerd"]["proxy-uid"] != 2102
        {
            return Err(format!("entry not rendered from the template: {last}"));
        }
        Ok(v)
    }

    /// Until the node is healthy and the repair that made it so has
    /// [`settled`].
    pub fn wait_healthy(&self, within: Duration) -> Result<Value, String> {
        let deadline = Instant::now() + within;
        loop {
            match self.healthy() {
                Ok(v) if settled(&self.conf_dir) => return Ok(v),
                Ok(_) if Instant::now() >= deadline => {
                    return Err(format!(
                        "healthy, but temp files still in {} after {within:?}: {:?}",
                        self.conf_dir.display(),
                        testkit::names::file_names(&self.conf_dir)
                    ));
                }
                Ok(_) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!("not healthy within {within:?}: {e}"));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }
}

/// The conflist minus linkerd-cni entries: what the primary owns.
pub fn primary_part(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(p) = v["plugins"].as_array_mut() {
        p.retain(|p| p["type"] != "linkerd-cni");
    }
    v
}
