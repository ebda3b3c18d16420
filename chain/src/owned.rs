//! Owned chain mode: linkerd-cni keeps a conflist of its own, which the
//! runtime loads instead of the primary CNI's file.
//!
//! In inline mode our entry lives in the primary's file, so whenever the
//! primary rewrites it without us, the runtime loads a chain without
//! linkerd-cni until someone repairs it: pods created in that window are
//! never seen by the plugin. In owned mode the runtime never loads the
//! primary's file at all. This module owns:
//!
//! - the name of our file, derived from the primary's so that it always
//!   sorts first ([`owned_name`]): `<stem>-linkerd-cni.conflist` for a
//!   primary `<stem>.<ext>`. `-` (0x2D) sorts before `.` (0x2E), so ours
//!   precedes the primary's whatever the stem (`00-…`, dotfiles, an empty
//!   stem); and no other config can sort between the two, since anything
//!   before the primary's name would itself be the primary;
//! - recognising our files by the marker in our entry ([`MARKER_KEY`]: the
//!   primary's file name and the SHA-256 of its chain as copied), never by
//!   name alone: a file that merely looks like ours is a config like any
//!   other;
//! - the copy ([`copy_of`]): the primary's chain (`name`, `cniVersion`,
//!   plugins, unknown fields, byte for byte where the inline repair keeps
//!   them) minus any linkerd-cni entry, our entry last; a single-plugin
//!   `.conf` primary gives a conflist copy;
//! - keeping it in sync ([`sync`]), under the conf-dir lock, written in the
//!   conf dir (temp file + rename), only when its content changes; removing
//!   our files whose primary is gone, at once ([`retire`]);
//! - telling an ADD that ran a stale copy ([`OwnedDiagnosis::stale`]): the
//!   runtime hands the plugin its entry as loaded, marker included;
//! - when owned mode does not apply and inline repair takes over
//!   ([`OwnedState::Fallback`]): a meta-plugin at the front (Multus and the
//!   like: shadowing it would take the pods' other networks away), a
//!   primary holding nothing but linkerd-cni, and another agent that renames
//!   our file away (Cilium with `cni.exclusive=true`).
//!
//! The primary's file is only read, except once when switching from inline
//! mode: our old entry is taken out of it after our file is in place.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::scan::{self, Kind, Listing};
use super::{ChainError, Entry, RepairOptions, lock, plan, repair, sha256, write};

/// The entry key that selects the chain mode: `"inline"` (the default when
/// absent) or `"owned"`.
pub const MODE_KEY: &str = "chain_mode";

/// The key of our entry in an owned file: `{"file": <the primary's file
/// name>, "sha256": <digest of the primary's chain as copied>}`.
pub const MARKER_KEY: &str = "owned_copy_of";

/// Our file is the primary's stem followed by this.
pub const OWNED_SUFFIX: &str = "-linkerd-cni.conflist";

/// How linkerd-cni keeps itself in the runtime's active config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainMode {
    /// Our entry, last, in the primary's own file.
    Inline,
    /// Our own file, sorting before the primary's, holding its chain and
    /// our entry.
    Owned,
}

impl ChainMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ChainMode::Inline => "inline",
            ChainMode::Owned => "owned",
        }
    }

    pub fn parse(s: &str) -> Option<ChainMode> {
        match s {
            "inline" => Some(ChainMode::Inline),
            "owned" => Some(ChainMode::Owned),
            _ => None,
        }
    }
}

impl fmt::Display for ChainMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The mode an entry selects; an unknown value is an error (a typo must not
/// silently select inline mode).
pub fn mode_of(entry: &Entry) -> Result<ChainMode, ChainError> {
    match entry.get(MODE_KEY) {
        None | Some(Value::Null) => Ok(ChainMode::Inline),
        Some(Value::String(s)) if ChainMode::parse(s).is_some() => {
            Ok(ChainMode::parse(s).unwrap_or(ChainMode::Inline))
        }
        Some(other) => Err(ChainError::InvalidEntry {
            origin: "the desired entry".into(),
            problem: super::EntryProblem::UnknownMode {
                key: MODE_KEY,
                found: other.to_string(),
            },
        }),
    }
}

/// What the marker of an owned file's entry records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    /// The primary's file name (no directory).
    pub file: String,
    /// SHA-256 of the primary's chain as copied (see [`chain_digest`]).
    pub sha256: String,
}

impl Marker {
    /// The marker of an entry (as in our file, or on the plugin's stdin).
    pub fn of(entry: &Map<String, Value>) -> Option<Marker> {
        let m = entry.get(MARKER_KEY)?.as_object()?;
        Some(Marker {
            file: m.get("file")?.as_str()?.to_string(),
            sha256: m.get("sha256")?.as_str()?.to_string(),
        })
    }

    fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("file".into(), Value::String(self.file.clone()));
        m.insert("sha256".into(), Value::String(self.sha256.clone()));
        Value::Object(m)
    }
}

/// Our file's name for a primary named `primary`: its stem (up to its last
/// `.`) followed by [`OWNED_SUFFIX`].
pub fn owned_name(primary: &OsStr) -> OsString {
    let b = primary.as_bytes();
    let stem = match b.iter().rposition(|&c| c == b'.') {
        Some(i) => b.get(..i).unwrap_or_default(),
        None => b,
    };
    let mut name = stem.to_vec();
    name.extend_from_slice(OWNED_SUFFIX.as_bytes());
    OsString::from_vec(name)
}

/// Whether a config name has the shape of ours (to be confirmed by the
/// marker inside).
pub(crate) fn is_owned_name(name: &OsStr) -> bool {
    name.as_bytes().ends_with(OWNED_SUFFIX.as_bytes())
}

/// Whether a name that is no config looks like one of our files renamed by
/// appending something (`…-linkerd-cni.conflist.cilium_bak`).
pub(crate) fn is_renamed_owned_name(name: &OsStr) -> bool {
    let b = name.as_bytes();
    let s = OWNED_SUFFIX.as_bytes();
    b.windows(s.len())
        .position(|w| w == s)
        .is_some_and(|i| b.len() > i + s.len())
}

/// Whether `path` is one of our owned files: a conflist holding one of our
/// entries with a marker.
pub(crate) fn is_owned_file(path: &Path) -> bool {
    let Ok(bytes) = scan::read_file(path) else {
        return false;
    };
    marker_in(&bytes).is_some()
}

fn marker_in(bytes: &[u8]) -> Option<Marker> {
    if !bytes
        .windows(MARKER_KEY.len())
        .any(|w| w == MARKER_KEY.as_bytes())
    {
        return None;
    }
    let top = plan::parse(Kind::List, bytes).ok()?;
    top.get("plugins")?
        .as_array()?
        .iter()
        .filter(|p| plan::is_ours(p))
        .find_map(|p| p.as_object().and_then(Marker::of))
}

/// Plugin types that delegate to other networks: never shadowed.
const META_TYPES: [&str; 4] = ["multus", "multus-shim", "genie", "danm"];
/// Keys by which a plugin delegates to whole networks (Multus, Genie).
const META_KEYS: [&str; 3] = ["delegates", "clusterNetwork", "defaultNetworks"];

/// Why a config is a meta-plugin's, if it is.
fn meta_plugin(kind: Kind, top: &Map<String, Value>) -> Option<String> {
    let plugins: Vec<&Value> = match kind {
        Kind::List => top
            .get("plugins")
            .and_then(Value::as_array)
            .map(|p| p.iter().collect())
            .unwrap_or_default(),
        Kind::Single => vec![],
    };
    let single = Value::Object(top.clone());
    let all = if kind == Kind::Single {
        vec![&single]
    } else {
        plugins
    };
    for p in all {
        let t = p.get("type").and_then(Value::as_str).unwrap_or("?");
        if META_TYPES.contains(&t) {
            return Some(format!("plugin type {t:?} is a meta-plugin"));
        }
        if let Some(k) = META_KEYS.iter().find(|k| p.get(**k).is_some()) {
            return Some(format!("plugin {t:?} delegates to other networks ({k:?})"));
        }
    }
    None
}

/// Why the primary's chain is not taken over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotTaken {
    /// A meta-plugin's config: shadowing it would take the pods' other
    /// networks away.
    Meta(String),
    /// It holds no plugin but linkerd-cni.
    NoPrimaryPlugin,
    /// It cannot be loaded (not JSON, not a config, being rewritten in
    /// place...). Left for its owner; our file is left as it is.
    Invalid(String),
}

/// The primary's chain as copied: its bytes minus any linkerd-cni entry.
/// Our own entry being added to or removed from the primary's file (a mode
/// switch) does not change it.
fn primary_chain(kind: Kind, bytes: &[u8]) -> Vec<u8> {
    match kind {
        Kind::List => plan::without_entries(bytes).unwrap_or_else(|| bytes.to_vec()),
        Kind::Single => bytes.to_vec(),
    }
}

/// The digest recorded in the marker for a primary holding `bytes`.
pub fn chain_digest(primary: &Path, bytes: &[u8]) -> String {
    sha256::hex(&primary_chain(Kind::of(primary), bytes))
}

/// The content of our file for the primary `primary` holding `bytes`, and
/// the marker it records; or why the primary is not taken over.
pub fn copy_of(
    primary: &Path,
    bytes: &[u8],
    desired: &Entry,
) -> Result<(Vec<u8>, Marker), NotTaken> {
    let kind = Kind::of(primary);
    let top = plan::parse(kind, bytes).map_err(NotTaken::Invalid)?;
    if let Some(why) = meta_plugin(kind, &top) {
        return Err(NotTaken::Meta(why));
    }
    let chain = primary_chain(kind, bytes);
    let marker = Marker {
        file: primary
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        sha256: sha256::hex(&chain),
    };
    let mut entry = desired.as_map().clone();
    entry.insert(MARKER_KEY.into(), marker.to_value());
    match plan::analyze(kind, &chain, &entry).state {
        super::ChainState::NoPrimaryPlugin => return Err(NotTaken::NoPrimaryPlugin),
        super::ChainState::Invalid { reason } => return Err(NotTaken::Invalid(reason)),
        _ => {}
    }
    match plan::repaired(kind, &chain, &entry) {
        Some(content) => Ok((content, marker)),
        None => Err(NotTaken::Invalid("cannot be copied".into())),
    }
}

/// Owned mode's view of the conf dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnedState {
    /// Our file holds the primary's current chain and our entry, and no
    /// other file of ours is left.
    Current,
    /// No primary config: none of our files may stay.
    NoPrimary,
    /// Our file is missing.
    Missing,
    /// Our file holds another chain or entry than it should.
    Outdated,
    /// Owned mode does not apply here: inline repair takes over.
    Fallback { reason: String },
    /// The primary's file cannot be loaded: nothing written, our file (if
    /// any) left as it is, and ADDs that ran it retried.
    PrimaryInvalid { reason: String },
}

impl fmt::Display for OwnedState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OwnedState::Current => f.write_str(
                "current: our file holds the primary's chain as it is now, linkerd-cni last",
            ),
            OwnedState::NoPrimary => {
                f.write_str("no primary CNI config: linkerd-cni keeps no file of its own")
            }
            OwnedState::Missing => f.write_str("our file is missing"),
            OwnedState::Outdated => {
                f.write_str("our file is out of date (the primary's chain or the entry changed)")
            }
            OwnedState::Fallback { reason } => write!(
                f,
                "owned mode does not apply, inline repair is used instead: {reason}"
            ),
            OwnedState::PrimaryInvalid { reason } => write!(
                f,
                "the primary's config is unusable ({reason}): nothing written until its owner fixes it"
            ),
        }
    }
}

/// A read-only diagnosis in owned mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedDiagnosis {
    /// The primary's config: the first config file that is not ours.
    pub primary: Option<PathBuf>,
    /// Our file for that primary (whether or not it exists).
    pub ours: Option<PathBuf>,
    pub state: OwnedState,
    /// Our files on disk, in load order (the current one and stale ones).
    pub owned: Vec<PathBuf>,
    /// Files of ours another agent renamed away.
    pub renamed: Vec<PathBuf>,
    /// Whether the primary's file still holds a linkerd-cni entry (inline
    /// mode's, until a switch removes it).
    pub inline_entry: bool,
    /// The marker our file records (or would record) for the primary now.
    pub marker: Option<Marker>,
    /// What our file must hold.
    expected: Option<Vec<u8>>,
}

impl OwnedDiagnosis {
    /// Nothing for [`sync`] to do.
    pub fn is_current(&self) -> bool {
        match self.state {
            OwnedState::Current => !self.inline_entry,
            OwnedState::NoPrimary => self.owned.is_empty(),
            _ => false,
        }
    }

    /// Why an ADD that ran the owned file with marker `ran` ran a stale
    /// chain, if it did: the primary is gone, another file became the
    /// primary, or the primary's chain changed since the copy was made.
    pub fn stale(&self, ran: &Marker) -> Option<String> {
        let Some(primary) = &self.primary else {
            return Some(format!("the primary's config {} is gone", ran.file));
        };
        let name = primary
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name != ran.file {
            return Some(format!(
                "the primary's config is now {name}, the chain that ran was copied from {}",
                ran.file
            ));
        }
        let now = match &self.marker {
            Some(m) => m.sha256.clone(),
            None => match scan::read_file(primary) {
                Ok(bytes) => chain_digest(primary, &bytes),
                Err(e) => return Some(format!("{name} cannot be read: {e}")),
            },
        };
        (now != ran.sha256).then(|| format!("{name} changed after the runtime loaded its copy"))
    }
}

impl fmt::Display for OwnedDiagnosis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |p: &Option<PathBuf>| {
            p.as_ref()
                .map_or("none".to_string(), |p| p.display().to_string())
        };
        writeln!(f, "primary config: {}", show(&self.primary))?;
        writeln!(f, "our config:     {}", show(&self.ours))?;
        writeln!(f, "copy:           {}", self.state)?;
        for o in &self.owned {
            if Some(o) != self.ours.as_ref()
                || !matches!(self.state, OwnedState::Current | OwnedState::Outdated)
            {
                writeln!(
                    f,
                    "note:           {} is ours and must go (its primary is gone or replaced)",
                    o.display()
                )?;
            }
        }
        if self.inline_entry && !matches!(self.state, OwnedState::Fallback { .. }) {
            writeln!(
                f,
                "note:           the primary's file still holds a linkerd-cni entry (inline mode's); sync removes it once our file is in place"
            )?;
        }
        Ok(())
    }
}

/// Diagnosis from a listing (the plugin's ADD and [`sync`] share one).
pub(crate) fn diagnose_listing(listing: &Listing, desired: &Entry) -> OwnedDiagnosis {
    let mut d = OwnedDiagnosis {
        primary: listing.configs.first().cloned(),
        ours: None,
        state: OwnedState::NoPrimary,
        owned: listing.owned.clone(),
        renamed: listing
            .renamed
            .iter()
            .filter(|p| {
                scan::read_file(p)
                    .ok()
                    .and_then(|b| marker_in(&b))
                    .is_some()
            })
            .cloned()
            .collect(),
        inline_entry: false,
        marker: None,
        expected: None,
    };
    let Some(primary) = d.primary.clone() else {
        return d;
    };
    let dir = write::parent(&primary);
    d.ours = Some(dir.join(owned_name(primary.file_name().unwrap_or_default())));
    // Through its symlink as the host resolves it: only read, never written.
    let bytes = match listing.read(&primary) {
        Ok(b) => b,
        Err(e) => {
            d.state = OwnedState::PrimaryInvalid {
                reason: format!("cannot read it: {e}"),
            };
            return d;
        }
    };
    d.inline_entry = Kind::of(&primary) == Kind::List && plan::without_entries(&bytes).is_some();
    if let Some(r) = d.renamed.first() {
        d.state = OwnedState::Fallback {
            reason: format!(
                "another agent renamed our file to {} (Cilium with cni.exclusive=true does this): \
                 configure it to leave other configs in place (for Cilium: cni.exclusive=false), \
                 then remove that file",
                r.display()
            ),
        };
        return d;
    }
    match copy_of(&primary, &bytes, desired) {
        Err(NotTaken::Invalid(reason)) => d.state = OwnedState::PrimaryInvalid { reason },
        Err(NotTaken::Meta(why)) => {
            d.state = OwnedState::Fallback {
                reason: format!(
                    "{} is a meta-plugin's config ({why}); it is never shadowed",
                    primary.display()
                ),
            }
        }
        Err(NotTaken::NoPrimaryPlugin) => {
            d.state = OwnedState::Fallback {
                reason: format!("{} holds no plugin but linkerd-cni", primary.display()),
            }
        }
        Ok((content, marker)) => {
            d.marker = Some(marker);
            let ours = d.ours.clone().unwrap_or_default();
            d.state = match scan::read_file(&ours) {
                Ok(have) if same_copy(&have, &content, desired) && d.owned == [ours.clone()] => {
                    OwnedState::Current
                }
                Ok(_) => OwnedState::Outdated,
                Err(_) => OwnedState::Missing,
            };
            d.expected = Some(content);
        }
    }
    d
}

/// Keys a runtime sets in every plugin's config: an entry rebuilt from the
/// plugin's stdin cannot know their value in the file.
const RUNTIME_SET: [&str; 2] = ["name", "cniVersion"];

/// Whether our file's content `have` is the copy `want`: the same JSON
/// (formatting aside), our entry's runtime-set keys compared only when the
/// desired entry has them. A copy that means the same is never rewritten.
fn same_copy(have: &[u8], want: &[u8], desired: &Entry) -> bool {
    let parse = |b: &[u8]| -> Option<Value> {
        let mut v: Value = serde_json::from_slice(b).ok()?;
        if let Some(last) = v
            .get_mut("plugins")
            .and_then(Value::as_array_mut)
            .and_then(|p| p.last_mut())
            .and_then(Value::as_object_mut)
        {
            for k in RUNTIME_SET {
                if !desired.contains_key(k) {
                    last.remove(k);
                }
            }
        }
        Some(v)
    };
    have == want || parse(have).is_some_and(|h| Some(h) == parse(want))
}

/// Read-only diagnosis in owned mode (no lock, no write).
pub fn diagnose(conf_dir: &Path, desired: &Entry) -> Result<OwnedDiagnosis, ChainError> {
    diagnose_with(conf_dir, desired, &RepairOptions::default())
}

/// [`diagnose`] as [`sync`] with `opts` sees the conf dir (a symlinked
/// primary resolved under `opts.host_root`).
pub fn diagnose_with(
    conf_dir: &Path,
    desired: &Entry,
    opts: &RepairOptions,
) -> Result<OwnedDiagnosis, ChainError> {
    Ok(diagnose_listing(
        &scan::list(conf_dir, opts.link_rule())?,
        desired,
    ))
}

/// What [`sync`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncReport {
    /// Whether anything in the conf dir changed.
    pub changed: bool,
    /// Our file was written where none was (for fight detection).
    pub created: bool,
    /// The state after the sync.
    pub after: OwnedState,
    /// One line for logs.
    pub summary: String,
}

/// Rewrites the primary's chain this many times at most when it keeps
/// changing while we copy it.
const MAX_ROUNDS: u32 = 8;

/// Brings the conf dir to owned mode's state, under the conf-dir lock:
/// writes our file when its content changes, removes our files whose
/// primary is gone or replaced, and then takes inline mode's entry out of
/// the primary's file. In [`OwnedState::Fallback`] and
/// [`OwnedState::PrimaryInvalid`] it writes nothing: the caller falls back
/// to inline repair, or waits.
pub fn sync(
    conf_dir: &Path,
    desired: &Entry,
    opts: &RepairOptions,
) -> Result<SyncReport, ChainError> {
    let mut report = {
        let _lock = lock::lock_dir(conf_dir, opts.lock_timeout, opts.deadline)?;
        sync_locked(conf_dir, desired, opts)?
    };
    if report.after == OwnedState::Current {
        let listing = scan::list(conf_dir, opts.link_rule())?;
        if diagnose_listing(&listing, desired).inline_entry {
            // Our file is in place: the primary's file is no longer loaded,
            // and our entry in it only matters to runtimes that load every
            // file. Taken out with the inline repair's write discipline.
            let files = repair::remove_entries(conf_dir, opts)?;
            if !files.is_empty() {
                report.changed = true;
                report.summary.push_str(&format!(
                    "; took inline mode's linkerd-cni entry out of {}",
                    files
                        .iter()
                        .map(|f| f.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
    }
    Ok(report)
}

fn sync_locked(
    conf_dir: &Path,
    desired: &Entry,
    opts: &RepairOptions,
) -> Result<SyncReport, ChainError> {
    let mut changed = false;
    let mut created = false;
    let mut notes: Vec<String> = Vec::new();
    for _ in 0..MAX_ROUNDS {
        let mut listing = scan::list(conf_dir, opts.link_rule())?;
        // Before anything is decided, as the inline repair does: a killed
        // repair's leftovers go, and a primary's write it displaced comes
        // back (it is what we must copy).
        let recovery = repair::recover(conf_dir, &listing, &opts.host_root)?;
        if recovery.removed > 0 {
            notes.push(format!(
                "removed {} leftover temp file(s)",
                recovery.removed
            ));
        }
        if !recovery.restored.is_empty() {
            notes.extend(recovery.restored);
            changed = true;
            listing = scan::list(conf_dir, opts.link_rule())?;
        }
        let d = diagnose_listing(&listing, desired);
        let writing_allowed = opts.requires.as_ref().is_none_or(|r| r.exists());
        match (&d.state, &d.ours, &d.expected) {
            (OwnedState::Missing | OwnedState::Outdated, Some(ours), Some(content))
                if writing_allowed =>
            {
                if opts
                    .deadline
                    .is_some_and(|t| std::time::Instant::now() >= t)
                {
                    return Err(ChainError::Deadline { path: ours.clone() });
                }
                let existed = ours.exists();
                let differs = scan::read_file(ours).ok().as_deref() != Some(&content[..]);
                if differs {
                    let like = d.primary.as_ref().and_then(|p| fs::metadata(p).ok());
                    put(conf_dir, ours, content, like.as_ref())?;
                    changed = true;
                    created |= !existed;
                    notes.push(format!(
                        "wrote {} from {}",
                        ours.display(),
                        d.primary
                            .as_ref()
                            .map_or(String::new(), |p| p.display().to_string())
                    ));
                }
                let removed = remove_all(conf_dir, d.owned.iter().filter(|o| *o != ours))?;
                changed |= !removed.is_empty();
                for r in removed {
                    notes.push(format!(
                        "removed {} (its primary is gone or replaced)",
                        r.display()
                    ));
                }
                // The primary may have changed while we copied it: look again.
                continue;
            }
            (OwnedState::Missing | OwnedState::Outdated, _, _) => {
                return Ok(SyncReport {
                    changed,
                    created,
                    after: d.state.clone(),
                    summary: match &opts.requires {
                        Some(r) => format!(
                            "not writing our config: {} is gone (linkerd-cni is being uninstalled, or its installer has not run yet)",
                            r.display()
                        ),
                        None => "our config cannot be written".into(),
                    },
                });
            }
            (OwnedState::NoPrimary, _, _) => {
                let removed = remove_all(conf_dir, d.owned.iter())?;
                changed |= !removed.is_empty();
                for r in removed {
                    notes.push(format!(
                        "removed {}: the primary's config is gone, so must be its copy",
                        r.display()
                    ));
                }
            }
            (OwnedState::Current, Some(ours), _) => {
                let removed = remove_all(conf_dir, d.owned.iter().filter(|o| *o != ours))?;
                changed |= !removed.is_empty();
                for r in removed {
                    notes.push(format!(
                        "removed {} (its primary is gone or replaced)",
                        r.display()
                    ));
                }
            }
            _ => {}
        }
        let after = if changed {
            diagnose_listing(&scan::list(conf_dir, opts.link_rule())?, desired).state
        } else {
            d.state.clone()
        };
        let mut summary = if notes.is_empty() {
            format!("owned config: {after}; nothing written")
        } else {
            notes.join("; ")
        };
        if changed {
            summary.push_str(&format!("; now {after}"));
        }
        return Ok(SyncReport {
            changed,
            created,
            after,
            summary,
        });
    }
    Err(ChainError::Contended {
        path: conf_dir.to_path_buf(),
        attempts: MAX_ROUNDS,
    })
}

/// Writes our file: a temp file in the conf dir, then a rename (never a
/// file moved in from elsewhere: containerd 1.6 does not notice those).
fn put(
    conf_dir: &Path,
    path: &Path,
    content: &[u8],
    like: Option<&fs::Metadata>,
) -> Result<(), ChainError> {
    let tmp = write::write_temp(conf_dir, content, like)
        .map_err(|e| ChainError::io("write a temp file in", conf_dir, e))?;
    if let Err(e) = fs::rename(&tmp, path) {
        let _ = fs::remove_file(&tmp);
        return Err(ChainError::io("rename a temp file to", path, e));
    }
    write::fsync_dir(conf_dir).map_err(|e| ChainError::io("fsync", conf_dir, e))
}

fn remove_all<'a>(
    conf_dir: &Path,
    files: impl Iterator<Item = &'a PathBuf>,
) -> Result<Vec<PathBuf>, ChainError> {
    let mut removed = Vec::new();
    for f in files {
        match fs::remove_file(f) {
            Ok(()) => removed.push(f.clone()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(ChainError::io("remove", f, e)),
        }
    }
    if !removed.is_empty() {
        write::fsync_dir(conf_dir).map_err(|e| ChainError::io("fsync", conf_dir, e))?;
    }
    Ok(removed)
}

/// Removes every file of ours (uninstall; switching to inline mode once the
/// primary's file holds our entry; a fallback). Returns the files removed.
pub fn retire(conf_dir: &Path, opts: &RepairOptions) -> Result<Vec<PathBuf>, ChainError> {
    let _lock = lock::lock_dir(conf_dir, opts.lock_timeout, opts.deadline)?;
    let mut listing = scan::list(conf_dir, opts.link_rule())?;
    if !repair::recover(conf_dir, &listing, &opts.host_root)?
        .restored
        .is_empty()
    {
        listing = scan::list(conf_dir, opts.link_rule())?;
    }
    remove_all(conf_dir, listing.owned.iter())
}

/// Whether the conf dir holds any file of ours (a cheap look: names first).
pub fn has_owned(conf_dir: &Path) -> Result<bool, ChainError> {
    let rule = RepairOptions::default();
    Ok(!scan::list(conf_dir, rule.link_rule())?.owned.is_empty())
}

/// What [`converge`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Converged {
    pub changed: bool,
    /// One line for logs.
    pub summary: String,
}

/// Brings the conf dir to what `desired`'s mode asks, in the order that
/// never leaves the runtime a chain without linkerd-cni: in inline mode the
/// entry goes into the primary's file before our files go; in owned mode
/// our file goes in before the entry leaves the primary's; when owned mode
/// falls back, inline repair runs first. For the installer without its fight
/// detection, and the `chain repair` command.
pub fn converge(
    conf_dir: &Path,
    desired: &Entry,
    opts: &RepairOptions,
) -> Result<Converged, ChainError> {
    let inline = |notes: &mut Vec<String>| -> Result<bool, ChainError> {
        let r = repair::repair(conf_dir, desired, opts)?;
        notes.push(r.summary);
        let mut changed = r.changed;
        if super::diagnose(conf_dir, desired)?.state == super::ChainState::Healthy {
            for f in retire(conf_dir, opts)? {
                changed = true;
                notes.push(format!(
                    "removed {} (inline mode keeps no file of its own)",
                    f.display()
                ));
            }
        }
        Ok(changed)
    };
    let mut notes = Vec::new();
    let changed = match mode_of(desired)? {
        ChainMode::Inline => inline(&mut notes)?,
        ChainMode::Owned => {
            let r = sync(conf_dir, desired, opts)?;
            notes.push(r.summary);
            match r.after {
                OwnedState::Fallback { reason } => {
                    notes.push(reason);
                    inline(&mut notes)? || r.changed
                }
                _ => r.changed,
            }
        }
    };
    Ok(Converged {
        changed,
        summary: notes.join("; "),
    })
}

#[cfg(test)]
mod tests;
