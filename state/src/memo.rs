//! The plugin's healthy verdict, remembered between ADDs.
//!
//! Almost every ADD finds the chain healthy, and finds it so on the very
//! files the previous ADD looked at. The verdict of the chain crate's `keep` is a
//! function of the conf dir's names and of the content of its configs and
//! entry file, so it is remembered with their stamps (file type, device,
//! inode, size, modification and change times, and the conf dir's own,
//! which change with every name added, removed or renamed) and reused
//! while every stamp is unchanged: a look that costs a few `statx` calls
//! and one listing (the memo must name the entry file and every config
//! the conf dir holds now, or it vouches for a file it never saw) instead
//! of reading and parsing the files.
//!
//! Timestamps are coarse (the kernel's clock tick, the file system's
//! granularity), so two writes close together can leave one stamp. As git
//! does for its index ("racily clean" entries), nothing changed less than
//! [`RACY`] before the look is remembered: any later write then shows in
//! the change time, which no program can set. A verdict is only ever
//! remembered for a conf dir without symlinked configs (a link's target
//! can change without a stamp here changing), with the entry file present
//! (the desired entry is then on disk, not on the ADD's stdin) and, in
//! owned mode, per copy the runtime ran (its marker): the stale-copy
//! verdict depends on it. A wrong memo could only skip a repair at ADD,
//! which the installer's watch makes anyway; it can never make a repair.
//! Still, a memo is believed only when it is root's own file
//! ([`crate::statefile`]): nobody else can make an ADD skip one.

use std::fmt::Write as _;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use linkerd_cni_chain::names::is_config_name;
use linkerd_cni_chain::owned::Marker;
use linkerd_cni_chain::{ENTRY_FILE, Report, write};

use crate::statefile;

/// The memo's file in the plugin's state dir.
pub const MEMO_FILE: &str = "chain-healthy";

/// How old every stamp must be for a verdict to be remembered: above any
/// kernel tick plus a one-second file-system granularity.
pub const RACY: Duration = Duration::from_secs(2);

/// First line of the memo: its format.
const VERSION: &str = "linkerd-cni healthy-chain memo v1";

/// One file's stamp.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    /// Type and permission bits.
    mode: u32,
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Stamp {
    fn of(meta: &fs::Metadata) -> Stamp {
        Stamp {
            mode: meta.mode(),
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
        }
    }

    fn latest_ns(&self) -> i128 {
        self.mtime_ns.max(self.ctime_ns)
    }
}

/// The conf dir's stamps, taken before a check reads the files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamps {
    taken_ns: i128,
    dir: Stamp,
    /// The configs and the entry file, by name, in byte order.
    files: Vec<(String, Stamp)>,
}

fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

impl Stamps {
    /// The stamps of `conf_dir` and of what a check reads in it; `None`
    /// when a verdict on it could not be trusted to them (a symlinked
    /// config, no entry file, a name a memo line cannot hold) or it cannot
    /// be listed.
    pub fn take(conf_dir: &Path) -> Option<Stamps> {
        let taken_ns = now_ns();
        let dir = Stamp::of(&fs::metadata(conf_dir).ok()?);
        let mut files = Vec::new();
        for e in fs::read_dir(conf_dir).ok()? {
            let e = e.ok()?;
            let name = e.file_name();
            if !is_config_name(&name) && name != ENTRY_FILE {
                continue;
            }
            let name = name.into_string().ok().filter(|n| !n.contains('\n'))?;
            let meta = fs::symlink_metadata(e.path()).ok()?;
            if meta.file_type().is_symlink() {
                return None;
            }
            files.push((name, Stamp::of(&meta)));
        }
        if !files.iter().any(|(n, _)| n == ENTRY_FILE) {
            return None;
        }
        files.sort_by(|a, b| a.0.cmp(&b.0));
        Some(Stamps {
            taken_ns,
            dir,
            files,
        })
    }

    /// Whether nothing stamped changed within `racy` before the stamps
    /// were taken (nor claims a time after it).
    fn settled(&self, racy: Duration) -> bool {
        let bound = self.taken_ns - racy.as_nanos() as i128;
        std::iter::once(&self.dir)
            .chain(self.files.iter().map(|(_, s)| s))
            .all(|s| s.latest_ns() < bound)
    }

    /// The memo's lines of these stamps, one a file: the stamp, then the
    /// name (`.` for the conf dir, first).
    fn lines(&self) -> String {
        let mut out = String::new();
        let dir = std::iter::once((".", &self.dir));
        for (name, s) in dir.chain(self.files.iter().map(|(n, s)| (n.as_str(), s))) {
            let _ = writeln!(
                out,
                "{:o} {} {} {} {} {} {name}",
                s.mode, s.dev, s.ino, s.size, s.mtime_ns, s.ctime_ns
            );
        }
        out
    }
}

/// What the runtime ran, as the memo records it.
fn ran_key(ran: Option<&Marker>) -> Option<String> {
    let key = match ran {
        None => "-".to_string(),
        Some(m) => format!(
            "{} {} {}",
            m.sha256,
            m.meaning.as_deref().unwrap_or("-"),
            m.file
        ),
    };
    (!key.contains('\n')).then_some(key)
}

/// The memo of the last healthy verdict, kept in the plugin's state dir.
#[derive(Debug, Clone)]
pub struct Memo {
    path: PathBuf,
    racy: Duration,
}

impl Memo {
    pub fn in_dir(state_dir: &Path) -> Memo {
        Memo {
            path: state_dir.join(MEMO_FILE),
            racy: RACY,
        }
    }

    /// The same memo, with another bound than [`RACY`] (tests, whose files
    /// are all new).
    #[cfg(test)]
    pub(crate) fn with_racy(self, racy: Duration) -> Memo {
        Memo { racy, ..self }
    }

    /// Whether a check that found `conf_dir` healthy, for an ADD that ran
    /// `ran`, saw it exactly as it is now. Anything unreadable, malformed
    /// or different is a no.
    pub fn holds(&self, conf_dir: &Path, ran: Option<&Marker>) -> bool {
        let Some(key) = ran_key(ran) else {
            return false;
        };
        let bytes = match statefile::read(&self.path) {
            Ok(b) => b,
            Err(e) => {
                if e.kind() != std::io::ErrorKind::NotFound {
                    log::warn!("the healthy-chain memo {}: {e}", self.path.display());
                }
                return false;
            }
        };
        let Ok(text) = std::str::from_utf8(&bytes) else {
            return false;
        };
        let mut lines = text.splitn(5, '\n');
        if lines.next() != Some(VERSION)
            || lines.next().and_then(|l| l.strip_prefix("conf ")) != conf_dir.to_str()
            || lines.next().and_then(|l| l.strip_prefix("ran ")) != Some(key.as_str())
        {
            return false;
        }
        let taken: Option<i128> = lines
            .next()
            .and_then(|l| l.strip_prefix("at "))
            .and_then(|t| t.parse().ok());
        // A clock set back since: the racy bound no longer holds.
        if taken.is_none_or(|t| t > now_ns()) {
            return false;
        }
        // The verdict covers every file a check reads: the conf dir itself
        // (its names), the entry file and each config, stamped as the memo
        // has them, line for line. A memo missing one of them would vouch
        // for a file it never saw.
        let stamps = lines.next().unwrap_or_default();
        Stamps::take(conf_dir).is_some_and(|now| now.lines() == stamps)
    }

    /// Remembers `report` when it is a steady healthy verdict on the files
    /// as stamped in `before` (taken before the check read them), they are
    /// still so, and none changed within [`RACY`] of the look. Best
    /// effort: a memo that cannot be written is only a slower next ADD.
    pub fn remember(
        &self,
        conf_dir: &Path,
        before: Option<Stamps>,
        ran: Option<&Marker>,
        report: &Report,
    ) {
        let (Some(before), Some(key), Some(conf)) = (before, ran_key(ran), conf_dir.to_str())
        else {
            return;
        };
        if !report.is_steady() || conf.contains('\n') || !before.settled(self.racy) {
            return;
        }
        let stamps = before.lines();
        if Stamps::take(conf_dir).is_none_or(|after| after.lines() != stamps) {
            return;
        }
        let text = format!(
            "{VERSION}\nconf {conf}\nran {key}\nat {}\n{stamps}",
            before.taken_ns
        );
        if let Err(e) = write::write_atomic(&self.path, text.as_bytes(), 0o600) {
            log::debug!("cannot remember the healthy chain: {e}");
        }
    }
}

#[cfg(test)]
mod tests;
