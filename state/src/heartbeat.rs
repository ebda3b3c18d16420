//! The installer's heartbeat: how the plugin tells "my credentials were
//! rejected, and an installer is alive on this node to rewrite them" (ask
//! the runtime to retry the pod) from "they were rejected and nobody will
//! fix them" (pass the pod through, as when the kubeconfig is gone). With
//! `kubernetes.agent-only` (no credential on the node) it tells the plugin
//! the same of the node agent: one is expected while the heartbeat is live,
//! so a pod no agent answered for is sent back rather than passed through.
//!
//! After every pass that left the kubeconfig current, the installer
//! replaces [`HEARTBEAT_FILE`] in the plugin's state dir (its config's
//! `state_dir`, [`DEFAULT_STATE_DIR`]), never in the conf dir: a write there
//! would make the runtime reload its config, and an idle installer writes
//! nothing into the conf dir. The file holds the host's boot id, the time of
//! the beat on the host's boot-time clock (so that wall-clock steps neither
//! age nor refresh it) and the installer's resync period.
//!
//! The plugin takes the installer for gone when the file is absent or
//! unreadable, from another boot, or older than the limit: its
//! `installer_gone_after_seconds` when set, else [`GONE_AFTER_RESYNCS`]
//! resync periods plus [`GONE_AFTER_SLACK`] (60 s with the default 10 s
//! period): a pass can take seconds, and a rolling update leaves a gap
//! between the old installer's last beat and the new one's first.
//!
//! The file steers what a pod gets, so it is believed only when it is
//! root's own ([`crate::statefile`]: a regular file, not a link, owned by
//! root and writable by nobody else) and every number in it is within
//! bounds (a resync period in (0, [`MAX_RESYNC`]], times not ahead of this
//! boot's clock). Anything else is no heartbeat: the installer is taken for
//! gone, and the plugin logs why.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use linkerd_cni_chain::ChainError;
use nix::time::{ClockId, clock_gettime};
use serde_json::{Map, Value};

use crate::record::{self, ReadError, Record};

/// The plugin's default `state_dir`, where the heartbeat lives.
pub const DEFAULT_STATE_DIR: &str = "/run/linkerd-cni";
/// The plugin's state dir as a plugin config (or the installer's entry)
/// names it: its `state_dir` when that is an absolute path outside the
/// config's `cni_conf_dir` (`conf_dir` when it names none), else
/// [`DEFAULT_STATE_DIR`] and why. The plugin writes there on every ADD (its
/// counters, its repair history): inside the conf dir each write would make
/// the runtime reload its network config. The plugin and the installer
/// both ask here, so that they always meet in the same dir.
pub fn state_dir_of(
    config: &serde_json::Map<String, Value>,
    conf_dir: &Path,
) -> (PathBuf, Option<String>) {
    let default = || PathBuf::from(DEFAULT_STATE_DIR);
    let dir = match config.get("state_dir") {
        None => return (default(), None),
        Some(Value::String(s)) if s.is_empty() => return (default(), None),
        Some(Value::String(s)) => PathBuf::from(s),
        Some(other) => {
            return (
                default(),
                Some(format!(
                    "state_dir {other} is not a string; using {DEFAULT_STATE_DIR}"
                )),
            );
        }
    };
    let conf = config
        .get("cni_conf_dir")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map_or_else(|| conf_dir.to_path_buf(), PathBuf::from);
    let why = if !dir.is_absolute() {
        Some("is not an absolute path")
    } else if dir
        .components()
        .any(|c| c == std::path::Component::ParentDir)
    {
        Some("has a '..' component")
    } else if dir.starts_with(&conf) {
        Some(
            "is inside the CNI conf dir, where every write would make the runtime reload its network config",
        )
    } else {
        None
    };
    match why {
        None => (dir, None),
        Some(why) => (
            default(),
            Some(format!(
                "state_dir {} {why}; using {DEFAULT_STATE_DIR}",
                dir.display()
            )),
        ),
    }
}

/// The heartbeat's file name in the state dir.
pub const HEARTBEAT_FILE: &str = "installer-heartbeat.json";
/// Missed resync periods after which the installer is taken for gone...
pub const GONE_AFTER_RESYNCS: u32 = 3;
/// ...plus this, for a long pass and a rolling update's gap.
pub const GONE_AFTER_SLACK: Duration = Duration::from_secs(30);
/// A beat this far ahead of the reader's clock was not written on this
/// boot's clock (clocks of one boot agree to well under this).
const FUTURE_TOLERANCE: Duration = Duration::from_secs(1);
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
/// The beat's key for [`Beat::plugin_denied`].
const DENIED_KEY: &str = "plugin_access_denied";
/// The longest resync period a beat may claim: the installer's own bound
/// (`LINKERD_CNI_RESYNC_SECONDS`). A larger one would keep a gone installer
/// alive, and every ADD with rejected credentials answered "try again
/// later", for years.
pub const MAX_RESYNC: Duration = Duration::from_secs(3600);
/// Bounds on the beat's strings and names: what an installer writes is far
/// below them.
const MAX_DENIED_LEN: usize = 4096;
const MAX_BOOT_ID_LEN: usize = 64;

/// One beat: what the file holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Beat {
    /// The host's boot id (empty when it cannot be read).
    pub boot_id: String,
    /// When, on the host's boot-time clock (CLOCK_BOOTTIME).
    pub at: Duration,
    /// The installer's resync period.
    pub resync: Duration,
    /// Set when the installer asked the API server whether the plugin's
    /// credentials may get pods and was told no (their RBAC is missing):
    /// then a 403 is not the installer's to fix, and the plugin does not
    /// ask the runtime to retry for it. What the installer found.
    pub plugin_denied: Option<String>,
}

impl Beat {
    /// A beat now, from an installer resyncing every `resync`.
    pub fn now(resync: Duration) -> Beat {
        Beat {
            boot_id: boot_id(),
            at: boot_clock(),
            resync,
            plugin_denied: None,
        }
    }

    /// Whether this beat was written on this boot's clock, read at `now`:
    /// the same boot id (when both are known), and not ahead of `now`.
    fn this_boot(&self, now: Duration) -> bool {
        let ours = boot_id();
        let same = ours.is_empty() || self.boot_id.is_empty() || self.boot_id == ours;
        same && self.at <= now + FUTURE_TOLERANCE
    }

    /// The default limit for this beat's installer.
    pub fn default_limit(&self) -> Duration {
        self.resync
            .saturating_mul(GONE_AFTER_RESYNCS)
            .saturating_add(GONE_AFTER_SLACK)
    }
}

/// The installer's record; the plugin reads it, so it is 0644.
impl Record for Beat {
    const FILE: &'static str = HEARTBEAT_FILE;
    const VERSION: u64 = 1;
    const MODE: u32 = 0o644;

    fn to_json(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("boot_id".into(), self.boot_id.clone().into());
        m.insert("boot_time_seconds".into(), self.at.as_secs_f64().into());
        m.insert("resync_seconds".into(), self.resync.as_secs_f64().into());
        if let Some(d) = &self.plugin_denied {
            m.insert(DENIED_KEY.into(), Value::String(d.clone()));
        }
        m
    }

    /// The beat `v` holds, every number within its bounds (a resync
    /// period in (0, [`MAX_RESYNC`]], times not ahead of this boot's
    /// clock); else why not.
    fn from_json(v: Map<String, Value>) -> Result<Beat, String> {
        let v = Value::Object(v);
        let secs = |k: &str| {
            let s = v[k].as_f64().ok_or_else(|| format!("no number {k}"))?;
            // Negative, not finite, or past what a Duration holds.
            Duration::try_from_secs_f64(s).map_err(|_| format!("{k} {s} is out of range"))
        };
        let resync = secs("resync_seconds")?;
        if resync.is_zero() || resync > MAX_RESYNC {
            return Err(format!(
                "resync_seconds {} is out of range (0, {}]",
                resync.as_secs_f64(),
                MAX_RESYNC.as_secs()
            ));
        }
        let plugin_denied = match &v[DENIED_KEY] {
            Value::Null => None,
            Value::String(d) if d.len() <= MAX_DENIED_LEN => Some(d.clone()),
            _ => {
                return Err(format!(
                    "{DENIED_KEY} is not a string of at most {MAX_DENIED_LEN} bytes"
                ));
            }
        };
        Ok(Beat {
            boot_id: v["boot_id"]
                .as_str()
                .filter(|b| b.len() <= MAX_BOOT_ID_LEN)
                .ok_or("no boot_id")?
                .to_string(),
            at: secs("boot_time_seconds")?,
            resync,
            plugin_denied,
        })
    }
}

/// Removes the heartbeat (an uninstall): the plugin then takes the
/// installer for gone at once. Whether there was one.
pub fn remove(state_dir: &Path) -> Result<bool, ChainError> {
    let p = record::path::<Beat>(state_dir);
    match fs::remove_file(&p) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(ChainError::io("remove", &p, e)),
    }
}

/// Whether an installer is alive on this node, as its heartbeat tells.
#[derive(Debug, Clone, PartialEq)]
pub enum Liveness {
    /// It beat `age` ago, within `limit`; `plugin_denied` as in its
    /// beat ([`Beat::plugin_denied`]).
    Alive {
        age: Duration,
        limit: Duration,
        plugin_denied: Option<String>,
    },
    /// It is taken for gone.
    Gone(Gone),
}

/// Why the installer is taken for gone.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Gone {
    /// No heartbeat file.
    #[error("no installer heartbeat ({} does not exist)", .0.display())]
    Absent(PathBuf),
    /// A file that is not a heartbeat, or cannot be read.
    #[error("the installer heartbeat {} is unreadable: {why}", path.display())]
    Unreadable { path: PathBuf, why: String },
    /// Written before this boot, or on another clock.
    #[error("the installer heartbeat {} was written before this boot", .0.display())]
    OtherBoot(PathBuf),
    /// The last beat is older than the limit.
    #[error(
        "the installer's last heartbeat ({}) is {:.0} s old, past the {:.0} s limit",
        path.display(),
        age.as_secs_f64(),
        limit.as_secs_f64()
    )]
    Stale {
        path: PathBuf,
        age: Duration,
        limit: Duration,
    },
}

/// Reads the heartbeat in `state_dir`; `limit` overrides the beat's own
/// default limit ([`Beat::default_limit`]).
pub fn liveness(state_dir: &Path, limit: Option<Duration>) -> Liveness {
    let path = record::path::<Beat>(state_dir);
    let beat = match record::read::<Beat>(state_dir) {
        Ok(b) => b,
        Err(ReadError::Absent) => return Liveness::Gone(Gone::Absent(path)),
        Err(e) => {
            let why = match e {
                ReadError::Invalid(why) => format!("not a heartbeat: {why}"),
                e => e.to_string(),
            };
            log::warn!("{}: {why}; the installer is taken for gone", path.display());
            return Liveness::Gone(Gone::Unreadable { path, why });
        }
    };
    let now = boot_clock();
    if !beat.this_boot(now) {
        return Liveness::Gone(Gone::OtherBoot(path));
    }
    let age = now.saturating_sub(beat.at);
    let limit = limit.unwrap_or_else(|| beat.default_limit());
    if age > limit {
        return Liveness::Gone(Gone::Stale { path, age, limit });
    }
    Liveness::Alive {
        age,
        limit,
        plugin_denied: beat.plugin_denied,
    }
}

/// The host's boot-time clock: monotonic, counting suspend, shared by every
/// container on the host.
pub fn boot_clock() -> Duration {
    clock_gettime(ClockId::CLOCK_BOOTTIME)
        .map(Duration::from)
        .unwrap_or_default()
}

/// This boot's id, or empty.
pub fn boot_id() -> String {
    fs::read_to_string(BOOT_ID)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;
    use serde_json::json;

    #[test]
    fn a_fresh_beat_is_alive_an_old_one_gone() {
        let dir = TempDir::new("heartbeat");
        assert!(matches!(
            liveness(dir.path(), None),
            Liveness::Gone(Gone::Absent(_))
        ));
        record::write(dir.path(), &Beat::now(Duration::from_secs(10))).unwrap();
        match liveness(dir.path(), None) {
            Liveness::Alive { limit, .. } => assert_eq!(limit, Duration::from_secs(60)),
            other => panic!("{other:?}"),
        }
        // The configured limit wins over the beat's own.
        let mut old = Beat::now(Duration::from_secs(10));
        old.at = old.at.saturating_sub(Duration::from_secs(5));
        record::write(dir.path(), &old).unwrap();
        assert!(matches!(
            liveness(dir.path(), Some(Duration::from_secs(2))),
            Liveness::Gone(Gone::Stale { .. })
        ));
        assert!(matches!(liveness(dir.path(), None), Liveness::Alive { .. }));
        assert!(remove(dir.path()).unwrap());
        assert!(!remove(dir.path()).unwrap());
    }

    #[test]
    fn what_the_installer_found_of_the_plugins_access_is_read_back() {
        let dir = TempDir::new("heartbeat-denied");
        let mut b = Beat::now(Duration::from_secs(10));
        b.plugin_denied = Some("get pods: denied".into());
        record::write(dir.path(), &b).unwrap();
        match liveness(dir.path(), None) {
            Liveness::Alive { plugin_denied, .. } => {
                assert_eq!(plugin_denied.as_deref(), Some("get pods: denied"))
            }
            other => panic!("{other:?}"),
        }
        record::write(dir.path(), &Beat::now(Duration::from_secs(10))).unwrap();
        assert!(matches!(
            liveness(dir.path(), None),
            Liveness::Alive {
                plugin_denied: None,
                ..
            }
        ));
    }

    #[test]
    fn a_beat_of_another_boot_or_from_the_future_is_gone() {
        let dir = TempDir::new("heartbeat");
        let mut other = Beat::now(Duration::from_secs(10));
        other.boot_id = "00000000-0000-0000-0000-000000000000".into();
        record::write(dir.path(), &other).unwrap();
        if !boot_id().is_empty() {
            assert!(matches!(
                liveness(dir.path(), None),
                Liveness::Gone(Gone::OtherBoot(_))
            ));
        }
        let mut ahead = Beat::now(Duration::from_secs(10));
        ahead.at += Duration::from_secs(3600);
        record::write(dir.path(), &ahead).unwrap();
        assert!(matches!(
            liveness(dir.path(), None),
            Liveness::Gone(Gone::OtherBoot(_))
        ));
    }

    #[test]
    fn the_state_dir_is_outside_the_conf_dir_and_absolute() {
        let conf = Path::new("/etc/cni/net.d");
        let of = |v: Value| match v {
            Value::Object(m) => state_dir_of(&m, conf),
            _ => unreachable!(),
        };
        let default = PathBuf::from(DEFAULT_STATE_DIR);
        assert_eq!(of(json!({})), (default.clone(), None));
        assert_eq!(of(json!({"state_dir": ""})), (default.clone(), None));
        assert_eq!(
            of(json!({"state_dir": "/var/run/lcni"})),
            (PathBuf::from("/var/run/lcni"), None)
        );
        for (config, why) in [
            (
                json!({"state_dir": "/etc/cni/net.d/state"}),
                "inside the CNI conf dir",
            ),
            (
                json!({"state_dir": "/etc/cni/net.d"}),
                "inside the CNI conf dir",
            ),
            (
                json!({"state_dir": "/host/net.d/x", "cni_conf_dir": "/host/net.d"}),
                "inside the CNI conf dir",
            ),
            (json!({"state_dir": "run/lcni"}), "not an absolute path"),
            (json!({"state_dir": "/run/../etc/cni/net.d"}), "'..'"),
            (json!({"state_dir": 7}), "not a string"),
        ] {
            let (dir, warning) = of(config.clone());
            assert_eq!(dir, default, "{config}");
            let warning = warning.unwrap_or_default();
            assert!(warning.contains(why), "{config}: {warning}");
            assert!(warning.contains(DEFAULT_STATE_DIR), "{warning}");
        }
        // Another conf dir: /etc/cni/net.d is then no conf dir of ours.
        assert_eq!(
            of(json!({"state_dir": "/etc/cni/net.d/x", "cni_conf_dir": "/host/net.d"})),
            (PathBuf::from("/etc/cni/net.d/x"), None)
        );
    }

    #[test]
    fn anything_else_in_the_file_is_unreadable() {
        let dir = TempDir::new("heartbeat");
        for junk in [
            &b"{}"[..],
            b"not json",
            b"{\"boot_id\":\"x\",\"boot_time_seconds\":-1,\"resync_seconds\":10}",
        ] {
            fs::write(record::path::<Beat>(dir.path()), junk).unwrap();
            assert!(
                matches!(
                    liveness(dir.path(), None),
                    Liveness::Gone(Gone::Unreadable { .. })
                ),
                "{}",
                String::from_utf8_lossy(junk)
            );
        }
    }

    /// A beat's numbers within bounds, or no beat: a resync period of
    /// 1e9 s would keep an installer alive for ever (every ADD with
    /// rejected credentials held to its deadline and answered code 11).
    #[test]
    fn numbers_out_of_range_make_no_heartbeat() {
        let dir = TempDir::new("heartbeat-bounds");
        let now = boot_clock().as_secs_f64();
        for (resync, ok) in [
            ("10", true),
            ("3600", true),
            ("1e9", false),
            ("1e19", false),
            ("1.8e19", false),
            ("3601", false),
            ("0", false),
        ] {
            let text = format!(
                "{{\"boot_id\":\"{}\",\"boot_time_seconds\":{now},\"resync_seconds\":{resync}}}",
                boot_id()
            );
            write_root_file(&record::path::<Beat>(dir.path()), &text);
            match liveness(dir.path(), None) {
                Liveness::Alive { .. } if ok => {}
                Liveness::Gone(Gone::Unreadable { why, .. }) if !ok => {
                    assert!(why.contains("resync_seconds"), "{why}")
                }
                other => panic!("resync {resync}: {other:?}"),
            }
        }
        let long = "x".repeat(MAX_DENIED_LEN + 1);
        let text = format!(
            "{{\"boot_id\":\"{}\",\"boot_time_seconds\":{now},\"resync_seconds\":10,\"{DENIED_KEY}\":\"{long}\"}}",
            boot_id()
        );
        write_root_file(&record::path::<Beat>(dir.path()), &text);
        assert!(matches!(
            liveness(dir.path(), None),
            Liveness::Gone(Gone::Unreadable { .. })
        ));
    }

    /// Only root's own heartbeat counts: one another user owns, anyone may
    /// write, or a link to one, claims nothing (not an installer alive,
    /// nor the plugin's RBAC missing), for the plugin and the installer.
    #[test]
    fn a_heartbeat_that_is_not_roots_own_is_no_heartbeat() {
        use std::os::unix::fs::PermissionsExt;
        testkit::require_root("chown");
        let dir = TempDir::new("heartbeat-owner");
        let mut b = Beat::now(Duration::from_secs(10));
        b.plugin_denied = Some("get pods: denied".into());
        record::write(dir.path(), &b).unwrap();
        let p = record::path::<Beat>(dir.path());
        assert!(matches!(
            liveness(dir.path(), None),
            Liveness::Alive {
                plugin_denied: Some(_),
                ..
            }
        ));
        let not_trusted = |dir: &Path| match liveness(dir, None) {
            Liveness::Gone(Gone::Unreadable { why, .. }) => why,
            other => panic!("{other:?}"),
        };
        fs::set_permissions(&p, fs::Permissions::from_mode(0o666)).unwrap();
        assert!(not_trusted(dir.path()).contains("writable by group or others"));
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::chown(&p, Some(1000), Some(1000)).unwrap();
        assert!(not_trusted(dir.path()).contains("owned by uid 1000"));
        let moved = dir.path().join("elsewhere");
        fs::rename(&p, &moved).unwrap();
        std::os::unix::fs::chown(&moved, Some(0), Some(0)).unwrap();
        std::os::unix::fs::symlink(&moved, &p).unwrap();
        assert!(not_trusted(dir.path()).contains("symlink"));
        // The next beat replaces the link, never writing through it.
        let before = fs::read(&moved).unwrap();
        record::write(dir.path(), &Beat::now(Duration::from_secs(10))).unwrap();
        assert_eq!(fs::read(&moved).unwrap(), before);
        assert!(matches!(liveness(dir.path(), None), Liveness::Alive { .. }));
    }

    /// `text` into `p`, root's, mode 0644.
    fn write_root_file(p: &Path, text: &str) {
        use std::os::unix::fs::PermissionsExt;
        fs::write(p, text).unwrap();
        fs::set_permissions(p, fs::Permissions::from_mode(0o644)).unwrap();
    }
}
