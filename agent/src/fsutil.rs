//! The installer's reads, comparisons and removals of the files it owns
//! outright (the binaries and the kubeconfig), with errors naming the path.
//! Their atomic replacement is the chain library's (`write::replace_with`):
//! a reader (the runtime exec'ing the plugin, the plugin reading its
//! kubeconfig) only ever sees the old file or the new one, and a running
//! binary is never opened for writing ("text file busy").

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use linkerd_cni_chain::{ChainError, open_regular, read_file, write};

/// What [`same_content`] reads of each file at a time.
const CHUNK: u64 = 64 * 1024;

/// A file-system operation of the installer that failed.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// An I/O error with the path it concerns.
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// An atomic replacement failed; the target was left as it was.
    #[error(transparent)]
    Write(#[from] ChainError),
}

impl FsError {
    pub fn new(op: &'static str, path: &Path, source: io::Error) -> Self {
        FsError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Removes `path`; Ok(false) when it was already absent.
pub fn remove(path: &Path) -> Result<bool, FsError> {
    match fs::remove_file(path) {
        Ok(()) => {
            let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
            sync_dir(dir.unwrap_or(Path::new(".")))?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(FsError::new("cannot remove", path, e)),
    }
}

/// Whether two files have the same bytes, without reading both whole into
/// memory. A missing `b` is "different"; a missing `a` is an error.
pub fn same_content(a: &Path, b: &Path) -> Result<bool, FsError> {
    let mut fa = open_regular(a).map_err(|e| FsError::new("cannot open", a, e))?;
    let mut fb = match open_regular(b) {
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
    // Chunk by chunk: a binary is megabytes.
    let (mut ba, mut bb) = (vec![], vec![]);
    loop {
        ba.clear();
        bb.clear();
        let n = (&mut fa)
            .take(CHUNK)
            .read_to_end(&mut ba)
            .map_err(|e| FsError::new("cannot read", a, e))?;
        (&mut fb)
            .take(CHUNK)
            .read_to_end(&mut bb)
            .map_err(|e| FsError::new("cannot read", b, e))?;
        if ba != bb {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

/// Reads a token, a CA bundle, the entry template or a kubeconfig with the
/// chain library's reader (one policy for every input file): a regular
/// file, opened without blocking (a FIFO must not hang the installer), of
/// at most [`linkerd_cni_chain::MAX_CONFIG_SIZE`] bytes (far above any real
/// one, far below the container's memory limit), as UTF-8 text. Another
/// kind of file or a longer one is an error that says so.
pub fn read_capped_text(path: &Path) -> io::Result<String> {
    String::from_utf8(read_file(path)?).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// [`read_capped_text`]'s reader, bytes; Ok(None) when absent.
pub fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, FsError> {
    match read_file(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(FsError::new("cannot read", path, e)),
    }
}

fn sync_dir(dir: &Path) -> Result<(), FsError> {
    write::fsync_dir(dir).map_err(|e| FsError::new("cannot sync directory", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_read_and_remove() {
        let t = fresh_dir();
        let (a, b) = (t.join("a"), t.join("b"));
        let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        fs::write(&a, &big).unwrap();
        assert!(!same_content(&a, &b).unwrap());
        fs::write(&b, &big).unwrap();
        assert!(same_content(&a, &b).unwrap());
        let mut other = big.clone();
        other[150_000] ^= 1;
        fs::write(&b, &other).unwrap();
        assert!(!same_content(&a, &b).unwrap());

        assert_eq!(read_optional(&b).unwrap(), Some(other));
        assert!(remove(&a).unwrap());
        assert!(!remove(&a).unwrap());
        assert_eq!(read_optional(&a).unwrap(), None);
        fs::remove_dir_all(&t).unwrap();
    }

    const READ_LIMIT: u64 = linkerd_cni_chain::MAX_CONFIG_SIZE;

    use testkit::bounded;

    /// Far longer than a refusal takes.
    const WITHIN: std::time::Duration = std::time::Duration::from_secs(20);

    #[test]
    fn inputs_that_are_not_regular_files_are_refused_without_blocking() {
        let t = fresh_dir();
        let fifo = t.join("fifo");
        let status = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(status.success());
        let plain = t.join("plain");
        fs::write(&plain, "x").unwrap();
        for p in [fifo.clone(), PathBuf::from("/dev/zero"), t.clone()] {
            let q = p.clone();
            let e = bounded("read_file", WITHIN, move || read_file(&q)).unwrap_err();
            assert!(e.to_string().contains("not a regular file"), "{p:?}: {e}");
            let q = p.clone();
            assert!(bounded("read_optional", WITHIN, move || read_optional(&q)).is_err());
        }
        // A FIFO where a binary goes is an error, not a hang.
        let (a, b) = (plain.clone(), fifo.clone());
        assert!(bounded("same_content", WITHIN, move || same_content(&a, &b)).is_err());
        let (a, b) = (fifo.clone(), plain.clone());
        assert!(bounded("same_content", WITHIN, move || same_content(&a, &b)).is_err());
        fs::remove_dir_all(&t).unwrap();
    }

    #[test]
    fn reads_are_capped() {
        let t = fresh_dir();
        let (ok, big) = (t.join("ok"), t.join("big"));
        fs::write(&ok, vec![b'a'; READ_LIMIT as usize]).unwrap();
        fs::write(&big, vec![b'a'; READ_LIMIT as usize + 1]).unwrap();
        assert_eq!(read_file(&ok).unwrap().len() as u64, READ_LIMIT);
        let e = read_file(&big).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("larger than"), "{e}");
        assert!(read_optional(&big).is_err());
        fs::remove_dir_all(&t).unwrap();
    }

    fn fresh_dir() -> PathBuf {
        let p = std::env::temp_dir().join(format!(
            "lcni-fsutil-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        p
    }
}
