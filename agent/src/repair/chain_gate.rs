//! Whether this node's chain is healthy, read from the node's conf dir
//! through the host mount the controller shares with the installer.
//!
//! A pod deleted while the chain is broken comes back on the same node
//! without rules and fails the same way: deletions wait until the chain
//! library's one judgement of health (the one the plugin, the installer's
//! `check` and `linkerd-cni chain status` use), in the entry's mode, says
//! the runtime's active file holds linkerd-cni. This module is the only
//! user of the chain library in this crate, so that the library's home can
//! change in one place.

use std::path::Path;

use linkerd_cni_chain as chain;

/// The verdict for deletions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The linkerd-cni entry is last and up to date: repairs may proceed.
    Healthy,
    /// Repairs must wait; why, for people.
    Broken(String),
    /// The conf dir is not there (the upstream chart mounts nothing into
    /// this container): the chain cannot be judged, and repairs proceed as
    /// upstream's controller does them.
    Unchecked(String),
}

impl Verdict {
    /// Whether deletions may go ahead.
    pub fn allows_repair(&self) -> bool {
        !matches!(self, Verdict::Broken(_))
    }
}

/// Judges the chain in `conf_dir` against the installer's desired entry.
///
/// Leftover temp files of an interrupted repair do not count: they do not
/// change what the runtime loads, and the installer's next pass removes
/// them.
pub fn check(conf_dir: &Path) -> Verdict {
    match std::fs::metadata(conf_dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Verdict::Unchecked(format!("{} is not a directory", conf_dir.display()));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Verdict::Unchecked(format!(
                "{} does not exist (mount the host's CNI conf dir there to hold repairs while the chain is broken)",
                conf_dir.display()
            ));
        }
        Err(e) => return Verdict::Broken(format!("cannot read {}: {e}", conf_dir.display())),
    }
    let desired = match chain::load_entry(conf_dir) {
        Ok(Some(entry)) => entry,
        Ok(None) => {
            return Verdict::Broken(format!(
                "{} does not exist yet: the linkerd-cni installer has not configured this node",
                conf_dir.join(chain::ENTRY_FILE).display()
            ));
        }
        Err(e) => return Verdict::Broken(e.to_string()),
    };
    let mode = match chain::ModeChoice::of_entry(&desired) {
        Ok(m) => m,
        Err(e) => return Verdict::Broken(e.to_string()),
    };
    // Read-only: the budget bounds nothing here.
    let ctx = chain::Context::new(conf_dir, desired, mode, std::time::Duration::ZERO);
    match chain::health(&ctx) {
        Ok(h) if h.is_chained() => Verdict::Healthy,
        Ok(h) => Verdict::Broken(h.summary()),
        Err(e) => Verdict::Broken(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENTRY: &str = r#"{"name":"linkerd-cni","type":"linkerd-cni","kubernetes":{"kubeconfig":"/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"}}"#;

    fn conflist(plugins: &[&str]) -> String {
        format!(
            r#"{{"cniVersion":"0.3.1","name":"k8s","plugins":[{}]}}"#,
            plugins.join(",")
        )
    }

    #[test]
    fn verdicts() {
        let dir = testkit::TempDir::new("repair-gate").unwrap();
        let missing = dir.path().join("absent");
        assert!(matches!(check(&missing), Verdict::Unchecked(_)));
        assert!(check(&missing).allows_repair());

        // No entry file: the installer has not run here.
        assert!(matches!(check(dir.path()), Verdict::Broken(_)));

        std::fs::write(dir.path().join(chain::ENTRY_FILE), ENTRY).unwrap();
        let active = dir.path().join("10-ptp.conflist");
        std::fs::write(&active, conflist(&[r#"{"type":"ptp"}"#])).unwrap();
        let v = check(dir.path());
        assert!(
            matches!(&v, Verdict::Broken(why) if why.contains("missing")),
            "{v:?}"
        );
        assert!(!v.allows_repair());

        std::fs::write(&active, conflist(&[r#"{"type":"ptp"}"#, ENTRY])).unwrap();
        assert_eq!(check(dir.path()), Verdict::Healthy);
    }

    /// Owned mode: our entry lives in linkerd-cni's own file, not in the
    /// primary's, and the node is chained.
    #[test]
    fn owned_mode_verdicts() {
        let dir = testkit::TempDir::new("repair-gate-owned").unwrap();
        let entry = ENTRY.replacen('{', r#"{"chain_mode":"owned","#, 1);
        std::fs::write(dir.path().join(chain::ENTRY_FILE), &entry).unwrap();
        std::fs::write(
            dir.path().join("10-ptp.conflist"),
            conflist(&[r#"{"type":"ptp"}"#]),
        )
        .unwrap();
        // Not chained yet: no file of ours.
        assert!(!check(dir.path()).allows_repair());
        let desired = chain::Entry::parse(entry.as_bytes(), "test").unwrap();
        let mode = chain::ModeChoice::of_entry(&desired).unwrap();
        let ctx = chain::Context::new(
            dir.path(),
            desired,
            mode,
            std::time::Duration::from_secs(30),
        );
        chain::keep(&ctx, &mut chain::NoLimit).unwrap();
        assert!(
            dir.path().join("10-ptp-linkerd-cni.conflist").exists(),
            "the keeper wrote our own file"
        );
        // The primary's file holds no entry of ours, and that is healthy.
        let primary = std::fs::read_to_string(dir.path().join("10-ptp.conflist")).unwrap();
        assert!(!primary.contains("linkerd-cni"), "{primary}");
        assert_eq!(check(dir.path()), Verdict::Healthy);
    }
}
