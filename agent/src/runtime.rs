//! What the node's container runtime does with the conf dir, read from its
//! own settings: whether owned mode is safe there (`chain_mode: auto`), and
//! whether a sandbox got one network twice.
//!
//! Owned mode puts a second file holding the primary's network (same
//! `name`) in front of the primary's. That is right only for a runtime
//! that loads the first file alone; one that loads several attaches every
//! pod to that network twice (two interfaces, two addresses from one
//! range), silently. So owned mode is selected only when the settings
//! prove the runtime loads the first file alone:
//!
//! - containerd: `max_conf_num` of its CRI plugin's `cni` table (1.x
//!   `plugins."io.containerd.grpc.v1.cri"`, 2.x
//!   `plugins."io.containerd.cri.v1.runtime"`, version-1 configs
//!   `plugins.cri`) unset or 1; 0 loads every file. Its `config.toml` at
//!   the standard, k3s and RKE2 paths, with the files its `imports` pull in
//!   (globs; relative to the importing file; breadth first, as containerd
//!   loads them; a later file overrides an earlier one). k3s and RKE2
//!   render `config.toml` from their `config.toml.tmpl` at start, so the
//!   rendered file is what counts.
//! - CRI-O: `[crio.network] cni_default_network` unset in `crio.conf` and
//!   the `crio.conf.d/*.conf` drop-ins (lexical order, later overriding):
//!   pinned to a name, CRI-O picks the network by that name, which our file
//!   and the primary's share.
//!
//! Anything else (no settings found, a file that cannot be read or parsed,
//! a value of the wrong type) selects inline mode, with a reason saying
//! what was missing. [`select`] is a pure function of the files it is
//! given ([`HostFiles`]): [`Host`] reads them under the container's mount
//! of the host.
//!
//! TOML through `toml_edit` (the toml-rs project's parser): only a few
//! keys are looked up, so a document tree is all that is needed.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io;
use std::path::{Component, Path, PathBuf};

use linkerd_cni_chain::owned::ChainMode;
use serde_json::Value;
use toml_edit::{Document, Item};
use tracing::Level;

use crate::config::{Config, ModeNote, under_prefix};
use crate::fsutil::read_capped_text;
use crate::notes::Notes;

/// containerd's main config file, at the standard, k3s and RKE2 paths.
pub const CONTAINERD_CONFIGS: [&str; 3] = [
    "/etc/containerd/config.toml",
    "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
    "/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
];
/// CRI-O's main config file and its drop-in directory.
pub const CRIO_CONFIG: &str = "/etc/crio/crio.conf";
pub const CRIO_DROP_INS: &str = "/etc/crio/crio.conf.d";
/// libcni's result cache, where containerd and CRI-O record each
/// attachment.
pub const RESULTS_DIR: &str = "/var/lib/cni/results";

/// The tables of containerd's CRI plugin that hold its `cni` settings.
const CRI_PLUGINS: [&[&str]; 3] = [
    &["plugins", "io.containerd.grpc.v1.cri", "cni"],
    &["plugins", "io.containerd.cri.v1.runtime", "cni"],
    &["plugins", "cri", "cni"],
];
/// More files than this pulled in by imports is not a real config.
const MAX_IMPORTED: usize = 256;
/// The most result-cache entries read per look (a node runs a few hundred
/// sandboxes at most; each has one entry per network attachment).
const MAX_CACHE_ENTRIES: usize = 4096;

/// Host files, by host path.
pub trait HostFiles {
    /// A file's text; `Ok(None)` when it does not exist.
    fn read(&self, path: &Path) -> Result<Option<String>, String>;
    /// The names in a directory; `Ok(None)` when it does not exist.
    fn list(&self, dir: &Path) -> Result<Option<Vec<String>>, String>;
}

/// The host's files as the installer's container sees them: under the
/// mount prefix.
pub struct Host<'a> {
    pub prefix: &'a Path,
}

fn absent_is_none<T>(r: io::Result<T>) -> Result<Option<T>, String> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

impl HostFiles for Host<'_> {
    fn read(&self, path: &Path) -> Result<Option<String>, String> {
        // Capped: a wrong mount (a device, a huge file) is an error naming
        // the file, not an out-of-memory kill.
        absent_is_none(read_capped_text(&under_prefix(self.prefix, path)))
    }

    fn list(&self, dir: &Path) -> Result<Option<Vec<String>>, String> {
        let names = absent_is_none(std::fs::read_dir(under_prefix(self.prefix, dir)))?;
        let Some(entries) = names else {
            return Ok(None);
        };
        let mut out = vec![];
        for e in entries {
            let e = e.map_err(|e| e.to_string())?;
            out.push(e.file_name().to_string_lossy().into_owned());
        }
        out.sort();
        Ok(Some(out))
    }
}

/// The mode `auto` selects, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    pub mode: ChainMode,
    pub reason: String,
}

/// What one runtime's settings say: None when it is not installed here
/// (no settings at its paths); Ok when it loads the first file alone, Err
/// when it does not or cannot be shown to, each with the reason.
type Verdict = Option<Result<String, String>>;

/// The mode the runtime settings allow: owned only when every runtime
/// whose settings are present proves it loads the first file alone.
pub fn select(files: &dyn HostFiles) -> Selection {
    let verdicts = CONTAINERD_CONFIGS
        .iter()
        .map(|p| containerd(files, Path::new(p)))
        .chain(std::iter::once_with(|| crio(files)));
    // The first runtime not proven decides.
    let (mode, reason) = match verdicts.flatten().collect::<Result<Vec<_>, _>>() {
        Err(why) => (ChainMode::Inline, why),
        Ok(proofs) if proofs.is_empty() => (
            ChainMode::Inline,
            format!(
                "no containerd or CRI-O settings found ({}, {CRIO_CONFIG}, \
                 {CRIO_DROP_INS}/*.conf): cannot tell whether the runtime loads the first \
                 config file alone",
                CONTAINERD_CONFIGS.join(", ")
            ),
        ),
        Ok(proofs) => (ChainMode::Owned, proofs.join("; ")),
    };
    Selection { mode, reason }
}

fn parse(path: &Path, text: &str) -> Result<Document<String>, String> {
    Document::parse(text.to_string()).map_err(|e| {
        let line = e.span().map_or(0, |s| {
            text.get(..s.start).map_or(0, |t| t.matches('\n').count()) + 1
        });
        format!(
            "cannot parse {} (line {line}): {}",
            path.display(),
            e.message().trim()
        )
    })
}

/// `item` followed along `keys`; None when a table on the way is missing.
fn lookup<'a>(item: &'a Item, keys: &[&str]) -> Option<&'a Item> {
    keys.iter()
        .try_fold(item, |it, k| it.get(k))
        .filter(|it| !it.is_none())
}

fn containerd(files: &dyn HostFiles, main: &Path) -> Verdict {
    let not_proven = |why| Some(Err(why));
    // Breadth first from the main file, each file once, as containerd
    // loads them; a later file overrides an earlier one.
    let mut pending = VecDeque::from([main.to_path_buf()]);
    let mut loaded = BTreeSet::new();
    // (the value, the file that set it), per CRI plugin table.
    let mut set: BTreeMap<usize, (i64, PathBuf)> = BTreeMap::new();
    while let Some(path) = pending.pop_front() {
        if !loaded.insert(path.clone()) {
            continue;
        }
        if loaded.len() > MAX_IMPORTED {
            return not_proven(format!(
                "containerd's {} imports more than {MAX_IMPORTED} files",
                main.display()
            ));
        }
        let text = match files.read(&path) {
            Ok(Some(t)) => t,
            Ok(None) if path == main => return None,
            Ok(None) => {
                return not_proven(format!(
                    "containerd's {} imports {}, which does not exist here (is it mounted?)",
                    main.display(),
                    path.display()
                ));
            }
            Err(e) => return not_proven(format!("cannot read {}: {e}", path.display())),
        };
        let doc = match parse(&path, &text) {
            Ok(d) => d,
            Err(e) => return not_proven(e),
        };
        for (i, keys) in CRI_PLUGINS.iter().enumerate() {
            if let Some(v) = lookup(doc.as_item(), &[keys, &["max_conf_num"][..]].concat()) {
                let Some(n) = v.as_integer() else {
                    return not_proven(format!(
                        "containerd's max_conf_num in {} is a {}, not an integer",
                        path.display(),
                        v.type_name()
                    ));
                };
                set.insert(i, (n, path.clone()));
            }
        }
        match imports(files, &path, doc.as_item()) {
            Ok(more) => pending.extend(more),
            Err(e) => return not_proven(e),
        }
    }
    let read = match loaded.len() {
        1 => main.display().to_string(),
        n => format!("{} and {} imported files", main.display(), n - 1),
    };
    if let Some((value, file)) = set.values().find(|(v, _)| *v != 1) {
        return not_proven(format!(
            "containerd's max_conf_num is {value} (in {}): it loads {} config files, so an own \
             file in front of the primary's would attach every pod to its network twice",
            file.display(),
            match value {
                0 => "all",
                v if *v < 0 => "an unknown number of",
                _ => "several",
            },
        ));
    }
    Some(Ok(match set.values().next() {
        Some((_, file)) => format!(
            "containerd's max_conf_num is 1 (in {}; read {read}): it loads the first config file \
             alone",
            file.display()
        ),
        None => format!(
            "containerd's max_conf_num is unset (default 1; read {read}): it loads the first \
             config file alone"
        ),
    }))
}

/// What a containerd config's `imports` name, in order: relative paths
/// from the importing file's directory, globs not expanded.
fn import_patterns(from: &Path, doc: &Item) -> Result<Vec<PathBuf>, String> {
    let Some(item) = lookup(doc, &["imports"]) else {
        return Ok(vec![]);
    };
    let array = item
        .as_array()
        .ok_or_else(|| format!("imports in {} is not a list", from.display()))?;
    let base = from.parent().unwrap_or(Path::new("/"));
    array
        .iter()
        .map(|v| {
            v.as_str()
                .map(|s| base.join(s))
                .ok_or_else(|| format!("imports in {} holds a non-string", from.display()))
        })
        .collect()
}

fn is_pattern(p: &Path) -> bool {
    p.to_string_lossy().contains(['*', '?', '['])
}

/// The files a containerd config's `imports` name, in order, globs
/// expanded (sorted).
fn imports(files: &dyn HostFiles, from: &Path, doc: &Item) -> Result<Vec<PathBuf>, String> {
    let mut out = vec![];
    for p in import_patterns(from, doc)? {
        out.extend(glob(files, &p)?);
    }
    Ok(out)
}

/// The directories holding the settings [`select`] reads, each with the
/// names in it that matter (a name or an imports glob's last part), for
/// the installer's watch: containerd's config files and what their
/// imports pull in, CRI-O's `crio.conf` and drop-ins. Only directories that
/// exist; a file that does not parse still has its directory watched, so
/// its repair is seen. Best effort: what this misses (a glob over
/// directories) the periodic reconcile covers.
pub fn settings_dirs(files: &dyn HostFiles) -> Vec<(PathBuf, Vec<String>)> {
    let mut dirs: Vec<(PathBuf, Vec<String>)> = vec![];
    let mut add = |path: &Path| {
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return;
        };
        if is_pattern(dir) || !matches!(files.list(dir), Ok(Some(_))) {
            return;
        }
        let name = name.to_string_lossy().into_owned();
        match dirs.iter_mut().find(|(d, _)| d == dir) {
            // Already covered (a glob's match, met again as an import).
            Some((_, names))
                if names
                    .iter()
                    .any(|n| *n == name || name_matches(n, &name) == Some(true)) => {}
            Some((_, names)) => names.push(name),
            None => dirs.push((dir.to_path_buf(), vec![name])),
        }
    };
    let mut pending: VecDeque<PathBuf> = CONTAINERD_CONFIGS.iter().map(PathBuf::from).collect();
    let mut seen = BTreeSet::new();
    while let Some(path) = pending.pop_front() {
        if seen.len() > MAX_IMPORTED || !seen.insert(path.clone()) {
            continue;
        }
        add(&path);
        let Ok(Some(text)) = files.read(&path) else {
            continue;
        };
        let Ok(doc) = parse(&path, &text) else {
            continue;
        };
        for p in import_patterns(&path, doc.as_item()).unwrap_or_default() {
            add(&p);
            pending.extend(glob(files, &p).unwrap_or_default());
        }
    }
    let drop_ins = Path::new(CRIO_DROP_INS);
    add(Path::new(CRIO_CONFIG));
    // The drop-in directory itself, created or removed.
    add(drop_ins);
    add(&drop_ins.join("*.conf"));
    dirs
}

/// The existing paths matching `pattern` (`*`, `?` and `[...]` within a
/// name, as Go's filepath.Glob), sorted per directory; a path without a
/// pattern is itself, whether it exists or not.
fn glob(files: &dyn HostFiles, pattern: &Path) -> Result<Vec<PathBuf>, String> {
    if !is_pattern(pattern) {
        return Ok(vec![pattern.to_path_buf()]);
    }
    let mut found = vec![PathBuf::from("/")];
    for c in pattern.components() {
        let part = match c {
            Component::RootDir | Component::Prefix(_) | Component::CurDir => continue,
            Component::ParentDir => {
                found = found
                    .into_iter()
                    .map(|p| p.parent().map_or(p.clone(), Path::to_path_buf))
                    .collect();
                continue;
            }
            Component::Normal(n) => n.to_string_lossy().into_owned(),
        };
        if !part.contains(['*', '?', '[']) {
            found = found.into_iter().map(|p| p.join(&part)).collect();
            continue;
        }
        let mut next = vec![];
        for dir in found {
            let names = files
                .list(&dir)
                .map_err(|e| format!("cannot list {}: {e}", dir.display()))?
                .unwrap_or_default();
            for n in names {
                if name_matches(&part, &n)
                    .ok_or_else(|| format!("bad pattern in imports: {}", pattern.display()))?
                {
                    next.push(dir.join(n));
                }
            }
        }
        found = next;
    }
    Ok(found)
}

/// Go's filepath.Match for one name: `*` (no `/`), `?`, `[...]` (ranges,
/// `^` negation), `\\` escapes. None for a malformed pattern. Matched as the
/// regex it translates to (the regex crate, which kube-rs links already).
pub fn name_matches(pattern: &str, name: &str) -> Option<bool> {
    let lit = |c: char| regex::escape(c.encode_utf8(&mut [0; 4]));
    let mut re = String::from("(?s)^");
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        match c {
            '*' => re.push_str(".*"),
            '?' => re.push('.'),
            '\\' => re.push_str(&lit(chars.next()?)),
            '[' => {
                let (class, rest) = chars.as_str().split_once(']')?;
                chars = rest.chars();
                let (negate, class) = match class.strip_prefix('^') {
                    Some(c) => ("^", c),
                    None => ("", class),
                };
                if class.is_empty() {
                    return None;
                }
                // Led by an empty class, so that a class whose only range
                // is inverted (which matches nothing, as in Go) is still a
                // regex.
                re.push_str(&format!("[{negate}[^\\x00-\\x{{10FFFF}}]"));
                let class: Vec<char> = class.chars().collect();
                let mut i = 0;
                while let Some(&lo) = class.get(i) {
                    if class.get(i + 1) == Some(&'-')
                        && let Some(&hi) = class.get(i + 2)
                    {
                        if lo <= hi {
                            re.push_str(&format!("{}-{}", lit(lo), lit(hi)));
                        }
                        i += 3;
                    } else {
                        re.push_str(&lit(lo));
                        i += 1;
                    }
                }
                re.push(']');
            }
            c => re.push_str(&lit(c)),
        }
    }
    re.push('$');
    Some(regex::Regex::new(&re).ok()?.is_match(name))
}

fn crio(files: &dyn HostFiles) -> Verdict {
    let main = PathBuf::from(CRIO_CONFIG);
    let drop_ins = Path::new(CRIO_DROP_INS);
    let mut paths = vec![];
    match files.read(&main) {
        Ok(Some(t)) => paths.push((main.clone(), t)),
        Ok(None) => {}
        Err(e) => return Some(Err(format!("cannot read {}: {e}", main.display()))),
    }
    let names = match files.list(drop_ins) {
        Ok(n) => n.unwrap_or_default(),
        Err(e) => {
            return Some(Err(format!("cannot list {}: {e}", drop_ins.display())));
        }
    };
    let mut names: Vec<String> = names.into_iter().filter(|n| n.ends_with(".conf")).collect();
    names.sort();
    for n in names {
        let p = drop_ins.join(n);
        match files.read(&p) {
            Ok(Some(t)) => paths.push((p, t)),
            // Gone since the listing.
            Ok(None) => {}
            Err(e) => return Some(Err(format!("cannot read {}: {e}", p.display()))),
        }
    }
    if paths.is_empty() {
        return None;
    }
    let mut pinned: Option<(String, PathBuf)> = None;
    for (p, text) in &paths {
        let doc = match parse(p, text) {
            Ok(d) => d,
            Err(e) => return Some(Err(e)),
        };
        if let Some(v) = lookup(doc.as_item(), &["crio", "network", "cni_default_network"]) {
            let Some(s) = v.as_str() else {
                return Some(Err(format!(
                    "CRI-O's cni_default_network in {} is not a string",
                    p.display()
                )));
            };
            pinned = (!s.is_empty()).then(|| (s.to_string(), p.clone()));
        }
    }
    let read = match paths.len() {
        1 => format!(
            "{}",
            paths.first().map_or(main, |(p, _)| p.clone()).display()
        ),
        n => format!("{n} files in /etc/crio"),
    };
    Some(match pinned {
        Some((name, file)) => Err(format!(
            "CRI-O's cni_default_network is {name:?} (in {}): it picks the network by name, and \
             an own file would hold the same name as the primary's",
            file.display()
        )),
        None => Ok(format!(
            "CRI-O's cni_default_network is unset (read {read}): it uses the first valid config \
             file alone"
        )),
    })
}

/// [`settings_dirs`] as the installer's container sees them.
pub fn settings_watch(cfg: &Config) -> Vec<(PathBuf, Vec<String>)> {
    settings_dirs(&Host {
        prefix: &cfg.mount_prefix,
    })
    .into_iter()
    .map(|(dir, names)| (under_prefix(&cfg.mount_prefix, &dir), names))
    .collect()
}

/// Sandboxes that libcni's result cache on the host shows attached to one
/// network more than once: one line per sandbox and network, sorted; None
/// when the cache cannot be read (not mounted, another runtime's layout).
pub fn cached_double_attachments(files: &dyn HostFiles) -> Option<Vec<String>> {
    let dir = Path::new(RESULTS_DIR);
    let mut seen: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for name in files.list(dir).ok()??.into_iter().take(MAX_CACHE_ENTRIES) {
        let Ok(Some(text)) = files.read(&dir.join(name)) else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<Value>(&text) else {
            // Not an entry of ours to judge (being written, another format).
            continue;
        };
        let field = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
        if let (Some(id), Some(net), Some(ifname)) =
            (field("containerId"), field("networkName"), field("ifName"))
        {
            seen.entry((id, net)).or_default().insert(ifname);
        }
    }
    let found = seen
        .into_iter()
        .filter(|(_, ifs)| ifs.len() > 1)
        .map(|((id, net), ifs)| {
            format!(
                "sandbox {id} is attached to network {net:?} {} times ({}): the runtime loads \
                 more than one config file holding that network",
                ifs.len(),
                ifs.into_iter().collect::<Vec<_>>().join(", ")
            )
        });
    Some(found.collect())
}

/// Owned mode forced against the runtime's settings: the warning.
fn conflict_warning(settings: &str) -> String {
    format!(
        "owned chain mode is forced, but the runtime's settings do not show that it loads the \
         first config file alone ({settings}); pods may be attached to the primary's network \
         twice. Set chain_mode to auto (or inline)"
    )
}

/// Says in the installer's log which chain mode the entry selects and why
/// (once per change); owned mode forced against the runtime's settings
/// (every pass); sandboxes attached to one network twice (once per change).
pub fn log_mode(notes: &mut Notes, mode: &ModeNote, prefix: &Path) {
    notes.log_change(
        "mode",
        Level::INFO,
        format!("chain mode {}: {}", mode.mode, mode.why),
    );
    if let Some(settings) = &mode.conflict {
        tracing::warn!("{}", conflict_warning(settings));
    }
    match cached_double_attachments(&Host { prefix }) {
        Some(found) if !found.is_empty() => {
            notes.log_change("attachments", Level::WARN, found.join("; "))
        }
        _ => notes.clear("attachments", || {
            "no sandbox is attached to one network twice any more".to_string()
        }),
    }
}

/// For `check`: lines to print whatever the verdict (the mode and why,
/// warnings), and problems (sandboxes attached to one network twice).
pub fn check_report(cfg: &Config) -> (Vec<String>, Vec<String>) {
    let mut lines = vec![];
    if let Ok((_, mode)) = cfg.desired() {
        lines.push(format!("mode: {} ({})", mode.mode, mode.why));
        if let Some(settings) = &mode.conflict {
            lines.push(format!("warning: {}", conflict_warning(settings)));
        }
    }
    let problems = cached_double_attachments(&Host {
        prefix: &cfg.mount_prefix,
    })
    .unwrap_or_default();
    (lines, problems)
}

#[cfg(test)]
mod tests;
