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
//!   name alone, and only when the marker verifies ([`mod@marker`]);
//! - the copy ([`copy_of`]): the primary's chain (`name`, `cniVersion`,
//!   plugins, unknown fields, byte for byte where the inline repair keeps
//!   them) minus any linkerd-cni entry, our entry last; a single-plugin
//!   `.conf` primary gives a conflist copy;
//! - keeping it in sync (`sync`, sequenced by [`crate::keep`]), under the conf-dir lock, written in the
//!   conf dir (temp file + rename), only when its content changes; removing
//!   our files whose primary is gone, at once;
//! - telling an ADD that ran a stale copy ([`OwnedDiagnosis::stale`]): the
//!   runtime hands the plugin its entry as loaded, marker included;
//! - when owned mode does not apply and inline repair takes over
//!   ([`OwnedState::Fallback`]): a meta-plugin at the front (Multus and the
//!   like: shadowing it would take the pods' other networks away), a
//!   primary holding nothing but linkerd-cni, and another agent that renames
//!   our file away (Cilium with `cni.exclusive=true`).
//!
//! The primary's file is only read here. Switching from inline mode, the
//! keeper ([`crate::keep`]) takes our old entry out of it once our file is
//! in place.

mod marker;

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::names::{Kind, file_name, owned_name};
use crate::recover;
use crate::scan::{self, Listing};
use crate::{
    Action, ChainError, ChainState, Entry, PLUGIN_TYPE, RepairOptions, Retired, lock, plan, sha256,
    write,
};

pub use crate::names::OWNED_SUFFIX;
pub use marker::Marker;
pub(crate) use marker::list;

/// The entry key that selects the chain mode: `"inline"` (the default when
/// absent) or `"owned"`.
pub const MODE_KEY: &str = "chain_mode";

/// The key of our entry in an owned file: `{"file": <the primary's file
/// name>, "sha256": <digest of the primary's chain as copied>}`.
pub const MARKER_KEY: &str = "owned_copy_of";

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
    let found = match entry.get(MODE_KEY) {
        None | Some(Value::Null) => return Ok(ChainMode::Inline),
        Some(found) => found,
    };
    found
        .as_str()
        .and_then(ChainMode::parse)
        .ok_or_else(|| ChainError::InvalidEntry {
            origin: "the desired entry".into(),
            problem: super::EntryProblem::UnknownMode {
                key: MODE_KEY,
                found: found.to_string(),
            },
        })
}

/// Plugin types that delegate to other networks: never shadowed.
const META_TYPES: [&str; 4] = ["multus", "multus-shim", "genie", "danm"];
/// Keys by which a plugin delegates to whole networks (Multus, Genie).
const META_KEYS: [&str; 3] = ["delegates", "clusterNetwork", "defaultNetworks"];

/// Why a config is a meta-plugin's, if it is.
fn meta_plugin(kind: Kind, top: &Map<String, Value>) -> Option<String> {
    let single;
    let all: &[Value] = match kind {
        Kind::List => top
            .get("plugins")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default(),
        Kind::Single => {
            single = [Value::Object(top.clone())];
            &single
        }
    };
    for p in all {
        let t = p.get("type").and_then(Value::as_str).unwrap_or("?");
        // Our own entries are never the meta-plugin, whatever keys a stale
        // or hand-edited one carries: they are dropped from the copy.
        if t == PLUGIN_TYPE {
            continue;
        }
        if META_TYPES.contains(&t) {
            return Some(format!("plugin type {t:?} is a meta-plugin"));
        }
        if let Some(k) = META_KEYS.iter().find(|k| p.get(**k).is_some()) {
            return Some(format!("plugin {t:?} delegates to other networks ({k:?})"));
        }
    }
    None
}

/// The primary's chain as copied: its bytes minus any linkerd-cni entry.
/// Our own entry being added to or removed from the primary's file (a mode
/// switch) does not change it.
fn primary_chain(kind: Kind, bytes: &[u8]) -> Vec<u8> {
    match kind {
        Kind::List if plan::mentions(bytes, PLUGIN_TYPE) => {
            plan::without_entries(bytes).unwrap_or_else(|| bytes.to_vec())
        }
        _ => bytes.to_vec(),
    }
}

/// The digest recorded in the marker for a primary holding `bytes`.
pub(crate) fn chain_digest(primary: &Path, bytes: &[u8]) -> String {
    sha256::hex(&primary_chain(Kind::of(primary), bytes))
}

/// The digest of what a primary holding `bytes` means to a runtime: its
/// chain parsed and written again in one canonical form (object keys
/// sorted, no whitespace), so that a rewrite that only reindents the file
/// or reorders its keys has the digest of the chain before it. `None` when
/// the chain is not JSON.
pub(crate) fn meaning_digest(primary: &Path, bytes: &[u8]) -> Option<String> {
    meaning_of(&primary_chain(Kind::of(primary), bytes))
}

fn meaning_of(chain: &[u8]) -> Option<String> {
    let mut v: Value = serde_json::from_slice(chain).ok()?;
    // `str` order is byte order and `Display` is compact: the form the
    // digests in owned files on disk were made from.
    v.sort_all_objects();
    Some(sha256::hex(v.to_string().as_bytes()))
}

/// The content of our file for the primary `primary` holding `bytes`, and
/// the marker it records; or, when the primary is not taken over, owned
/// mode's state (a fallback, or a primary that cannot be loaded).
pub(crate) fn copy_of(
    primary: &Path,
    bytes: &[u8],
    desired: &Entry,
) -> Result<(Vec<u8>, Marker), OwnedState> {
    /// The last copy made: a keeper's pass looks at the primary without
    /// the lock, then again under it, most often at the very same bytes,
    /// and making the copy (parsed, checked, digested, written out) is
    /// most of what each look costs on the way to the write.
    type Memo = (
        PathBuf,
        Vec<u8>,
        Map<String, Value>,
        Result<(Vec<u8>, Marker), OwnedState>,
    );
    static LAST: std::sync::Mutex<Option<Memo>> = std::sync::Mutex::new(None);
    let mut last = LAST
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((p, b, d, copy)) = last.as_ref()
        && (p.as_path(), b.as_slice(), d) == (primary, bytes, desired.as_map())
    {
        return copy.clone();
    }
    let copy = make_copy(primary, bytes, desired);
    *last = Some((
        primary.to_path_buf(),
        bytes.to_vec(),
        desired.as_map().clone(),
        copy.clone(),
    ));
    copy
}

fn make_copy(
    primary: &Path,
    bytes: &[u8],
    desired: &Entry,
) -> Result<(Vec<u8>, Marker), OwnedState> {
    let invalid = |reason| OwnedState::PrimaryInvalid { reason };
    let fallback = |why: &str| OwnedState::Fallback {
        reason: format!("{} {why}", primary.display()),
    };
    let kind = Kind::of(primary);
    let top = plan::parse(kind, bytes).map_err(invalid)?;
    if let Some(why) = meta_plugin(kind, &top) {
        return Err(fallback(&format!(
            "is a meta-plugin's config ({why}); it is never shadowed"
        )));
    }
    let chain = primary_chain(kind, bytes);
    let marker = Marker {
        file: file_name(primary),
        sha256: sha256::hex(&chain),
        meaning: meaning_of(&chain),
    };
    let mut entry = desired.as_map().clone();
    entry.insert(MARKER_KEY.into(), marker.to_value());
    match plan::analyze(kind, &chain, &entry).state {
        ChainState::NoPrimaryPlugin => {
            return Err(fallback("holds no plugin but linkerd-cni"));
        }
        ChainState::Invalid { reason } => return Err(invalid(reason)),
        _ => {}
    }
    match plan::repaired(kind, &chain, &entry) {
        Some(content) => Ok((content, marker)),
        None => Err(invalid("cannot be copied".into())),
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
        let name = file_name(primary);
        if name != ran.file {
            return Some(format!(
                "the primary's config is now {name}, the chain that ran was copied from {}",
                ran.file
            ));
        }
        if self.marker.as_ref().is_some_and(|m| m.sha256 == ran.sha256) {
            return None;
        }
        let bytes = match scan::read_file(primary) {
            Ok(bytes) => bytes,
            Err(e) => return Some(format!("{name} cannot be read: {e}")),
        };
        if chain_digest(primary, &bytes) == ran.sha256 {
            return None;
        }
        // Other bytes, maybe the same chain: a rewrite that only reformats
        // the file is no reason for a pod to start again.
        if ran.meaning.is_some() && meaning_digest(primary, &bytes) == ran.meaning {
            return None;
        }
        Some(format!("{name} changed after the runtime loaded its copy"))
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
///
/// The healthy path parses only our file (read once, by the listing's
/// classification): the primary's chain is compared with our copy through
/// the marker's digest, and our entry with the desired one. The copy is
/// rebuilt only when it must be written.
pub(crate) fn diagnose_listing(listing: &Listing, desired: &Entry) -> OwnedDiagnosis {
    // Where the conf dir holds no primary, this is the whole diagnosis.
    let mut d = OwnedDiagnosis {
        primary: listing.configs.first().cloned(),
        ours: None,
        state: OwnedState::NoPrimary,
        owned: listing.owned.iter().map(|o| o.path.clone()).collect(),
        inline_entry: false,
        marker: None,
        expected: None,
    };
    let Some(primary) = d.primary.clone() else {
        return d;
    };
    let dir = write::parent(&primary);
    let ours = dir.join(owned_name(primary.file_name().unwrap_or_default()));
    d.ours = Some(ours.clone());
    let bytes = match read_primary(listing, &primary) {
        Ok(b) => b,
        Err(state) => {
            d.state = state;
            return d;
        }
    };
    let kind = Kind::of(&primary);
    d.inline_entry = kind == Kind::List
        && plan::mentions(&bytes, PLUGIN_TYPE)
        && plan::without_entries(&bytes).is_some();
    if let Some(r) = listing.renamed.first() {
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
    let have = listing.owned.iter().find(|o| o.path == ours);
    let chain = primary_chain(kind, &bytes);
    let marker = marker_of(have, &primary, &chain);
    // Our copy of the same file's same bytes (the meaning follows from
    // those), with the desired entry.
    if let Some(o) = have
        && Marker::of(&o.entry).is_some_and(|m| m.file == marker.file && m.sha256 == marker.sha256)
        && same_entry(&o.entry, desired)
    {
        // The primary's content is the one copied (and checked) then.
        d.marker = Some(marker);
        d.state = if d.owned.len() == 1 {
            OwnedState::Current
        } else {
            OwnedState::Outdated
        };
        return d;
    }
    // Not the current copy: why the primary is not taken over, or what our
    // file must hold.
    match copy_of(&primary, &bytes, desired) {
        Err(state) => d.state = state,
        Ok((content, marker)) => {
            d.marker = Some(marker);
            d.state = match have.is_some() || ours.exists() {
                true => OwnedState::Outdated,
                false => OwnedState::Missing,
            };
            d.expected = Some(content);
        }
    }
    d
}

/// The primary's bytes, or why nothing may be decided about it: a file we
/// cannot read might be our own copy as well as the primary's.
fn read_primary(listing: &Listing, primary: &Path) -> Result<Vec<u8>, OwnedState> {
    if let Some((_, why)) = listing.unreadable.iter().find(|(p, _)| p == primary) {
        return Err(OwnedState::PrimaryInvalid {
            reason: format!(
                "cannot read it ({why}), so cannot tell whether it is linkerd-cni's own file or the primary's; nothing is changed until it can be read"
            ),
        });
    }
    // Through its symlink as the host resolves it: only read, never written.
    listing
        .read(primary)
        .map_err(|e| OwnedState::PrimaryInvalid {
            reason: format!("cannot read it: {e}{}", crate::error::permission_hint(&e)),
        })
}

/// The marker a copy of the primary's `chain` carries. Our copy holding
/// these very bytes lends its verified digest (and its meaning, once
/// computed); otherwise the digest is computed now.
fn marker_of(have: Option<&scan::OwnedFile>, primary: &Path, chain: &[u8]) -> Marker {
    let known = have
        .filter(|o| o.chain.as_deref() == Some(chain))
        .and_then(|o| Marker::of(&o.entry));
    known
        .map(|m| Marker {
            file: file_name(primary),
            ..m
        })
        .unwrap_or_else(|| Marker {
            file: file_name(primary),
            sha256: sha256::hex(chain),
            // Computed where it is used (a stale ADD, a new copy): the
            // healthy check does not pay for it.
            meaning: None,
        })
}

/// Whether our entry as read (its marker aside) is the desired one; its
/// runtime-set keys compared only when the desired entry has them. A copy
/// that means the same is never rewritten.
fn same_entry(have: &Map<String, Value>, desired: &Entry) -> bool {
    let strip = |m: &Map<String, Value>| -> Map<String, Value> {
        m.iter()
            .filter(|(k, _)| k.as_str() != MARKER_KEY)
            .filter(|(k, _)| !plan::RUNTIME_SET.contains(&k.as_str()) || desired.contains_key(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    strip(have) == strip(desired.as_map())
}

/// Read-only diagnosis in owned mode (no lock, no write), with default
/// options.
#[cfg(test)]
pub(crate) fn diagnose(conf_dir: &Path, desired: &Entry) -> Result<OwnedDiagnosis, ChainError> {
    diagnose_with(conf_dir, desired, &RepairOptions::default())
}

/// Read-only diagnosis in owned mode (no lock, no write), as a sync with
/// `opts` sees the conf dir (a symlinked primary resolved under
/// `opts.host_root`).
#[cfg(test)]
pub(crate) fn diagnose_with(
    conf_dir: &Path,
    desired: &Entry,
    opts: &RepairOptions,
) -> Result<OwnedDiagnosis, ChainError> {
    Ok(diagnose_listing(&list(conf_dir, opts)?, desired))
}

/// What [`sync`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SyncReport {
    /// What changed in the conf dir, in order, as the keeper reports it.
    pub actions: Vec<Action>,
    /// Our file was written where none was (for fight detection).
    pub created: bool,
    /// The state after the sync.
    pub after: OwnedState,
    /// The file whose absence withheld the copy although it is missing or
    /// outdated ([`RepairOptions::requires`]).
    pub withheld: Option<PathBuf>,
}

impl SyncReport {
    fn new(actions: Vec<Action>, after: OwnedState, withheld: Option<PathBuf>) -> SyncReport {
        SyncReport {
            created: actions
                .iter()
                .any(|a| matches!(a, Action::Copied { created: true, .. })),
            actions,
            after,
            withheld,
        }
    }
}

/// Rewrites the primary's chain this many times at most when it keeps
/// changing while we copy it.
const MAX_ROUNDS: u32 = 8;

/// Brings the conf dir to owned mode's state, under the conf-dir lock:
/// writes our file when its content changes, and removes our files whose
/// primary is gone or replaced. In [`OwnedState::Fallback`] and
/// [`OwnedState::PrimaryInvalid`] it writes nothing: the keeper falls back
/// to inline repair, or waits.
pub(crate) fn sync(
    conf_dir: &Path,
    desired: &Entry,
    opts: &RepairOptions,
) -> Result<SyncReport, ChainError> {
    let _lock = lock::lock_dir(conf_dir, opts.lock_timeout, opts.deadline)?;
    let mut actions = Vec::new();
    for _ in 0..MAX_ROUNDS {
        let (listing, recovery) = recover::recovered_listing(conf_dir, opts)?;
        actions.extend(recovery);
        let d = diagnose_listing(&listing, desired);
        match (&d.state, &d.ours) {
            (OwnedState::Missing | OwnedState::Outdated | OwnedState::Current, Some(ours)) => {
                // A current copy (never `expected`) only has stale files of
                // ours to remove: no requirement for that.
                let due = d.state != OwnedState::Current;
                if let Some(r) = opts.requires.as_ref().filter(|r| due && !r.exists()) {
                    return Ok(SyncReport::new(actions, d.state, Some(r.clone())));
                }
                if let Some(content) = &d.expected {
                    write_copy(conf_dir, &d, ours, content, opts, &mut actions)?;
                }
                let others = d.owned.iter().filter(|o| *o != ours);
                remove_stale(conf_dir, others, Retired::Replaced, &mut actions)?;
                // Written: current, unless the primary changed while we
                // copied it. Only the primary is read again: the rest of the
                // conf dir was looked at under this lock, and a write our
                // watch sees brings another pass.
                if d.expected.is_some() {
                    if still_copied(&listing, &d) {
                        return Ok(SyncReport::new(actions, OwnedState::Current, None));
                    }
                    continue;
                }
            }
            (OwnedState::NoPrimary, _) => {
                remove_stale(conf_dir, d.owned.iter(), Retired::PrimaryGone, &mut actions)?;
            }
            _ => {}
        }
        let after = if changed(&actions) {
            diagnose_listing(&list(conf_dir, opts)?, desired).state
        } else {
            d.state
        };
        return Ok(SyncReport::new(actions, after, None));
    }
    Err(ChainError::Contended {
        path: conf_dir.to_path_buf(),
        attempts: MAX_ROUNDS,
    })
}

/// Whether anything in the conf dir changed (more than leftovers).
fn changed(actions: &[Action]) -> bool {
    actions.iter().any(|a| !matches!(a, Action::Leftovers(_)))
}

/// Whether the primary still holds the chain `d`'s copy was made from.
fn still_copied(listing: &Listing, d: &OwnedDiagnosis) -> bool {
    let (Some(primary), Some(marker)) = (&d.primary, &d.marker) else {
        return false;
    };
    listing
        .read(primary)
        .is_ok_and(|b| chain_digest(primary, &b) == marker.sha256)
}

fn write_copy(
    conf_dir: &Path,
    d: &OwnedDiagnosis,
    ours: &Path,
    content: &[u8],
    opts: &RepairOptions,
    actions: &mut Vec<Action>,
) -> Result<(), ChainError> {
    // Nothing is written where it could never be renamed into place (every
    // write wakes the runtime).
    if fs::symlink_metadata(ours).is_ok_and(|m| m.is_dir()) {
        return Err(ChainError::Refused {
            path: ours.to_path_buf(),
            reason: "a directory has its name; remove it".into(),
        });
    }
    if crate::options::past(opts.deadline) {
        return Err(ChainError::Deadline {
            path: ours.to_path_buf(),
        });
    }
    let existed = ours.exists();
    let like = d.primary.as_ref().and_then(|p| fs::metadata(p).ok());
    put(conf_dir, ours, content, like.as_ref())?;
    actions.push(Action::Copied {
        file: ours.to_path_buf(),
        from: d.primary.clone().unwrap_or_default(),
        created: !existed,
    });
    Ok(())
}

fn remove_stale<'a>(
    conf_dir: &Path,
    files: impl Iterator<Item = &'a PathBuf>,
    why: Retired,
    actions: &mut Vec<Action>,
) -> Result<(), ChainError> {
    for file in remove_all(conf_dir, files)? {
        actions.push(Action::Retired { file, why });
    }
    Ok(())
}

/// Writes our file: a temp file in the conf dir, never a file moved in
/// from elsewhere (containerd 1.6 does not notice those). It is swapped in
/// before the disk is waited for, as the inline repair's is (see
/// [`write`]'s docs): the copy it displaces stays under the temp name until
/// ours is fsynced, for recovery to put back if a crash loses ours. Where
/// nothing is displaced (a first copy, no `RENAME_EXCHANGE`), a crash that
/// loses ours leaves a lost file, which recovery removes for the next
/// round to write again ([`marker::list`]).
fn put(
    conf_dir: &Path,
    path: &Path,
    content: &[u8],
    like: Option<&fs::Metadata>,
) -> Result<(), ChainError> {
    let old = scan::read_file(path).ok();
    let intent = write::Intent::Swap {
        back: false,
        target: write::name_digest(path),
        expected: write::digest(old.as_deref().unwrap_or_default()),
        put: Some(write::digest(content)),
    };
    let (tmp, file) = write::write_temp(conf_dir, Some(&intent), content, like)?;
    let placed = match old {
        Some(_) => match write::exchange(&tmp, path) {
            // Gone since, or no exchange here: nothing to keep.
            Err(e) if e.kind() == io::ErrorKind::NotFound || write::unsupported(&e) => {
                fs::rename(&tmp, path)
            }
            r => r,
        },
        None => fs::rename(&tmp, path),
    };
    if let Err(e) = placed {
        let _ = fs::remove_file(&tmp);
        return Err(ChainError::io("put in place", path, e));
    }
    #[cfg(test)]
    crate::inline::testing::after_exchange();
    write::settle(Some(&file), &tmp, conf_dir).map_err(|e| ChainError::io("fsync", path, e))
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
pub(crate) fn retire(conf_dir: &Path, opts: &RepairOptions) -> Result<Vec<PathBuf>, ChainError> {
    let _lock = lock::lock_dir(conf_dir, opts.lock_timeout, opts.deadline)?;
    let (listing, _) = recover::recovered_listing(conf_dir, opts)?;
    remove_all(conf_dir, listing.owned.iter().map(|o| &o.path))
}

#[cfg(test)]
mod tests;
