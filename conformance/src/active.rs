//! Reading a node's active network config the way a runtime would, and
//! judging linkerd-cni's place in it, independently of the plugin's chain
//! library: the self-heal tests must not let the code under test judge
//! itself.
//!
//! "Healthy" here is what the CNI spec and a runtime's loader (libcni) make
//! of the conf dir, plus linkerd-cni's own rule: the active file is a
//! `.conflist` whose plugins end with exactly one linkerd-cni entry, equal
//! to the desired one, and whose other plugins and top-level keys are the
//! primary's, untouched (key order and number spelling included).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::node::Node;
use crate::results::exact;

/// The active config file as read at one moment.
#[derive(Debug, Clone)]
pub struct ActiveConf {
    pub path: PathBuf,
    pub text: String,
    pub json: Value,
}

impl ActiveConf {
    /// Reads `path`; Err while it is unreadable or not JSON (a writer may be
    /// half-way through a truncate-and-write).
    pub fn read(path: &Path) -> Result<ActiveConf, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let json = serde_json::from_str(&text)
            .map_err(|e| format!("{} is not JSON ({e}): {text:?}", path.display()))?;
        Ok(ActiveConf {
            path: path.to_path_buf(),
            text,
            json,
        })
    }

    pub fn file_name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    pub fn is_list(&self) -> bool {
        self.file_name().ends_with(".conflist")
    }

    /// The plugins a runtime runs, in order: a list's `plugins`, or the
    /// single plugin of a `.conf`.
    pub fn plugins(&self) -> Vec<&Value> {
        if self.is_list() {
            self.json["plugins"]
                .as_array()
                .map(|p| p.iter().collect())
                .unwrap_or_default()
        } else {
            vec![&self.json]
        }
    }

    /// Each plugin's `type`.
    pub fn types(&self) -> Vec<String> {
        self.plugins()
            .iter()
            .map(|p| p["type"].as_str().unwrap_or("?").to_string())
            .collect()
    }

    /// Indices of linkerd-cni entries.
    pub fn linkerd_positions(&self) -> Vec<usize> {
        self.plugins()
            .iter()
            .enumerate()
            .filter(|(_, p)| p["type"] == "linkerd-cni")
            .map(|(i, _)| i)
            .collect()
    }

    /// The config minus every linkerd-cni entry: what the primary owns.
    pub fn primary_part(&self) -> Value {
        let mut v = self.json.clone();
        if let Some(p) = v.get_mut("plugins").and_then(Value::as_array_mut) {
            p.retain(|p| p["type"] != "linkerd-cni");
        }
        v
    }

    /// Ok when the chain ends with exactly one linkerd-cni entry equal to
    /// `desired`, in a `.conflist`.
    pub fn healthy(&self, desired: &Value) -> Result<(), String> {
        if !self.is_list() {
            return Err(format!(
                "{} is not a .conflist: it cannot hold a chain",
                self.path.display()
            ));
        }
        let plugins = self.plugins();
        let ours = self.linkerd_positions();
        if ours.len() != 1 || ours[0] + 1 != plugins.len() {
            return Err(format!(
                "linkerd-cni entries at {ours:?} of {} plugins {:?} in {}",
                plugins.len(),
                self.types(),
                self.path.display()
            ));
        }
        if plugins.len() < 2 {
            return Err(format!(
                "{} holds linkerd-cni alone: no primary",
                self.path.display()
            ));
        }
        // In owned mode our entry also carries the marker naming the
        // primary's file it copies: that file must exist.
        let mut last = plugins[plugins.len() - 1].clone();
        if let Some(marker) = last
            .as_object_mut()
            .and_then(|m| m.remove(crate::modes::MARKER_KEY))
        {
            let primary = marker["file"].as_str().unwrap_or_default();
            let dir = self.path.parent().unwrap_or(Path::new("."));
            if primary.is_empty() || !dir.join(primary).exists() {
                return Err(format!(
                    "{} copies {primary:?}, which is not in the conf dir",
                    self.path.display()
                ));
            }
        }
        let last = &last;
        if last != desired {
            return Err(format!(
                "the linkerd-cni entry is not the desired one:\n  found   {last}\n  desired {desired}"
            ));
        }
        Ok(())
    }

    /// [`ActiveConf::healthy`], and the primary's part is exactly
    /// `primary` (key order and number spelling included).
    pub fn healthy_with(&self, desired: &Value, primary: &Value) -> Result<(), String> {
        self.healthy(desired)?;
        let have = exact(&self.primary_part());
        let want = exact(primary);
        if have != want {
            return Err(format!(
                "the primary's part changed:\n  found {have}\n  want  {want}"
            ));
        }
        Ok(())
    }
}

impl Node {
    /// Whether the active config ends with exactly one `linkerd-cni`: a
    /// quick oracle for loops that wait for a heal (the benchmarks).
    pub fn linkerd_last(&self) -> bool {
        self.read_active().is_ok_and(|a| {
            a.is_list() && a.linkerd_positions() == [a.plugins().len().saturating_sub(1)]
        })
    }

    /// The active config ([`Node::active_conf`]) as read now.
    pub fn read_active(&self) -> Result<ActiveConf, String> {
        let path = self
            .active_conf()
            .ok_or_else(|| format!("no config file in {}", self.conf_dir().display()))?;
        ActiveConf::read(&path)
    }

    /// Waits, at most `within`, until the active config is healthy with
    /// `desired` last and `primary` as the rest; the last reason otherwise.
    pub fn wait_healthy(
        &self,
        desired: &Value,
        primary: &Value,
        within: Duration,
    ) -> Result<ActiveConf, String> {
        let deadline = Instant::now() + within;
        loop {
            let res = self
                .read_active()
                .and_then(|a| a.healthy_with(desired, primary).map(|()| a));
            match res {
                Ok(a) => return Ok(a),
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!("not healthy within {within:?}: {e}"));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// The names in the conf dir, sorted, but the lock file every repair
    /// leaves (tests of the lock and of uninstall look for it by name): to
    /// see that nothing else (a temp file, a second config) was left there.
    pub fn conf_dir_names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.conf_dir())
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n != testkit::names::LOCK_FILE)
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conf(name: &str, json: Value) -> ActiveConf {
        ActiveConf {
            path: PathBuf::from("/x").join(name),
            text: json.to_string(),
            json,
        }
    }

    #[test]
    fn judges_position_count_content_and_primary() {
        let ours = json!({"type": "linkerd-cni", "a": 1});
        let ptp = json!({"type": "ptp", "mtu": 1500});
        let list =
            |plugins: Vec<Value>| json!({"cniVersion": "1.0.0", "name": "n", "plugins": plugins});
        let primary = list(vec![ptp.clone()]);
        let ok = conf("a.conflist", list(vec![ptp.clone(), ours.clone()]));
        assert_eq!(ok.healthy_with(&ours, &primary), Ok(()));
        assert_eq!(ok.types(), ["ptp", "linkerd-cni"]);

        let first = conf("a.conflist", list(vec![ours.clone(), ptp.clone()]));
        assert!(first.healthy(&ours).is_err());
        let twice = conf(
            "a.conflist",
            list(vec![ours.clone(), ptp.clone(), ours.clone()]),
        );
        assert!(twice.healthy(&ours).is_err());
        let stale = conf(
            "a.conflist",
            list(vec![ptp.clone(), json!({"type": "linkerd-cni", "a": 2})]),
        );
        assert!(stale.healthy(&ours).is_err());
        let alone = conf("a.conflist", list(vec![ours.clone()]));
        assert!(alone.healthy(&ours).is_err());
        let single = conf("a.conf", json!({"type": "ptp", "name": "n"}));
        assert!(single.healthy(&ours).is_err());
        assert_eq!(single.types(), ["ptp"]);

        // Same values, other key order: the primary's text was not kept.
        let reordered = conf(
            "a.conflist",
            json!({"name": "n", "cniVersion": "1.0.0", "plugins": [ptp, ours.clone()]}),
        );
        assert!(reordered.healthy(&ours).is_ok());
        assert!(reordered.healthy_with(&ours, &primary).is_err());
    }
}
