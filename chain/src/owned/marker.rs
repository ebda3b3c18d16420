//! Recognising owned mode's files: a config named like ours is ours only
//! when its last plugin is one of our entries carrying a marker that
//! verifies, i.e. whose digest is that of the chain the file holds (for a
//! copy of a `.conflist`: the file's text minus our entry, byte for byte).
//! A file that merely looks like ours is a config like any other, and one
//! that cannot be read is neither: it is reported, and nothing is decided
//! about it.
//!
//! [`list`] is the conf dir as every layout sees it: the listing (names
//! only) with the candidates read and sorted out.

use std::fs;
use std::io;
use std::path::Path;

use serde_json::{Map, Value, json};

use crate::names::Kind;
use crate::scan::{self, Listing, OwnedFile};
use crate::{ChainError, RepairOptions, plan, sha256, text, write};

use super::MARKER_KEY;

/// The marker's key for [`Marker::meaning`].
const MEANING_KEY: &str = "meaning_sha256";

/// What the marker of an owned file's entry records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    /// The primary's file name (no directory).
    pub file: String,
    /// SHA-256 of the primary's chain as copied (see [`super::chain_digest`]).
    pub sha256: String,
    /// SHA-256 of that chain's meaning (see [`super::meaning_digest`]):
    /// what tells a primary's rewrite that only reformats its file from
    /// one that changes the chain. Absent in copies made before it was
    /// recorded.
    pub meaning: Option<String>,
}

impl Marker {
    /// The marker of an entry (as in our file, or on the plugin's stdin).
    pub fn of(entry: &Map<String, Value>) -> Option<Marker> {
        let m = entry.get(MARKER_KEY)?.as_object()?;
        Some(Marker {
            file: m.get("file")?.as_str()?.to_string(),
            sha256: m.get("sha256")?.as_str()?.to_string(),
            meaning: m
                .get(MEANING_KEY)
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }

    pub(crate) fn to_value(&self) -> Value {
        let mut v = json!({"file": self.file, "sha256": self.sha256});
        if let (Some(meaning), Value::Object(m)) = (&self.meaning, &mut v) {
            m.insert(MEANING_KEY.into(), meaning.as_str().into());
        }
        v
    }
}

/// One of our files (its entry, marker included, and the chain it holds),
/// when `bytes` are those of one of our files and the marker verifies. Cheap on anything else: a file that does not mention
/// the marker key is not parsed.
pub(crate) fn ours_in(path: &Path, bytes: &[u8]) -> Option<OwnedFile> {
    if !plan::mentions(bytes, MARKER_KEY) {
        return None;
    }
    let top = plan::parse(Kind::List, bytes).ok()?;
    let plugins = top.get("plugins")?.as_array()?;
    let last = plugins.last().filter(|p| plan::is_ours(p))?.as_object()?;
    let marker = Marker::of(last)?;
    let chain = verified_chain(bytes, &marker, plugins.len())?;
    Some(OwnedFile {
        path: path.to_path_buf(),
        entry: last.clone(),
        chain,
    })
}

/// Whether the file's chain (its text minus our entry, the last plugin) is
/// the one the marker's digest names. A copy of a single-plugin file wraps
/// it in a new list, so there the marker's structure is all there is to
/// check.
/// `Some(chain)` when it verifies (`Some(None)` for a single-plugin copy).
fn verified_chain(bytes: &[u8], marker: &Marker, plugins: usize) -> Option<Option<Vec<u8>>> {
    if Kind::of(Path::new(&marker.file)) == Kind::Single {
        return (plugins == 2).then_some(None);
    }
    let t = std::str::from_utf8(bytes).ok()?;
    let arr = text::find_plugins(t)?;
    let keep: Vec<usize> = (0..arr.elems.len().saturating_sub(1)).collect();
    let chain = text::splice_plugins(t, &arr, &keep, None)?;
    (sha256::hex(chain.as_bytes()) == marker.sha256).then(|| Some(chain.into_bytes()))
}

/// The conf dir as every layout sees it: the listing with its candidates
/// (configs named like ours) sorted out: ours when the marker verifies, a
/// config like any other when not, a leftover when a crash lost its
/// content ([`write::lost`]); one that cannot be read stays a config (the
/// runtime sees it) and is also listed as unreadable, so that owned mode
/// never takes it for a primary. Also keeps only those renamed-looking
/// names that hold a marker.
pub(crate) fn list(conf_dir: &Path, opts: &RepairOptions) -> Result<Listing, ChainError> {
    let mut listing = scan::list(conf_dir, opts)?;
    let mut others = false;
    for c in std::mem::take(&mut listing.candidates) {
        match listing.read(&c).map(|b| (write::lost(&b), ours_in(&c, &b))) {
            // A copy of ours a crash lost before it reached the disk (one
            // that displaced nothing to put back): no config, for anyone.
            // Recovery removes it; the primary's is copied again.
            Ok((true, _)) if fs::symlink_metadata(&c).is_ok_and(|m| m.is_file()) => {
                listing.leftovers.push(c)
            }
            Ok((_, Some(ours))) => listing.owned.push(ours),
            Ok((_, None)) => {
                listing.configs.push(c);
                others = true;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            // Still a config to the runtime, which may fail to load it too.
            Err(e) => {
                let why = format!("{e}{}", crate::error::permission_hint(&e));
                listing.unreadable.push((c.clone(), why));
                listing.configs.push(c);
                others = true;
            }
        }
    }
    if others {
        scan::sort_by_name(&mut listing.configs);
    }
    listing.renamed.retain(|p| {
        scan::read_file(p)
            .ok()
            .is_some_and(|b| ours_in(p, &b).is_some())
    });
    Ok(listing)
}
