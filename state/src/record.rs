//! The one discipline of the state dir's JSON records: each file holds one
//! typed record ([`Record`]) of one writer, with its format's version
//! (`"v"`), read only when it is root's own regular file
//! ([`crate::statefile`]), written whole by an atomic replace (never in
//! place, so a reader sees the old record or the new one), and updated
//! (read, changed, written) only under the state dir's lock ([`update`]),
//! so that concurrent writers never lose one another's change.
//!
//! A record without `"v"` is of version 1: what linkerd-cni wrote before
//! records carried it, so that plugins and installers of both kinds read
//! each other's across a rolling update. A record of a newer version is
//! none: its writer's format is not this reader's.

use std::fs::{DirBuilder, File};
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use linkerd_cni_chain::ChainError;
use serde_json::{Map, Value};

/// The record's key for its format's version.
const VERSION_KEY: &str = "v";

/// The lock file every update takes, in the state dir: the conf-dir lock's
/// name, which plugins before this crate took on the state dir too, so
/// that they and this one exclude each other through an upgrade.
pub const LOCK_FILE: &str = linkerd_cni_chain::LOCK_FILE;

/// One typed record of the state dir.
pub trait Record: Sized {
    /// Its file's name in the state dir.
    const FILE: &'static str;
    /// Its format's version: a file of a higher one is no record.
    const VERSION: u64;
    /// The file's mode: 0600 unless others must read it.
    const MODE: u32 = 0o600;

    /// The record's keys (without the version, which [`write`] adds).
    fn to_json(&self) -> Map<String, Value>;
    /// The record in `m` (the version key removed), every value within its
    /// bounds; else why not.
    fn from_json(m: Map<String, Value>) -> Result<Self, String>;
}

/// Why a record could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// No such file.
    #[error("does not exist")]
    Absent,
    /// The file is not root's own, is a link, or cannot be read.
    #[error("{0}")]
    Untrusted(io::Error),
    /// The file holds no record of this version.
    #[error("{0}")]
    Invalid(String),
}

/// The file of record `R` in `dir`.
pub fn path<R: Record>(dir: &Path) -> PathBuf {
    dir.join(R::FILE)
}

/// Reads record `R` from `dir`.
pub fn read<R: Record>(dir: &Path) -> Result<R, ReadError> {
    let bytes = match crate::statefile::read(&path::<R>(dir)) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ReadError::Absent),
        Err(e) => return Err(ReadError::Untrusted(e)),
    };
    let Ok(Value::Object(mut m)) = serde_json::from_slice::<Value>(&bytes) else {
        return Err(ReadError::Invalid("not a JSON object".into()));
    };
    match m.remove(VERSION_KEY) {
        None => {}
        Some(v) if v.as_u64().is_some_and(|v| (1..=R::VERSION).contains(&v)) => {}
        Some(v) => {
            return Err(ReadError::Invalid(format!(
                "version {v}, not one of 1 to {} (written by another linkerd-cni)",
                R::VERSION
            )));
        }
    }
    R::from_json(m).map_err(ReadError::Invalid)
}

/// Writes `record` into `dir` (created, mode 0700, when missing), replacing
/// the file atomically.
pub fn write<R: Record>(dir: &Path, record: &R) -> Result<(), ChainError> {
    create_dir(dir)?;
    let mut m = Map::new();
    m.insert(VERSION_KEY.into(), Value::from(R::VERSION));
    m.extend(record.to_json());
    linkerd_cni_chain::write::write_atomic(
        &path::<R>(dir),
        Value::Object(m).to_string().as_bytes(),
        R::MODE,
    )
}

/// Creates the state dir (mode 0700) when missing.
pub fn create_dir(dir: &Path) -> Result<(), ChainError> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| ChainError::io("create the state dir", dir, e))
}

/// Takes the state dir's lock ([`LOCK_FILE`], root's own file), waiting at
/// most `wait`: held until the file is closed.
fn lock(dir: &Path, wait: Duration) -> Result<File, String> {
    create_dir(dir).map_err(|e| e.to_string())?;
    let path = dir.join(LOCK_FILE);
    let file = crate::statefile::open_rw(&path, 0o600)
        .map_err(|e| format!("open the lock {}: {e}", path.display()))?;
    flock_within(&file, true, wait).map_err(|e| format!("lock {}: {e}", path.display()))?;
    Ok(file)
}

/// Takes `file`'s `flock` (exclusive or shared), waiting at most `wait`;
/// released when the file is closed. The one way every state file is
/// locked.
pub fn flock_within(file: &File, exclusive: bool, wait: Duration) -> io::Result<()> {
    if linkerd_cni_chain::flock_until(file, exclusive, Instant::now() + wait)? {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        format!("stayed locked for {wait:?}"),
    ))
}

/// Reads record `R` from `dir`; a missing or unreadable one reads as
/// `R::default()` (an unreadable one said in the log, with the file's
/// name and why).
pub fn read_or_default<R: Record + Default>(dir: &Path) -> R {
    match read::<R>(dir) {
        Ok(r) => r,
        Err(ReadError::Absent) => R::default(),
        Err(e) => {
            log::warn!("{}: {e}; taken as empty", path::<R>(dir).display());
            R::default()
        }
    }
}

/// Reads record `R` from `dir` under the state dir's lock (waiting at most
/// `wait`), lets `change` change it ([`read_or_default`]) and writes it
/// back. `change`'s answer, once the record is saved.
pub fn update<R: Record + Default, T>(
    dir: &Path,
    wait: Duration,
    change: impl FnOnce(&mut R) -> T,
) -> Result<T, String> {
    let _lock = lock(dir, wait)?;
    let mut record = read_or_default::<R>(dir);
    let t = change(&mut record);
    write(dir, &record).map_err(|e| e.to_string())?;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, PartialEq)]
    struct Count(u64);

    impl Record for Count {
        const FILE: &'static str = "count.json";
        const VERSION: u64 = 2;
        fn to_json(&self) -> Map<String, Value> {
            Map::from_iter([("n".to_string(), Value::from(self.0))])
        }
        fn from_json(m: Map<String, Value>) -> Result<Self, String> {
            m.get("n")
                .and_then(Value::as_u64)
                .map(Count)
                .ok_or_else(|| "no n".into())
        }
    }

    #[test]
    fn records_carry_their_version_and_updates_add_up() {
        let tmp = crate::testutil::TempDir::new("record");
        let dir = tmp.path().join("state");
        assert!(matches!(read::<Count>(&dir), Err(ReadError::Absent)));
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..10 {
                        update(&dir, Duration::from_secs(10), |c: &mut Count| c.0 += 1).unwrap();
                    }
                });
            }
        });
        assert_eq!(read::<Count>(&dir).unwrap(), Count(80));
        let text = std::fs::read_to_string(dir.join("count.json")).unwrap();
        assert_eq!(text, r#"{"v":2,"n":80}"#);
        // Without a version: the first; a newer one is no record.
        std::fs::write(dir.join("count.json"), r#"{"n":3}"#).unwrap();
        assert_eq!(read::<Count>(&dir).unwrap(), Count(3));
        std::fs::write(dir.join("count.json"), r#"{"v":3,"n":3}"#).unwrap();
        let e = read::<Count>(&dir).unwrap_err().to_string();
        assert!(e.contains("version 3"), "{e}");
    }
}
