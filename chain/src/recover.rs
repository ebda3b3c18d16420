//! Recovery from a killed write: what each leftover temp file is (from the
//! intent its name carries), putting back someone's displaced content and
//! removing only our own. Every writer (both layouts and uninstall) runs it
//! under the conf-dir lock before deciding anything.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::scan::{self, Listing};
use crate::write::{self, Intent, parent};
use crate::{Action, ChainError, RepairOptions, owned};

/// The conf dir's listing after [`recover`] (run under the conf-dir lock,
/// before any writer decides anything), and what recovery did, as the
/// keeper reports it: listed again when content came back, since that is
/// what must be decided on.
pub(crate) fn recovered_listing(
    conf_dir: &Path,
    opts: &RepairOptions,
) -> Result<(Listing, Vec<Action>), ChainError> {
    let listing = owned::list(conf_dir, opts)?;
    let actions = recover(conf_dir, &listing, &opts.host_root)?;
    if !actions.iter().any(|a| matches!(a, Action::Restored(_))) {
        return Ok((listing, actions));
    }
    Ok((owned::list(conf_dir, opts)?, actions))
}

/// Deals with the temp files a killed repair left, before anything else is
/// decided: our own unfinished writes are removed, and content that is not
/// ours (a primary's write displaced by an exchange, a single-plugin config
/// retired by a conversion) is put back when nothing newer has replaced it
/// since, and only removed once something has. The lock guarantees that no
/// live repair owns any of them. `listing.leftovers` is every place a temp
/// file can be, and every copy of owned mode's a crash lost. Returns what
/// it did: how many temp files it removed (our unfinished writes, and
/// displaced content already superseded), then what it put back.
fn recover(
    conf_dir: &Path,
    listing: &Listing,
    host_root: &Path,
) -> Result<Vec<Action>, ChainError> {
    let mut removed = 0;
    let mut restored = Vec::new();
    let mut touched = vec![conf_dir.to_path_buf()];
    for p in &listing.leftovers {
        let name = p.file_name().unwrap_or_default();
        let note = match Intent::of(name) {
            // A copy of ours a crash lost (owned mode's `list`): removed,
            // unless a swap's recovery just put the copy it displaced back.
            None if !write::is_temp_name(name)
                && !scan::read_file(p).is_ok_and(|b| write::lost(&b)) =>
            {
                continue;
            }
            None => None,
            Some(Intent::Swap {
                back,
                target,
                expected,
                put,
            }) => recover_swap(p, back, target, expected, put)?,
            Some(Intent::Grave {
                json,
                list,
                base,
                content,
            }) => recover_grave(p, host_root, json, list, base, content)?,
        };
        match note {
            Some(note) => {
                log::warn!("{note}");
                restored.push(Action::Restored(note));
            }
            None => match fs::remove_file(p) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(ChainError::io("remove leftover temp file", p, e)),
            },
        }
        let dir = parent(p).to_path_buf();
        if !touched.contains(&dir) {
            touched.push(dir);
        }
    }
    if removed > 0 || !restored.is_empty() {
        for dir in &touched {
            write::fsync_dir(dir).map_err(|e| ChainError::io("fsync", dir, e))?;
        }
    }
    let leftovers = (removed > 0).then_some(Action::Leftovers(removed));
    Ok(leftovers.into_iter().chain(restored).collect())
}

/// The FNV digest of a file's content, as temp file names record it
/// (`None`: unreadable or absent).
pub(crate) fn file_fnv(path: &Path) -> Option<u64> {
    scan::read_file(path).ok().map(|b| write::digest(&b))
}

/// The file in `dir` whose name has digest `name` (not a temp file).
fn named(dir: &Path, name: u64) -> Option<PathBuf> {
    fs::read_dir(dir).ok()?.flatten().find_map(|e| {
        let n = e.file_name();
        (!write::is_temp_name(&n) && write::digest(n.as_encoded_bytes()) == name).then(|| e.path())
    })
}

/// What must be in place for a leftover swap's temp file to go back.
#[derive(PartialEq)]
enum PutBackOver {
    /// Content with this digest (`None`: unreadable or absent).
    Digest(Option<u64>),
    /// Content a crash lost ([`write::lost`]).
    Lost,
}

/// A temp file left around an exchange with `target`: `Some(note)` when it
/// held someone else's content, which is now back in place (or, rarely,
/// kept for the next pass); `None` when it is to be removed.
fn recover_swap(
    p: &Path,
    back: bool,
    target: u64,
    expected: u64,
    put: Option<u64>,
) -> Result<Option<String>, ChainError> {
    let held = file_fnv(p);
    // Which content the temp file holds, and which content must be in
    // place for it to be the newest there is.
    let over = if held == put {
        // The exchange did not happen: it holds what we were putting in.
        if !back {
            return Ok(None); // our own unfinished write
        }
        PutBackOver::Digest(Some(expected))
    } else if held == Some(expected) {
        // The exchange happened and it holds exactly what we meant to
        // replace: superseded by what we put in, unless a crash lost that
        // (ours is fsynced only after the exchange, and this version is
        // removed only after that).
        if back {
            return Ok(None);
        }
        PutBackOver::Lost
    } else {
        // The exchange happened and it holds what someone wrote in the
        // instant before.
        PutBackOver::Digest(put)
    };
    let dir = parent(p);
    let Some(real) = named(dir, target) else {
        if over != PutBackOver::Lost {
            log::warn!(
                "{} holds a config displaced by an interrupted repair, whose file is gone since: removed",
                p.display()
            );
        }
        return Ok(None);
    };
    let in_place = scan::read_file(&real).ok();
    let now = in_place.as_deref().map(write::digest);
    match over {
        PutBackOver::Digest(d) if now != d => {
            log::warn!(
                "{} holds a config displaced by an interrupted repair of {}, which has been rewritten since: removed",
                p.display(),
                real.display()
            );
            return Ok(None);
        }
        PutBackOver::Lost if !in_place.as_deref().is_some_and(write::lost) => return Ok(None),
        _ => {}
    }
    // Put it back, the very inode, and see what comes out.
    write::exchange(p, &real).map_err(|e| ChainError::io("restore", &real, e))?;
    if file_fnv(p) == now {
        let _ = fs::remove_file(p);
        return Ok(Some(if over == PutBackOver::Lost {
            format!(
                "put back {}'s previous content: a crash lost the repair written over it",
                real.display()
            )
        } else {
            format!(
                "put back {}'s content that an interrupted repair had displaced",
                real.display()
            )
        }));
    }
    // Rewritten in the meantime: theirs is the newest, ours to keep for now.
    write::exchange(p, &real).map_err(|e| ChainError::io("restore", &real, e))?;
    Ok(Some(format!(
        "{} changed while a displaced version of it was being put back; kept {} for the next pass",
        real.display(),
        p.display()
    )))
}

/// A single-plugin config retired by an interrupted conversion: `Some(note)`
/// when it was rewritten by its owner before being retired and is now back
/// (as the live conversion does); `None` when it is to be removed.
fn recover_grave(
    p: &Path,
    host_root: &Path,
    json: bool,
    list: u64,
    base: u64,
    content: u64,
) -> Result<Option<String>, ChainError> {
    if read_in(host_root, p).ok().map(|b| write::digest(&b)) == Some(base) {
        // What the conversion was computed from: the list holds it.
        return Ok(None);
    }
    let Some(list) = named(parent(p), list) else {
        log::warn!(
            "{} holds a config retired by an interrupted conversion, whose list is gone since: removed",
            p.display()
        );
        return Ok(None);
    };
    let original = list.with_extension(if json { "json" } else { "conf" });
    match write::rename_noreplace(p, &original) {
        Ok(()) => {}
        // An even newer one is there already.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(None),
        Err(e) => return Err(ChainError::io("restore", &original, e)),
    }
    // The list built from the older content is ours to take back.
    if file_fnv(&list) == Some(content) {
        let _ = fs::remove_file(&list);
    }
    Ok(Some(format!(
        "put back {}, rewritten by its owner while an interrupted repair was converting it",
        original.display()
    )))
}

/// Reads `path`, resolving it under `host_root` when it is a symlink.
pub(crate) fn read_in(host_root: &Path, path: &Path) -> io::Result<Vec<u8>> {
    if fs::symlink_metadata(path)?.file_type().is_symlink() {
        scan::read_file(&scan::resolve_in(host_root, path)?)
    } else {
        scan::read_file(path)
    }
}
