//! linkerd-cni's entry in a conflist's `plugins`, and its persisted copy.
//!
//! An entry is only ever handled as an [`Entry`], which cannot exist unless
//! it is a JSON object of type [`PLUGIN_TYPE`]: a repair that appended
//! anything else would fail to recognise what it appended, and append it
//! again on every pass.
//!
//! The installer persists the desired entry in [`ENTRY_FILE`], so that the
//! plugin, the installer and the CLI all repair towards the same one.

use std::fs;
use std::io;
use std::ops::Deref;
use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{ChainError, EntryProblem};
use crate::{RepairOptions, lock, scan, write};

/// `"type"` of our entry in a conflist's `plugins`.
pub const PLUGIN_TYPE: &str = "linkerd-cni";

/// The persisted desired entry, in the conf dir, under a name no runtime
/// loads (no `.conf`/`.conflist`/`.json` extension). JSON object text.
pub const ENTRY_FILE: &str = "ZZZ-linkerd-cni-entry";

/// The entry key where the installer says why `chain_mode` is what it is,
/// when its `auto` setting chose it from the runtime's settings; shown by
/// `linkerd-cni chain status`.
pub const MODE_REASON_KEY: &str = "chain_mode_reason";

/// A linkerd-cni plugin object of a conflist: a JSON object whose `"type"`
/// is [`PLUGIN_TYPE`]. Read-only once made (through [`Deref`] to its map);
/// [`Entry::with`] makes a changed copy, checked again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry(Map<String, Value>);

impl Entry {
    /// Checks that `plugin` is one of ours. `origin` names where it came
    /// from, for the error.
    pub fn new(plugin: Map<String, Value>, origin: &str) -> Result<Entry, ChainError> {
        match plugin.get("type") {
            Some(Value::String(t)) if t == PLUGIN_TYPE => Ok(Entry(plugin)),
            other => Err(invalid(
                origin,
                EntryProblem::WrongType {
                    found: other.map_or("nothing".to_string(), Value::to_string),
                },
            )),
        }
    }

    /// Parses an entry from JSON text (the entry file, `--entry FILE`).
    pub fn parse(bytes: &[u8], origin: &str) -> Result<Entry, ChainError> {
        match serde_json::from_slice::<Value>(bytes) {
            Ok(Value::Object(m)) => Entry::new(m, origin),
            Ok(_) => Err(invalid(origin, EntryProblem::NotAnObject)),
            Err(e) => Err(invalid(origin, EntryProblem::Json(e))),
        }
    }

    /// A copy with `key` set to `value`, checked again (so `"type"` cannot
    /// be changed to something not ours).
    pub fn with(
        &self,
        key: impl Into<String>,
        value: impl Into<Value>,
    ) -> Result<Entry, ChainError> {
        let mut m = self.0.clone();
        m.insert(key.into(), value.into());
        Entry::new(m, "a changed entry")
    }

    pub fn as_map(&self) -> &Map<String, Value> {
        &self.0
    }

    pub fn into_map(self) -> Map<String, Value> {
        self.0
    }
}

impl Deref for Entry {
    type Target = Map<String, Value>;

    fn deref(&self) -> &Map<String, Value> {
        &self.0
    }
}

impl From<Entry> for Value {
    fn from(e: Entry) -> Value {
        Value::Object(e.0)
    }
}

fn invalid(origin: &str, problem: EntryProblem) -> ChainError {
    ChainError::InvalidEntry {
        origin: origin.to_string(),
        problem,
    }
}

/// Reads [`ENTRY_FILE`] from `conf_dir`; `Ok(None)` when absent.
pub fn load_entry(conf_dir: &Path) -> Result<Option<Entry>, ChainError> {
    let path = conf_dir.join(ENTRY_FILE);
    match scan::read_file(&path) {
        Ok(bytes) => Entry::parse(&bytes, &path.display().to_string()).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ChainError::io("read", path, e)),
    }
}

/// What [`persist_entry`] replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replaced {
    Absent,
    Different,
    Unreadable,
}

impl std::fmt::Display for Replaced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Replaced::Absent => "it was absent",
            Replaced::Different => "it differed from the template",
            Replaced::Unreadable => "it was unreadable",
        })
    }
}

/// What the file holds compared with `entry`; `None`: the same.
fn compare(conf_dir: &Path, entry: &Entry) -> Option<Replaced> {
    match load_entry(conf_dir) {
        Ok(Some(old)) if old == *entry => None,
        Ok(Some(_)) => Some(Replaced::Different),
        Ok(None) => Some(Replaced::Absent),
        Err(_) => Some(Replaced::Unreadable),
    }
}

/// Writes [`ENTRY_FILE`] (temp, fsync, rename, under the conf-dir lock), only
/// when its content would change. Returns what it replaced, if it wrote.
/// The file is compared first without the lock: on a node whose entry is
/// current (an installer's idle pass) nothing waits for it.
pub fn persist_entry(conf_dir: &Path, entry: &Entry) -> Result<Option<Replaced>, ChainError> {
    if compare(conf_dir, entry).is_none() {
        return Ok(None);
    }
    let path = conf_dir.join(ENTRY_FILE);
    let _lock = lock::lock_dir(conf_dir, RepairOptions::default().lock_timeout, None)?;
    let Some(replaced) = compare(conf_dir, entry) else {
        return Ok(None);
    };
    let mut text = serde_json::to_string_pretty(entry.as_map())
        .map_err(|e| ChainError::io("serialize", &path, io::Error::other(e)))?;
    text.push('\n');
    let like = fs::metadata(&path).ok();
    let (tmp, _) = write::write_temp(conf_dir, None, text.as_bytes(), like.as_ref())?;
    write::rename_over(&tmp, &path)?;
    Ok(Some(replaced))
}

/// Removes [`ENTRY_FILE`] (uninstall). `Ok(false)` when it was absent.
pub fn remove_entry_file(conf_dir: &Path) -> Result<bool, ChainError> {
    let path = conf_dir.join(ENTRY_FILE);
    match fs::remove_file(&path) {
        Ok(()) => {
            write::fsync_dir(conf_dir).map_err(|e| ChainError::io("fsync", conf_dir, e))?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(ChainError::io("remove", path, e)),
    }
}
