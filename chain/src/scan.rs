//! Which files a runtime loads from a conf dir, in which order, and reading
//! them without ever blocking or slurping something huge. The listing itself
//! reads no file: names decide (see [`super::names`]).
//!
//! The rules are containerd's (libcni `ConfFiles` + go-cni): top-level
//! entries whose extension, as Go's `filepath.Ext` sees it, is `.conf`,
//! `.conflist` or `.json`; dotfiles included; directories skipped (a symlink
//! to a directory is not skipped, and then fails to load, as in containerd);
//! bytewise order of names. The first one is the active config.
//!
//! A config may be a symlink. Where it leads is resolved here as the host
//! resolves it, also from inside the installer's container: an absolute
//! target is taken under the host's root as mounted in this process
//! (`host_root`), and `..` never climbs above it. Whether a repair may write
//! there is decided here too: only inside the conf dir (itself or a
//! directory below it, under the same lock), unless writing elsewhere is
//! explicitly allowed.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use nix::fcntl::OFlag;

use super::names::{is_config_name, is_owned_name, is_renamed_owned_name};
use super::write::is_temp_name;
use super::{ChainError, RepairOptions};

/// Larger files are reported rather than read: no real network config comes
/// near this, and the plugin must stay quick whatever lies in the conf dir.
pub const MAX_CONFIG_SIZE: u64 = 1 << 20;

/// The conf dir as the runtime and the repair see it.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// Config files, in load order: the first is the active one.
    pub configs: Vec<PathBuf>,
    /// Our temp files (from a repair that was killed, or one in progress),
    /// in the conf dir and in every directory a symlinked config leads to:
    /// wherever a repair may have written one. [`super::owned::list`]
    /// adds our copies a crash lost.
    pub leftovers: Vec<PathBuf>,
    /// The symlinks among `configs`, resolved.
    pub links: Vec<Link>,
    /// Configs named like owned mode's files, in load order: not among
    /// `configs` until [`super::owned::list`] has read their marker.
    pub candidates: Vec<PathBuf>,
    /// Owned mode's files, recognised by the marker inside, in load order,
    /// with their content as read: never a primary, so not among `configs`.
    /// Filled by [`super::owned::list`].
    pub owned: Vec<OwnedFile>,
    /// Configs named like ours that could not be read, with why: whether
    /// they are ours cannot be told (filled by [`super::owned::list`]).
    pub unreadable: Vec<(PathBuf, String)>,
    /// Names that are no config but look like one of our files renamed by
    /// another agent (confirmed by the marker in [`super::owned`]).
    pub renamed: Vec<PathBuf>,
}

/// One of owned mode's files, as recognised (its marker verified).
#[derive(Debug, Clone)]
pub(crate) struct OwnedFile {
    pub path: PathBuf,
    /// Our entry in it, marker included.
    pub entry: serde_json::Map<String, serde_json::Value>,
    /// The chain it holds, as its marker's digest was checked against
    /// (`None` for a copy of a single-plugin file).
    pub chain: Option<Vec<u8>>,
}

/// A config that is a symlink.
#[derive(Debug, Clone)]
pub(crate) struct Link {
    /// As listed.
    pub path: PathBuf,
    /// The file it leads to, in this process's view; or why there is none.
    pub real: Result<PathBuf, String>,
    /// Why a repair must not write there (`None`: it may).
    pub refused: Option<String>,
}

impl Listing {
    /// The file to read and write for the config `path`: its symlink's
    /// target, or itself.
    pub(crate) fn real(&self, path: &Path) -> Result<PathBuf, String> {
        match self.links.iter().find(|l| l.path == path) {
            Some(l) => l.real.clone(),
            None => Ok(path.to_path_buf()),
        }
    }

    /// Why a repair must not write through `path`, if it must not.
    pub(crate) fn refused(&self, path: &Path) -> Option<String> {
        self.links
            .iter()
            .find(|l| l.path == path)
            .and_then(|l| l.refused.clone())
    }

    /// Reads the config `path` (through its symlink, as resolved).
    pub(crate) fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        read_file(&self.real(path).map_err(io::Error::other)?)
    }
}

/// Symlinks followed at most while resolving one path (Linux's limit).
const MAX_LINKS: u32 = 40;

/// Resolves `path` (in this process's view, under `root`) the way the host
/// would: every component, symlinks included, with absolute targets taken
/// under `root` and `..` stopping at it. The result exists and is no
/// symlink.
pub(crate) fn resolve_in(root: &Path, path: &Path) -> io::Result<PathBuf> {
    let path = std::path::absolute(path)?;
    let rel = path.strip_prefix(root).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not under {}", path.display(), root.display()),
        )
    })?;
    let mut todo: VecDeque<OsString> = VecDeque::new();
    push_front(&mut todo, rel);
    let mut done: Vec<OsString> = Vec::new();
    let mut links = 0;
    while let Some(c) = todo.pop_front() {
        if c == ".." {
            done.pop();
            continue;
        }
        let here: PathBuf = std::iter::once(root.as_os_str())
            .chain(done.iter().map(OsString::as_os_str))
            .chain(std::iter::once(c.as_os_str()))
            .collect();
        if !fs::symlink_metadata(&here)?.file_type().is_symlink() {
            done.push(c);
            continue;
        }
        links += 1;
        if links > MAX_LINKS {
            return Err(io::Error::other(format!(
                "more than {MAX_LINKS} symlinks to follow (a loop?)"
            )));
        }
        let target = fs::read_link(&here)?;
        if target.is_absolute() {
            done.clear();
        }
        push_front(&mut todo, &target);
    }
    Ok(std::iter::once(root.as_os_str())
        .chain(done.iter().map(OsString::as_os_str))
        .collect())
}

/// Puts `path`'s components (names and `..`) in front of `todo`.
fn push_front(todo: &mut VecDeque<OsString>, path: &Path) {
    for c in path.components().rev() {
        match c {
            Component::Normal(n) => todo.push_front(n.to_os_string()),
            Component::ParentDir => todo.push_front(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
}

/// Resolves the symlinked config `path` and decides whether a repair may
/// write where it leads.
fn link(path: &Path, conf_real: Option<&Path>, opts: &RepairOptions) -> Link {
    let real = resolve_in(&opts.host_root, path).map_err(|e| {
        format!(
            "cannot resolve the symlink (absolute targets are taken under {}): {e}",
            opts.host_root.display()
        )
    });
    let refused = match (&real, conf_real) {
        (Ok(_), _) if opts.write_outside_conf_dir => None,
        (Ok(r), Some(conf)) if r.starts_with(conf) => None,
        (Ok(r), _) => Some(format!(
            "it is a symlink to {}, outside the conf dir; linkerd-cni writes only inside the conf dir unless told otherwise: point the link at a file inside the conf dir, or allow writing outside it (plugin config \"chain_write_outside_conf_dir\": true; installer LINKERD_CNI_CHAIN_WRITE_OUTSIDE_CONF_DIR=true)",
            r.display()
        )),
        (Err(_), _) => None,
    };
    Link {
        path: path.to_path_buf(),
        real,
        refused,
    }
}

/// The conf dir's listing, with symlinks resolved and judged as `opts` says
/// ([`RepairOptions::host_root`], [`RepairOptions::write_outside_conf_dir`]).
pub(crate) fn list(dir: &Path, opts: &RepairOptions) -> Result<Listing, ChainError> {
    let rd = fs::read_dir(dir).map_err(|e| ChainError::io("read the conf dir", dir, e))?;
    let mut configs = Vec::new();
    let mut leftovers = Vec::new();
    let mut links = Vec::new();
    let mut candidates = Vec::new();
    let mut renamed = Vec::new();
    for ent in rd {
        let ent = ent.map_err(|e| ChainError::io("read the conf dir", dir, e))?;
        let name = ent.file_name();
        if is_temp_name(&name) {
            leftovers.push(ent.path());
            continue;
        }
        if !is_config_name(&name) {
            if is_renamed_owned_name(&name) {
                renamed.push(ent.path());
            }
            continue;
        }
        // Like Go's DirEntry.IsDir: the entry itself, not a symlink's target.
        // A file that vanished meanwhile is simply not listed.
        let into = if is_owned_name(&name) {
            &mut candidates
        } else {
            &mut configs
        };
        match ent.file_type() {
            Ok(t) if t.is_dir() => continue,
            Ok(t) if t.is_symlink() => {
                into.push(ent.path());
                links.push(ent.path());
            }
            Ok(_) => into.push(ent.path()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(ChainError::io("read the conf dir", dir, e)),
        }
    }
    sort_by_name(&mut configs);
    sort_by_name(&mut candidates);
    let conf_real = match links.is_empty() {
        true => None,
        false => resolve_in(&opts.host_root, dir).ok(),
    };
    let links: Vec<Link> = links
        .iter()
        .map(|p| link(p, conf_real.as_deref(), opts))
        .collect();
    // Temp files where symlinks lead: a repair writes them next to the
    // target (and older versions did so wherever that was).
    let mut dirs: Vec<&Path> = vec![];
    for l in &links {
        if let Ok(real) = &l.real {
            let d = super::write::parent(real);
            if !dirs.contains(&d) && Some(d) != conf_real.as_deref() {
                dirs.push(d);
            }
        }
    }
    for d in dirs {
        let Ok(rd) = fs::read_dir(d) else { continue };
        for ent in rd.flatten() {
            if is_temp_name(&ent.file_name()) {
                leftovers.push(ent.path());
            }
        }
    }
    leftovers.sort();
    leftovers.dedup();
    renamed.sort();
    Ok(Listing {
        configs,
        leftovers,
        links,
        candidates,
        owned: vec![],
        unreadable: vec![],
        renamed,
    })
}

/// Load order: bytewise order of the file names.
pub(crate) fn sort_by_name(paths: &mut [PathBuf]) {
    // `OsStr` orders by its bytes on Unix.
    paths.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
}

/// Opens a file linkerd-cni reads on input, through symlinks, without
/// blocking (a FIFO would block the open until a writer comes) and without
/// making it the controlling terminal: regular files only.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let f: File = OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_NONBLOCK | OFlag::O_NOCTTY).bits())
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(f)
}

/// Reads a config, entry or other input file ([`open_regular`]): at most
/// [`MAX_CONFIG_SIZE`] bytes.
pub fn read_file(path: &Path) -> io::Result<Vec<u8>> {
    let too_big = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {MAX_CONFIG_SIZE} bytes"),
        )
    };
    let mut f = open_regular(path)?;
    let meta = f.metadata()?;
    if meta.len() > MAX_CONFIG_SIZE {
        return Err(too_big());
    }
    let mut buf = Vec::with_capacity(meta.len() as usize + 1);
    f.by_ref().take(MAX_CONFIG_SIZE + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > MAX_CONFIG_SIZE {
        return Err(too_big());
    }
    Ok(buf)
}
