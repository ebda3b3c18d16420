//! Crash-safe file replacement, for everything linkerd-cni writes: the
//! conflists and the entry file (the chain repair), and the installer's
//! binaries and kubeconfig.
//!
//! A file is never written in place: the new content goes to a temp file in
//! the same directory (same file system, so the rename is atomic), under a
//! name no runtime loads, created exclusively, fully written, given its mode
//! (the original's, or the one asked for) and owner, and fsynced; only then
//! is it renamed over the target and the directory fsynced.
//!
//! The chain repair's exchange with a primary's conflist, and owned mode's
//! with its copy, are the writes that do not wait for the disk first: the
//! runtime runs the primary's chain without us until the repair is
//! visible, and under a node's I/O an fsync takes tens of milliseconds. The
//! exchange keeps what the target held under the temp name, and that
//! version is removed only once the new one is fsynced: a crash in between
//! can lose the new content, never both, and recovery puts the displaced
//! version back ([`lost`]). Where owned mode's copy displaces nothing (a
//! first copy, or no `RENAME_EXCHANGE`), a copy a crash lost is removed and
//! written again from the primary's.
//!
//! A reader (a runtime reloading on the rename, the runtime exec'ing
//! the plugin, the plugin reading its kubeconfig) sees the old file or the
//! new one, never a mix, even if we are killed at any point; and since the
//! target is never opened for writing, replacing a running binary cannot fail
//! with "text file busy". What a kill leaves behind is a temp file, which the
//! next repair (in the conf dir) or the installer's start (in the bin dir)
//! removes.
//!
//! In the conf dir, temp files are only created under the conf-dir lock
//! ([`crate::lock_dir`]), so whoever holds the lock may take any it finds for
//! a leftover. A leftover is not necessarily our content, though: an
//! exchange leaves what the target held under the temp name, which may be
//! a primary's write made in the instant before. Such files carry an
//! intent in their name, from which recovery decides what they are.

use std::fs::{self, File, Metadata, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use nix::errno::Errno;
use nix::fcntl::{self, RenameFlags};

use crate::ChainError;

/// Our temp files start with this. Its only `.` is the first byte, so as
/// Go's `filepath.Ext` sees it the name has no config extension.
pub const TEMP_PREFIX: &str = ".linkerd-cni-tmp-";

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Whether a directory entry's name is one of our temp files.
pub fn is_temp_name(name: &std::ffi::OsStr) -> bool {
    name.as_bytes().starts_with(TEMP_PREFIX.as_bytes())
}

/// A temp file name unique to this process and call, carrying `intent`'s
/// tag right after the prefix.
pub(crate) fn temp_path(dir: &Path, intent: Option<&Intent>) -> PathBuf {
    let tag = intent.map(Intent::tag).unwrap_or_default();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    dir.join(format!(
        "{TEMP_PREFIX}{tag}{}-{n}-{nanos:x}",
        std::process::id()
    ))
}

/// A 64-bit FNV-1a digest: enough to tell apart the few contents one
/// repair deals with (no adversary chooses them), and stable across builds,
/// since a file named after it may be read by the next version.
pub(crate) fn digest(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What a temp file is for, written into its name before the step that
/// can leave someone else's content under it, so that recovery after a
/// kill can tell our unfinished write from content we displaced. A temp
/// file without an intent only ever holds content we wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Intent {
    /// About to be exchanged (`RENAME_EXCHANGE`) with the file whose name
    /// has digest `target`, which should hold content with digest
    /// `expected`; it holds content with digest `put` (`None`: unreadable).
    /// `back`: that content is someone else's, displaced by an earlier
    /// exchange and being put back; otherwise it is our new content.
    /// Afterwards it holds what the target held.
    Swap {
        back: bool,
        target: u64,
        expected: u64,
        put: Option<u64>,
    },
    /// A single-plugin config with digest `base`, retired after converting
    /// it to the list whose name has digest `list` and content has digest
    /// `content`; `json`: it was a `.json`, else a `.conf`.
    Grave {
        json: bool,
        list: u64,
        base: u64,
        content: u64,
    },
}

impl Intent {
    fn tag(&self) -> String {
        let opt = |d: Option<u64>| d.map_or_else(|| "none".to_string(), |d| format!("{d:016x}"));
        match *self {
            Intent::Swap {
                back,
                target,
                expected,
                put,
            } => format!(
                "swap-{}-{target:016x}-{expected:016x}-{}-",
                if back { 'b' } else { 'n' },
                opt(put)
            ),
            Intent::Grave {
                json,
                list,
                base,
                content,
            } => format!(
                "grave-{}-{list:016x}-{base:016x}-{content:016x}-",
                if json { 'j' } else { 'c' }
            ),
        }
    }

    /// The intent a temp file's name carries, if any.
    pub(crate) fn of(name: &std::ffi::OsStr) -> Option<Intent> {
        let rest = name.as_bytes().strip_prefix(TEMP_PREFIX.as_bytes())?;
        let rest = std::str::from_utf8(rest).ok()?;
        let mut f = rest.split('-');
        let (what, flag) = (f.next()?, f.next()?);
        let mut hex = || u64::from_str_radix(f.next()?, 16).ok();
        match (what, flag) {
            ("swap", "n" | "b") => {
                let (target, expected) = (hex()?, hex()?);
                let put = match f.next()? {
                    "none" => None,
                    h => Some(u64::from_str_radix(h, 16).ok()?),
                };
                Some(Intent::Swap {
                    back: flag == "b",
                    target,
                    expected,
                    put,
                })
            }
            ("grave", "c" | "j") => Some(Intent::Grave {
                json: flag == "j",
                list: hex()?,
                base: hex()?,
                content: hex()?,
            }),
            _ => None,
        }
    }

    /// A fresh temp path in `dir` carrying this intent.
    pub(crate) fn path_in(&self, dir: &Path) -> PathBuf {
        temp_path(dir, Some(self))
    }
}

/// The digest of a file name, as [`Intent`]s refer to files.
pub(crate) fn name_digest(path: &Path) -> u64 {
    digest(path.file_name().map(OsStrExt::as_bytes).unwrap_or_default())
}

/// Whether `bytes` is what a crash leaves of content that never reached
/// the disk: nothing, or zeros (a size on disk without its data). No
/// writer's config looks so.
pub(crate) fn lost(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == 0)
}

/// Creates a new temp file in `dir` with `mode` (exactly, whatever the
/// umask) and, when given, `owner` (uid, gid); `fill` writes its content.
/// Returns its path and the open file; on error nothing is left behind.
///
/// A temp file is fsynced before it is returned unless its name carries an
/// `intent`: only those are exchanged with their target, and the exchange
/// does not wait for the disk (see the module's docs); its caller fsyncs
/// it once it is in place. Any other is renamed over its target, so its
/// content is on disk first.
fn create_temp(
    dir: &Path,
    intent: Option<&Intent>,
    mode: u32,
    owner: Option<(u32, u32)>,
    fill: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<(PathBuf, File)> {
    let mut attempts = 0;
    let (path, mut file) = loop {
        let path = temp_path(dir, intent);
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)
        {
            Ok(f) => break (path, f),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempts < 8 => attempts += 1,
            Err(e) => return Err(e),
        }
    };
    let res = (|| {
        fill(&mut file)?;
        file.flush()?;
        // Exact (the create mode went through the umask), and before the
        // chown: once the file is another uid's, changing its mode takes
        // CAP_FOWNER, which the installer does not have.
        file.set_permissions(Permissions::from_mode(mode))?;
        if let Some((uid, gid)) = owner {
            let meta = file.metadata()?;
            if meta.uid() != uid || meta.gid() != gid {
                std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
                // A chown clears set-id bits; only then is the mode set
                // again.
                if file.metadata()?.mode() & 0o7777 != mode {
                    file.set_permissions(Permissions::from_mode(mode))?;
                }
            }
        }
        if intent.is_none() {
            persist(&file)?;
        }
        Ok(())
    })();
    if let Err(e) = res {
        let _ = fs::remove_file(&path);
        return Err(e);
    }
    Ok((path, file))
}

/// Writes `content` to a new temp file in `dir`, carrying `intent` in its
/// name when given (see [`create_temp`] for when it is fsynced), with
/// `like`'s mode and owner (or 0644 and ours). Returns its path and the
/// open file; on error nothing is left behind.
pub(crate) fn write_temp(
    dir: &Path,
    intent: Option<&Intent>,
    content: &[u8],
    like: Option<&Metadata>,
) -> Result<(PathBuf, File), ChainError> {
    let mode = like.map_or(0o644, |m| m.mode() & 0o7777);
    let owner = like.map(|m| (m.uid(), m.gid()));
    create_temp(dir, intent, mode, owner, |f| f.write_all(content))
        .map_err(|e| ChainError::io("write a temp file in", dir, e))
}

/// Replaces `target` with what `fill` writes, atomically, with exactly
/// `mode`, owned by us. For files we own outright (the installer's binaries
/// and kubeconfig); in the conf dir, call it under the conf-dir lock.
pub fn replace_with(
    target: &Path,
    mode: u32,
    fill: impl FnOnce(&mut File) -> io::Result<()>,
) -> Result<(), ChainError> {
    let dir = parent(target);
    let (temp, _) = create_temp(dir, None, mode, None, fill)
        .map_err(|e| ChainError::io("write a temp file for", target, e))?;
    rename_over(&temp, target)
}

/// Renames the temp file `temp`, whose content is on disk, over `target`,
/// and makes that durable; on error the temp file is removed.
pub(crate) fn rename_over(temp: &Path, target: &Path) -> Result<(), ChainError> {
    if let Err(e) = fs::rename(temp, target) {
        let _ = fs::remove_file(temp);
        return Err(ChainError::io("rename a temp file onto", target, e));
    }
    let dir = parent(target);
    fsync_dir(dir).map_err(|e| ChainError::io("fsync", dir, e))
}

/// [`replace_with`] these bytes.
pub fn write_atomic(target: &Path, content: &[u8], mode: u32) -> Result<(), ChainError> {
    replace_with(target, mode, |f| f.write_all(content))
}

/// Copies `src` onto `target` atomically (never in place), with `mode`.
pub fn copy_atomic(src: &Path, target: &Path, mode: u32) -> Result<(), ChainError> {
    let mut from = crate::open_regular(src).map_err(|e| ChainError::io("open", src, e))?;
    replace_with(target, mode, |to| io::copy(&mut from, to).map(drop))
}

/// Removes our temp files from `dir`; returns them. Only where no write can
/// be in progress: the installer's bin dir at start. Temp files carrying an
/// intent may hold someone else's content: they are left for the recovery
/// every repair starts with.
pub fn remove_leftovers(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return vec![];
    };
    let mut removed = vec![];
    for entry in entries.flatten() {
        let name = entry.file_name();
        if is_temp_name(&name)
            && Intent::of(&name).is_none()
            && fs::remove_file(entry.path()).is_ok()
        {
            removed.push(entry.path());
        }
    }
    removed.sort();
    removed
}

fn renameat2(from: &Path, to: &Path, flags: RenameFlags) -> io::Result<()> {
    // AT_FDCWD: relative paths are relative to the working directory, as
    // std's rename treats them.
    fcntl::renameat2(fcntl::AT_FDCWD, from, fcntl::AT_FDCWD, to, flags).map_err(io::Error::from)
}

/// Whether an error means the file system (or kernel) lacks a renameat2 flag.
pub(crate) fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(code) if [Errno::EINVAL, Errno::ENOSYS, Errno::EOPNOTSUPP].contains(&Errno::from_raw(code))
    )
}

/// Atomically swaps two directory entries (`RENAME_EXCHANGE`): afterwards
/// `b` holds what `a` held and `a` holds what `b` held. This lets a repair
/// see exactly what it replaced.
pub(crate) fn exchange(a: &Path, b: &Path) -> io::Result<()> {
    #[cfg(test)]
    order::note("exchange");
    #[cfg(test)]
    if order::NO_EXCHANGE.get() {
        return Err(Errno::EINVAL.into());
    }
    renameat2(a, b, RenameFlags::RENAME_EXCHANGE)
}

/// Renames `from` to `to` only if `to` does not exist (`AlreadyExists`
/// otherwise). Falls back to link + unlink where `RENAME_NOREPLACE` is not
/// supported: same guarantee, briefly two names.
pub(crate) fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    match renameat2(from, to, RenameFlags::RENAME_NOREPLACE) {
        Err(e) if unsupported(&e) => {
            fs::hard_link(from, to)?;
            fs::remove_file(from)
        }
        r => r,
    }
}

/// Makes renames and removals in `dir` durable.
pub fn fsync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(test)]
    order::note("fsync dir");
    File::open(dir)?.sync_all()
}

/// Makes a temp file's content durable.
pub(crate) fn persist(file: &File) -> io::Result<()> {
    #[cfg(test)]
    order::note("fsync file");
    file.sync_all()
}

/// After an exchange put `new` (our content, `None` when it was someone
/// else's being put back) in place of the version now at `displaced`:
/// `new` reaches the disk before `displaced` is removed, so that a crash
/// at any point leaves one of the two to load, and recovery puts the
/// displaced one back when the new one was lost.
pub(crate) fn settle(new: Option<&File>, displaced: &Path, dir: &Path) -> io::Result<()> {
    if let Some(file) = new {
        persist(file)?;
    }
    #[cfg(test)]
    order::note("remove displaced");
    let _ = fs::remove_file(displaced);
    fsync_dir(dir)
}

/// The order of the steps that make a write durable, as this thread took
/// them: for tests of that order.
#[cfg(test)]
pub(crate) mod order {
    use std::cell::RefCell;

    thread_local! {
        static STEPS: RefCell<Vec<&'static str>> = const { RefCell::new(Vec::new()) };
        /// Whether [`super::exchange`] fails as on a file system without
        /// `RENAME_EXCHANGE`, on this thread.
        pub(crate) static NO_EXCHANGE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    pub(crate) fn note(step: &'static str) {
        STEPS.with(|s| s.borrow_mut().push(step));
    }

    /// The steps since the last call.
    pub(crate) fn take() -> Vec<&'static str> {
        STEPS.with(|s| std::mem::take(&mut *s.borrow_mut()))
    }
}

/// The directory holding `path` (`.` for a bare name).
pub(crate) fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_files_get_the_original_mode_and_never_collide() {
        let dir = std::env::temp_dir().join(format!("lcni-write-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let orig = dir.join("10-x.conflist");
        fs::write(&orig, "{}").unwrap();
        fs::set_permissions(&orig, Permissions::from_mode(0o600)).unwrap();
        let like = fs::metadata(&orig).unwrap();
        let (a, _) = write_temp(&dir, None, b"one", Some(&like)).unwrap();
        let (b, _) = write_temp(&dir, None, b"two", Some(&like)).unwrap();
        assert_ne!(a, b);
        assert_eq!(fs::metadata(&a).unwrap().mode() & 0o7777, 0o600);
        assert!(!crate::names::is_config_name(a.file_name().unwrap()));
        exchange(&a, &orig).unwrap();
        assert_eq!(fs::read(&orig).unwrap(), b"one");
        assert_eq!(fs::read(&a).unwrap(), b"{}");
        assert_eq!(
            rename_noreplace(&b, &orig).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A fresh directory, removed on drop.
    struct Tmp(PathBuf);
    impl Tmp {
        fn new(tag: &str) -> Tmp {
            static N: AtomicU32 = AtomicU32::new(0);
            let p = std::env::temp_dir().join(format!(
                "lcni-write-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            fs::create_dir_all(&p).unwrap();
            Tmp(p)
        }
    }
    impl Drop for Tmp {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn write_replaces_with_exact_mode_and_leaves_no_temp() {
        let t = Tmp::new("write");
        let f = t.0.join("kc");
        write_atomic(&f, b"one", 0o600).unwrap();
        write_atomic(&f, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&f).unwrap(), b"two");
        assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o600);
        assert_eq!(fs::read_dir(&t.0).unwrap().count(), 1);
    }

    /// A source that is not a regular file (a FIFO would block the open
    /// until a writer comes) is refused at once, naming it; the target
    /// stays as it was and no temp file is left.
    #[test]
    fn copying_from_a_fifo_is_refused_without_blocking() {
        let t = Tmp::new("fifo-src");
        let src = t.0.join("src");
        testkit::mkfifo(&src);
        let bin = t.0.join("bin");
        write_atomic(&bin, b"old", 0o755).unwrap();
        let (s, b) = (src.clone(), bin.clone());
        let e = testkit::bounded(
            "copy from a FIFO",
            std::time::Duration::from_secs(20),
            move || copy_atomic(&s, &b, 0o755),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("not a regular file") && e.contains("src"), "{e}");
        assert_eq!(fs::read(&bin).unwrap(), b"old");
        assert_eq!(fs::read_dir(&t.0).unwrap().count(), 2);
    }

    #[test]
    fn replacing_a_running_binary_is_not_text_file_busy() {
        let t = Tmp::new("busy");
        let bin = t.0.join("sleeper");
        copy_atomic(Path::new("/bin/sleep"), &bin, 0o755).unwrap();
        let mut child = std::process::Command::new(&bin).arg("5").spawn().unwrap();
        let r = copy_atomic(Path::new("/bin/true"), &bin, 0o755);
        child.kill().unwrap();
        child.wait().unwrap();
        r.unwrap();
        assert_eq!(fs::read("/bin/true").unwrap(), fs::read(&bin).unwrap());
    }

    #[test]
    fn failed_fill_leaves_target_and_no_temp() {
        let t = Tmp::new("fail");
        let f = t.0.join("x");
        write_atomic(&f, b"old", 0o644).unwrap();
        let e = replace_with(&f, 0o644, |_| Err(io::Error::other("boom"))).unwrap_err();
        assert!(e.to_string().contains("boom"));
        assert_eq!(fs::read(&f).unwrap(), b"old");
        assert_eq!(fs::read_dir(&t.0).unwrap().count(), 1);
    }

    #[test]
    fn leftovers_are_recognised_and_removed() {
        let t = Tmp::new("leftovers");
        let a = t.0.join("a");
        fs::write(&a, b"keep").unwrap();
        let stale = temp_path(&t.0, None);
        fs::write(&stale, b"half").unwrap();
        assert!(is_temp_name(stale.file_name().unwrap()));
        assert!(!crate::names::is_config_name(stale.file_name().unwrap()));
        assert!(!is_temp_name(a.file_name().unwrap()));
        assert_eq!(remove_leftovers(&t.0), vec![stale]);
        assert_eq!(fs::read(&a).unwrap(), b"keep");
    }
}
