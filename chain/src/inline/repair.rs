//! Repairing the active config, and removing our entries on uninstall.
//!
//! Everything here runs under the conf-dir lock ([`super::lock`]), which
//! orders linkerd-cni's own writers. The primary CNI's installer does not
//! take it, so a replacement must also be safe against a file that changes
//! between our read and our rename: the new file is swapped in with
//! `renameat2(RENAME_EXCHANGE)`, which hands back exactly what it replaced.
//! If that is not what the repair was computed from, someone wrote in
//! between: their content becomes the new base and is repaired in turn (or,
//! when it needs no repair or cannot be read, put back as it was, the very
//! same inode, so a writer still holding it open keeps writing to the live
//! file). A primary's write is never silently undone, not even by a kill in
//! the middle of that: every repair starts by deciding what each leftover
//! temp file is (from the intent its name carries) and puts back someone's
//! displaced content before anything else; only our own content is removed.
//!
//! A symlinked config is written through to its target only where the
//! scan allows it (inside the conf dir, unless
//! [`RepairOptions::write_outside_conf_dir`]); the temp file goes next to
//! the target, where the next scan looks for leftovers too.

use std::fs::{self, File, Metadata};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::diagnose_listing;
use crate::names::{Kind, file_name};
use crate::options::past;
use crate::recover::{self, read_in};
use crate::scan::{self, Listing};
use crate::write::{self, Intent, parent};
use crate::{Action, ChainError, ChainState, Entry, RepairOptions, lock, owned, plan};

/// What a repair did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RepairReport {
    /// The config file written (`None`: no config was written).
    pub file: Option<PathBuf>,
    /// The state found (on the first look under the lock).
    pub before: ChainState,
    /// The file whose absence withheld the repair ([`RepairOptions::requires`]).
    pub withheld: Option<PathBuf>,
    /// What recovery did: leftover temp files of a killed write removed,
    /// someone's content it displaced put back.
    pub recovery: Vec<Action>,
}

/// Re-diagnoses after someone else's write this many times at most.
const MAX_ATTEMPTS: u32 = 8;
/// Swaps with a file that keeps changing under us, at most.
const MAX_SWAPS: u32 = 16;

/// How one replacement attempt ended.
enum Replacement {
    /// Our content is in place.
    Written,
    /// Someone else's content is in place (newer than what we read, and
    /// either healthy or not ours to repair): look again.
    Superseded,
}

/// Repairs the active config under the conf-dir lock. Never writes when
/// nothing would change, never writes a linkerd-only config, never touches
/// an active file it cannot parse. Leftover temp files are removed.
#[cfg(test)]
pub(crate) fn repair(
    conf_dir: &Path,
    desired: &Entry,
    opts: &RepairOptions,
) -> Result<RepairReport, ChainError> {
    repair_locked(conf_dir, desired, opts).map(|(report, _lock)| report)
}

/// [`repair()`], returning with the conf-dir lock still held, so that what
/// the caller records about the repair (the plugin's fight history) is
/// read and written in the same critical section as the repair itself: a
/// record made after the lock is released races with the next repair's.
pub(crate) fn repair_locked(
    conf_dir: &Path,
    desired: &Entry,
    opts: &RepairOptions,
) -> Result<(RepairReport, lock::DirLock), ChainError> {
    let lock = lock::lock_dir(conf_dir, opts.lock_timeout, opts.deadline)?;
    repair_under(conf_dir, desired, opts).map(|r| (r, lock))
}

fn repair_under(
    conf_dir: &Path,
    desired: &Entry,
    opts: &RepairOptions,
) -> Result<RepairReport, ChainError> {
    if let Some(req) = &opts.requires
        && !req.exists()
    {
        let (diag, _) = diagnose_listing(&owned::list(conf_dir, opts)?, desired);
        return Ok(RepairReport {
            file: None,
            before: diag.state,
            withheld: Some(req.clone()),
            recovery: vec![],
        });
    }
    let mut recovery = Vec::new();
    let mut before = None;
    for _ in 0..MAX_ATTEMPTS {
        let (listing, recovered) = recover::recovered_listing(conf_dir, opts)?;
        recovery.extend(recovered);
        let (diag, base) = diagnose_listing(&listing, desired);
        let before = before.get_or_insert_with(|| diag.state.clone()).clone();
        let (Some(active), Some(base), true) = (&diag.active, base, diag.state.is_repairable())
        else {
            return Ok(RepairReport {
                file: None,
                before,
                withheld: None,
                recovery,
            });
        };
        if past(opts.deadline) {
            return Err(ChainError::Deadline {
                path: active.clone(),
            });
        }
        // A list is repaired in place, a single config converted to a list
        // (the file that holds the chain then).
        let (outcome, file) = match Kind::of(active) {
            Kind::List => {
                let real = writable(&listing, active)?;
                let o = replace(&real, &base, opts.deadline, |b| {
                    plan::repaired(Kind::List, b, desired)
                })?;
                (o, active.clone())
            }
            Kind::Single => convert(conf_dir, &listing, active, &base, desired, opts)?,
        };
        // Superseded: someone wrote meanwhile, so look again.
        if let Replacement::Written = outcome {
            return Ok(RepairReport {
                file: Some(file),
                before,
                withheld: None,
                recovery,
            });
        }
    }
    Err(ChainError::Contended {
        path: conf_dir.to_path_buf(),
        attempts: MAX_ATTEMPTS,
    })
}

/// Removes every linkerd-cni entry from every config file in `conf_dir`
/// (uninstall), under the lock, with the same write discipline. Returns the
/// files rewritten. A file is otherwise left byte-identical; a `.conflist`
/// once converted from a `.conf` stays a `.conflist`. A file that would be
/// left with no plugin, or a single-plugin file of ours, is left alone and
/// logged: it is not a primary's config.
pub(crate) fn remove_entries(
    conf_dir: &Path,
    opts: &RepairOptions,
) -> Result<Vec<PathBuf>, ChainError> {
    let _lock = lock::lock_dir(conf_dir, opts.lock_timeout, opts.deadline)?;
    let (listing, _) = recover::recovered_listing(conf_dir, opts)?;
    let mut rewritten = Vec::new();
    for path in &listing.configs {
        let Ok(bytes) = listing.read(path) else {
            continue;
        };
        if Kind::of(path) == Kind::Single {
            if plan::parse(Kind::Single, &bytes).is_ok_and(|t| plan::holds_ours(Kind::Single, &t)) {
                log::warn!(
                    "{} is a linkerd-cni-only config, not a primary's: left as it is",
                    path.display()
                );
            }
            continue;
        }
        if plan::without_entries(&bytes).is_none() {
            if plan::analyze(Kind::List, &bytes, &serde_json::Map::new()).state
                == ChainState::NoPrimaryPlugin
            {
                log::warn!(
                    "{} holds only linkerd-cni entries: left as it is (removing them would leave an empty chain)",
                    path.display()
                );
            }
            continue;
        }
        if past(opts.deadline) {
            return Err(ChainError::Deadline { path: path.clone() });
        }
        let real = match writable(&listing, path) {
            Ok(r) => r,
            Err(e) => {
                log::warn!("{e}: its linkerd-cni entries stay");
                continue;
            }
        };
        // Superseded: someone's newer content, which holds no entry of ours.
        if let Replacement::Written = replace(&real, &bytes, opts.deadline, plan::without_entries)?
        {
            rewritten.push(path.clone());
        }
    }
    Ok(rewritten)
}

/// What to put at the target next.
enum Candidate {
    /// New content, to be written to a fresh temp file.
    New(Vec<u8>),
    /// An inode we displaced (someone else's newer content), held at a temp
    /// name, with its content (`None`: unreadable): to be put back.
    Restore(PathBuf, Option<Vec<u8>>),
}

/// Replaces the list `real` (a symlinked config's target, or the config
/// itself) by `transform(content)`, computed from `base`, safe against
/// other writers.
fn replace(
    real: &Path,
    base: &[u8],
    deadline: Option<Instant>,
    transform: impl Fn(&[u8]) -> Option<Vec<u8>>,
) -> Result<Replacement, ChainError> {
    let dir = parent(real);
    let meta = fs::metadata(real).map_err(|e| ChainError::io("inspect", real, e))?;
    let Some(first) = transform(base) else {
        return Ok(Replacement::Superseded);
    };
    let swap = Swap {
        real,
        dir,
        meta: &meta,
        target: write::name_digest(real),
        deadline,
        transform: &transform,
    };
    // What the target holds, as far as we know.
    let mut expected = base.to_vec();
    let mut candidate = Candidate::New(first);
    for swaps in 0..MAX_SWAPS {
        let step = match swap.stage(swaps, &expected, candidate)? {
            Staged::Held(held) => swap.exchange(held, expected)?,
            Staged::Moved(step) => step,
        };
        match step {
            Step::Done(outcome) => return Ok(outcome),
            Step::Again(base, next) => {
                expected = base;
                candidate = next;
            }
        }
    }
    // Out of swaps while holding someone's displaced content: it goes back
    // in place once more (or stays marked for recovery to put back).
    if let Candidate::Restore(..) = candidate
        && let Staged::Held(held) = swap.stage(MAX_SWAPS, &expected, candidate)?
    {
        let _ = swap.exchange(held, expected);
    }
    Err(ChainError::Contended {
        path: real.to_path_buf(),
        attempts: MAX_SWAPS,
    })
}

/// What one round of [`replace`]'s swaps leaves it to do.
enum Step {
    /// The replacement ended so.
    Done(Replacement),
    /// Go round again: the target holds the first, the second goes in its
    /// place.
    Again(Vec<u8>, Candidate),
}

/// A candidate at its temp name, or why it never got to the swap.
enum Staged {
    Held(Held),
    Moved(Step),
}

/// A candidate at a temp name, ready to be swapped in.
struct Held {
    path: PathBuf,
    /// Its content.
    bytes: Vec<u8>,
    /// Our own content, not yet fsynced (not someone's displaced content
    /// being put back): only ours may be removed, or fall back to an
    /// ordinary rename.
    ours: Option<File>,
}

/// What every round of [`replace`]'s swaps works on.
struct Swap<'a, F> {
    real: &'a Path,
    dir: &'a Path,
    meta: &'a Metadata,
    target: u64,
    deadline: Option<Instant>,
    transform: &'a F,
}

impl<F: Fn(&[u8]) -> Option<Vec<u8>>> Swap<'_, F> {
    /// Puts `candidate` at a temp name whose intent says what it replaces,
    /// unless the target changed already (then nothing needs undoing yet).
    fn stage(
        &self,
        swaps: u32,
        expected: &[u8],
        candidate: Candidate,
    ) -> Result<Staged, ChainError> {
        let bytes = match candidate {
            Candidate::New(bytes) => bytes,
            Candidate::Restore(t, bytes) => {
                let path = mark_restore(&t, self.target, expected, bytes.as_deref())
                    .map_err(|e| ChainError::io("rename a temp file in", self.dir, e))?;
                let bytes = bytes.unwrap_or_default();
                return Ok(Staged::Held(Held {
                    path,
                    bytes,
                    ours: None,
                }));
            }
        };
        if swaps > 0 && past(self.deadline) {
            return Err(ChainError::Deadline {
                path: self.real.to_path_buf(),
            });
        }
        let intent = Intent::Swap {
            back: false,
            target: self.target,
            expected: write::digest(expected),
            put: Some(write::digest(&bytes)),
        };
        // Not fsynced yet: the runtime runs the primary's chain alone
        // until our repair is visible, so the disk waits until after the
        // exchange (see `judge_displaced`).
        let (t, file) = write::write_temp(self.dir, Some(&intent), &bytes, Some(self.meta))?;
        // A last look right before the swap: a change seen here costs
        // nobody anything.
        let now = scan::read_file(self.real).ok();
        if now.as_deref() == Some(expected) {
            return Ok(Staged::Held(Held {
                path: t,
                bytes,
                ours: Some(file),
            }));
        }
        let _ = fs::remove_file(&t);
        Ok(Staged::Moved(self.again(now)))
    }

    /// The target changed since we looked and holds `now`: its repair goes
    /// in next.
    fn again(&self, now: Option<Vec<u8>>) -> Step {
        match now.as_deref().and_then(self.transform) {
            Some(next) => Step::Again(now.unwrap_or_default(), Candidate::New(next)),
            // Healthy, unreadable or half-written now: look again from the
            // top.
            None => Step::Done(Replacement::Superseded),
        }
    }

    /// Swaps `held` in for what the target holds, `expected` unless someone
    /// wrote in between.
    fn exchange(&self, held: Held, expected: Vec<u8>) -> Result<Step, ChainError> {
        #[cfg(test)]
        if held.ours.is_some() {
            testing::before_swap();
        }
        match write::exchange(&held.path, self.real) {
            Ok(()) => {}
            Err(e) if write::unsupported(&e) && held.ours.is_some() => {
                // An ordinary rename keeps nothing of what it replaces: the
                // new content must be on disk first, and the target is
                // compared with the base once more right before (a window
                // of microseconds instead of none).
                if let Some(Err(e)) = held.ours.as_ref().map(write::persist) {
                    let _ = fs::remove_file(&held.path);
                    return Err(ChainError::io("fsync", &held.path, e));
                }
                let now = scan::read_file(self.real).ok();
                if now.as_deref() != Some(&expected[..]) {
                    let _ = fs::remove_file(&held.path);
                    return Ok(self.again(now));
                }
                write::rename_over(&held.path, self.real)?;
                return Ok(Step::Done(Replacement::Written));
            }
            Err(e) => {
                if held.ours.is_some() {
                    let _ = fs::remove_file(&held.path);
                }
                return Err(ChainError::io("swap a temp file with", self.real, e));
            }
        }
        #[cfg(test)]
        testing::after_exchange();
        self.judge_displaced(held, &expected)
    }

    /// After the exchange `held.path` names what the target held an instant
    /// ago: `expected`, or someone's newer write, which must go back first.
    fn judge_displaced(&self, held: Held, expected: &[u8]) -> Result<Step, ChainError> {
        let displaced = scan::read_file(&held.path).ok();
        if displaced.as_deref() == Some(expected) {
            write::settle(held.ours.as_ref(), &held.path, self.dir)
                .map_err(|e| ChainError::io("fsync", self.real, e))?;
            if held.ours.is_some() {
                return Ok(Step::Done(Replacement::Written));
            }
            // Someone's newer content is back in place: repair it in turn.
            return Ok(self.again(Some(held.bytes)));
        }
        // Someone wrote in the microseconds since our last look. Put their
        // content back at once, the very inode (a writer may still hold it
        // open), before any slow work: ours was computed from an older base.
        log::info!(
            "{} changed while being repaired; putting the newer content back",
            self.real.display()
        );
        Ok(Step::Again(
            held.bytes,
            Candidate::Restore(held.path, displaced),
        ))
    }
}

/// Renames `held`, which holds someone else's content displaced by our
/// exchange, to say that it is now being put back in place of `expected`:
/// if we are killed before or after that exchange, recovery knows which
/// content is whose.
fn mark_restore(
    held: &Path,
    target: u64,
    expected: &[u8],
    content: Option<&[u8]>,
) -> io::Result<PathBuf> {
    let intent = Intent::Swap {
        back: true,
        target,
        expected: write::digest(expected),
        put: content.map(write::digest),
    };
    let to = intent.path_in(parent(held));
    fs::rename(held, &to)?;
    Ok(to)
}

/// The file to write for the config `path` (its symlink's target), or why
/// a repair must not.
fn writable(listing: &Listing, path: &Path) -> Result<PathBuf, ChainError> {
    let refused = |reason| ChainError::Refused {
        path: path.to_path_buf(),
        reason,
    };
    if let Some(why) = listing.refused(path) {
        return Err(refused(why));
    }
    listing.real(path).map_err(refused)
}

/// Turns the single-plugin `active` into a `.conflist` of the same base
/// name holding it and the desired entry, then retires `active` (only once
/// the list is in place, so a crash leaves one or the other loadable).
/// Returns the new list's path.
fn convert(
    conf_dir: &Path,
    listing: &Listing,
    active: &Path,
    base: &[u8],
    desired: &Entry,
    opts: &RepairOptions,
) -> Result<(Replacement, PathBuf), ChainError> {
    let (dst, old_dst) = conversion_target(listing, active)?;
    let Some(content) = plan::repaired(Kind::Single, base, desired) else {
        return Ok((Replacement::Superseded, dst));
    };
    if !place_list(
        conf_dir,
        listing,
        active,
        &dst,
        old_dst.as_ref(),
        &content,
        opts.deadline,
    )? {
        return Ok((Replacement::Superseded, dst));
    }
    retire_single(conf_dir, active, &dst, base, &content, &opts.host_root).map(|r| (r, dst))
}

/// The `.conflist` that `active` converts to, and what it holds when it
/// exists already (a conversion interrupted after writing it), or why the
/// conversion must not happen.
fn conversion_target(
    listing: &Listing,
    active: &Path,
) -> Result<(PathBuf, Option<Vec<u8>>), ChainError> {
    let dst = active.with_extension("conflist");
    let dst_name = dst.file_name().unwrap_or_default().to_os_string();
    // The list must become the active config: nothing may sort before it.
    let mut dst_exists = false;
    for c in listing.configs.iter().skip(1) {
        let name = c.file_name().unwrap_or_default();
        if name == dst_name {
            dst_exists = true;
        } else if name.as_encoded_bytes() < dst_name.as_encoded_bytes() {
            return Err(ChainError::Refused {
                path: active.to_path_buf(),
                reason: format!(
                    "once converted to {} it would no longer be the active config, because {} sorts before it; rename one of them",
                    file_name(&dst),
                    c.display()
                ),
            });
        }
    }
    let old_dst = if dst_exists {
        let bytes = listing
            .read(&dst)
            .map_err(|e| ChainError::io("read", &dst, e))?;
        // A list holding our entry is what a conversion interrupted after
        // writing it leaves; anything else is someone's config.
        if !plan::parse(Kind::List, &bytes).is_ok_and(|t| plan::holds_ours(Kind::List, &t)) {
            return Err(ChainError::Refused {
                path: active.to_path_buf(),
                reason: format!(
                    "it must become {}, which already exists and is not linkerd-cni's; remove one of the two files",
                    dst.display()
                ),
            });
        }
        Some(bytes)
    } else {
        None
    };
    Ok((dst, old_dst))
}

/// Puts the list `content` at `dst` unless someone else's file took the
/// name meanwhile. Returns whether it did.
fn place_list(
    conf_dir: &Path,
    listing: &Listing,
    active: &Path,
    dst: &Path,
    old_dst: Option<&Vec<u8>>,
    content: &[u8],
    deadline: Option<Instant>,
) -> Result<bool, ChainError> {
    if past(deadline) {
        return Err(ChainError::Deadline {
            path: active.to_path_buf(),
        });
    }
    let real = listing.real(active).map_err(|reason| ChainError::Refused {
        path: active.to_path_buf(),
        reason,
    })?;
    let meta = fs::metadata(&real).map_err(|e| ChainError::io("inspect", &real, e))?;
    let (tmp, _) = write::write_temp(conf_dir, None, content, Some(&meta))?;
    let placed = match old_dst {
        None => write::rename_noreplace(&tmp, dst).map(|()| true),
        Some(old) => match write::exchange(&tmp, dst) {
            Ok(()) => {
                if scan::read_file(&tmp).ok().as_ref() == Some(old) {
                    Ok(true)
                } else {
                    // Changed since we looked: not ours to overwrite.
                    write::exchange(&tmp, dst).map(|()| false)
                }
            }
            Err(e) if write::unsupported(&e) => fs::rename(&tmp, dst).map(|()| true),
            Err(e) => Err(e),
        },
    };
    let _ = fs::remove_file(&tmp);
    match placed {
        Ok(true) => {}
        Ok(false) => return Ok(false),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            return Ok(false);
        }
        Err(e) => return Err(ChainError::io("put in place", dst, e)),
    }
    write::fsync_dir(conf_dir).map_err(|e| ChainError::io("fsync", conf_dir, e))?;
    Ok(true)
}

/// Retires the single-plugin `active` now that the list `dst` is in place,
/// or, when the primary rewrote it meanwhile, puts its content back and
/// takes back the list.
fn retire_single(
    conf_dir: &Path,
    active: &Path,
    dst: &Path,
    base: &[u8],
    content: &[u8],
    host_root: &Path,
) -> Result<Replacement, ChainError> {
    // Retire the single-plugin file, capturing atomically what it holds now.
    let grave = Intent::Grave {
        json: active.extension().is_some_and(|e| e == "json"),
        list: write::name_digest(dst),
        base: write::digest(base),
        content: write::digest(content),
    }
    .path_in(conf_dir);
    match fs::rename(active, &grave) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Replacement::Written),
        Err(e) => return Err(ChainError::io("remove", active, e)),
    }
    // Through the symlink, if it was one: the link itself was retired.
    let captured = read_in(host_root, &grave).ok();
    if captured.as_deref() == Some(base) {
        let _ = fs::remove_file(&grave);
        write::fsync_dir(conf_dir).map_err(|e| ChainError::io("fsync", conf_dir, e))?;
        return Ok(Replacement::Written);
    }
    // The primary rewrote it meanwhile: its content wins. Put it back and
    // take back the list built from the old content.
    match write::rename_noreplace(&grave, active) {
        Ok(()) => {}
        // An even newer one is there already.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let _ = fs::remove_file(&grave);
        }
        Err(e) => return Err(ChainError::io("restore", active, e)),
    }
    if scan::read_file(dst).ok().as_deref() == Some(content) {
        let _ = fs::remove_file(dst);
    }
    write::fsync_dir(conf_dir).map_err(|e| ChainError::io("fsync", conf_dir, e))?;
    Ok(Replacement::Superseded)
}

/// Test access: act as another writer between our last look and the swap
/// (a window too short to hit on purpose otherwise), and [`replace`] with
/// a base of the test's choosing.
#[cfg(test)]
pub(crate) mod testing {
    use std::cell::RefCell;
    use std::collections::VecDeque;
    use std::path::Path;

    use super::{ChainError, Entry, Kind, Replacement, plan, replace};

    thread_local! {
        static HOOK: RefCell<Option<Box<dyn FnMut()>>> = RefCell::new(None);
        static AFTER: RefCell<VecDeque<Box<dyn FnOnce()>>> = RefCell::new(VecDeque::new());
    }

    /// Runs `f` right after an exchange: the first one queued after the
    /// next exchange, the second after the one after, and so on.
    pub(crate) fn after_next_exchange(f: impl FnOnce() + 'static) {
        AFTER.with(|h| h.borrow_mut().push_back(Box::new(f)));
    }

    pub(crate) fn after_exchange() {
        if let Some(f) = AFTER.with(|h| h.borrow_mut().pop_front()) {
            f();
        }
    }

    /// Runs `f` before the next swap of new content (once).
    pub(crate) fn before_next_swap(f: impl FnMut() + 'static) {
        HOOK.with(|h| *h.borrow_mut() = Some(Box::new(f)));
    }

    pub(super) fn before_swap() {
        if let Some(mut f) = HOOK.with(|h| h.borrow_mut().take()) {
            f();
        }
    }

    /// Replaces `path` as a repair computed from `base` would. Returns
    /// whether our content ended up in place.
    pub(crate) fn replace_from(
        path: &Path,
        base: &[u8],
        desired: &Entry,
    ) -> Result<bool, ChainError> {
        let o = replace(path, base, None, |b| plan::repaired(Kind::List, b, desired))?;
        Ok(matches!(o, Replacement::Written))
    }
}
