//! Atomic file replacement for what the installer owns outright (the
//! binaries and the kubeconfig; conflists go through `linkerd_cni::chain`).
//!
//! A reader (the runtime exec'ing the plugin, the plugin reading its
//! kubeconfig) must only ever see the old file or the new one: the content is
//! written to a temp file in the same directory, synced, given its mode, and
//! renamed over the target; then the directory is synced so the rename
//! survives a crash. The target is never opened for writing, so replacing a
//! binary that is running cannot fail with "text file busy".

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// Marks our temp files, so that leftovers of a crash can be recognised.
/// Never ends in .conf/.conflist/.json: the runtime ignores these names.
const TEMP_MARK: &str = ".linkerd-cni-installer-tmp-";

/// An I/O error with the path it concerns.
#[derive(Debug, thiserror::Error)]
#[error("{op} {}: {source}", path.display())]
pub struct FsError {
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

impl FsError {
    pub fn new(op: &'static str, path: &Path, source: io::Error) -> Self {
        FsError {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Replaces `target` with what `fill` writes, atomically, with `mode`.
pub fn replace_with(
    target: &Path,
    mode: u32,
    fill: impl FnOnce(&mut File) -> io::Result<()>,
) -> Result<(), FsError> {
    let dir = parent(target);
    let temp = temp_path(target);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&temp)
        .map_err(|e| FsError::new("cannot create", &temp, e))?;
    let written = fill(&mut file)
        .and_then(|()| file.flush())
        // The umask may have narrowed the mode given at creation.
        .and_then(|()| file.set_permissions(fs::Permissions::from_mode(mode)))
        .and_then(|()| file.sync_all())
        .map_err(|e| FsError::new("cannot write", &temp, e))
        .and_then(|()| {
            fs::rename(&temp, target).map_err(|e| FsError::new("cannot rename onto", target, e))
        });
    if let Err(e) = written {
        let _ = fs::remove_file(&temp);
        return Err(e);
    }
    sync_dir(dir)
}

pub fn write_atomic(target: &Path, content: &[u8], mode: u32) -> Result<(), FsError> {
    replace_with(target, mode, |f| f.write_all(content))
}

/// Copies `src` onto `target` atomically (never in place).
pub fn copy_atomic(src: &Path, target: &Path, mode: u32) -> Result<(), FsError> {
    let mut from = File::open(src).map_err(|e| FsError::new("cannot open", src, e))?;
    replace_with(target, mode, |to| io::copy(&mut from, to).map(drop))
}

/// Removes `path`; Ok(false) when it was already absent.
pub fn remove(path: &Path) -> Result<bool, FsError> {
    match fs::remove_file(path) {
        Ok(()) => {
            sync_dir(parent(path))?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(FsError::new("cannot remove", path, e)),
    }
}

/// Whether two files have the same bytes, without reading both whole into
/// memory. A missing `b` is "different"; a missing `a` is an error.
pub fn same_content(a: &Path, b: &Path) -> Result<bool, FsError> {
    let mut fa = File::open(a).map_err(|e| FsError::new("cannot open", a, e))?;
    let mut fb = match File::open(b) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(FsError::new("cannot open", b, e)),
    };
    let la = fa
        .metadata()
        .map_err(|e| FsError::new("cannot stat", a, e))?;
    let lb = fb
        .metadata()
        .map_err(|e| FsError::new("cannot stat", b, e))?;
    if la.len() != lb.len() {
        return Ok(false);
    }
    let mut ba = vec![0u8; 64 * 1024];
    let mut bb = vec![0u8; 64 * 1024];
    loop {
        let n = read_full(&mut fa, &mut ba).map_err(|e| FsError::new("cannot read", a, e))?;
        let m = read_full(&mut fb, &mut bb[..n.max(1)])
            .map_err(|e| FsError::new("cannot read", b, e))?;
        if n != m || ba.get(..n) != bb.get(..m) {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

/// Reads `path`; Ok(None) when absent.
pub fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, FsError> {
    match fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(FsError::new("cannot read", path, e)),
    }
}

/// Removes temp files a crashed installer left in `dir`; returns them.
pub fn remove_stale_temps(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return vec![];
    };
    let mut removed = vec![];
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name.to_string_lossy().contains(TEMP_MARK) && fs::remove_file(entry.path()).is_ok() {
            removed.push(entry.path());
        }
    }
    removed
}

pub fn is_temp_name(name: &str) -> bool {
    name.contains(TEMP_MARK)
}

fn read_full(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn parent(p: &Path) -> &Path {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

fn temp_path(target: &Path) -> PathBuf {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let mut name = OsString::from(".");
    name.push(target.file_name().unwrap_or_default());
    name.push(format!(
        "{TEMP_MARK}{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    parent(target).join(name)
}

fn sync_dir(dir: &Path) -> Result<(), FsError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| FsError::new("cannot sync directory", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    struct Tmp(PathBuf);
    impl Tmp {
        fn new(tag: &str) -> Tmp {
            static N: AtomicU32 = AtomicU32::new(0);
            let p = std::env::temp_dir().join(format!(
                "lcni-fsutil-{tag}-{}-{}",
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
        assert!(same_content(Path::new("/bin/true"), &bin).unwrap());
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
    fn compare_and_clean_up() {
        let t = Tmp::new("cmp");
        let (a, b) = (t.0.join("a"), t.0.join("b"));
        let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        fs::write(&a, &big).unwrap();
        assert!(!same_content(&a, &b).unwrap());
        fs::write(&b, &big).unwrap();
        assert!(same_content(&a, &b).unwrap());
        let mut other = big.clone();
        other[150_000] ^= 1;
        fs::write(&b, &other).unwrap();
        assert!(!same_content(&a, &b).unwrap());

        let stale = temp_path(&a);
        fs::write(&stale, b"half").unwrap();
        assert!(is_temp_name(&stale.file_name().unwrap().to_string_lossy()));
        assert!(!crate::config::has_config_extension(
            &stale.file_name().unwrap().to_string_lossy()
        ));
        assert_eq!(remove_stale_temps(&t.0), vec![stale]);
        assert!(remove(&a).unwrap());
        assert!(!remove(&a).unwrap());
    }
}
