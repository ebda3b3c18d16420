//! Container images written by the harness, offline: an OCI image layout
//! (one uncompressed layer) packed as the tar archive `ctr images import`
//! reads. Used for the sandbox ("pause") image, built here from a few lines
//! of C with `gcc -static`, and for linkerd-cni's own image, laid out as the
//! Dockerfile's final stage lays it out.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::{Value, json};

use testkit::child_path;

/// One file of a layer.
#[derive(Debug, Clone)]
pub struct File {
    /// Path in the image, without the leading `/`.
    pub path: String,
    pub mode: u32,
    pub content: Vec<u8>,
}

/// An image: one layer of files, and the config's entrypoint.
#[derive(Debug, Clone)]
pub struct Image {
    /// The reference containerd stores it under, e.g.
    /// `lcnic.local/pause:1`.
    pub name: String,
    pub files: Vec<File>,
    pub entrypoint: Vec<String>,
}

impl Image {
    /// The `docker save`-like archive of an OCI image layout holding this
    /// image, tagged with containerd's image-name annotation (so `ctr
    /// images import` names it without `--base-name`).
    pub fn oci_archive(&self) -> Vec<u8> {
        let layer = self.layer_tar();
        let layer_digest = sha256(&layer);
        let config = json!({
            "architecture": oci_arch(),
            "os": "linux",
            "config": {"Entrypoint": self.entrypoint, "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
        });
        let config = serde_json::to_vec(&config).unwrap_or_default();
        let config_digest = sha256(&config);
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": format!("sha256:{config_digest}"),
                "size": config.len(),
            },
            "layers": [{
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": format!("sha256:{layer_digest}"),
                "size": layer.len(),
            }],
        });
        let manifest = serde_json::to_vec(&manifest).unwrap_or_default();
        let manifest_digest = sha256(&manifest);
        let tag = self.name.rsplit_once(':').map_or("latest", |(_, t)| t);
        let index = json!({
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": format!("sha256:{manifest_digest}"),
                "size": manifest.len(),
                "platform": {"architecture": oci_arch(), "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": self.name,
                    "org.opencontainers.image.ref.name": tag,
                },
            }],
        });
        let mut tar = Tar::default();
        tar.file("oci-layout", 0o644, br#"{"imageLayoutVersion":"1.0.0"}"#);
        tar.file(
            "index.json",
            0o644,
            &serde_json::to_vec(&index).unwrap_or_default(),
        );
        tar.dir("blobs");
        tar.dir("blobs/sha256");
        for (digest, blob) in [
            (&layer_digest, &layer),
            (&config_digest, &config),
            (&manifest_digest, &manifest),
        ] {
            tar.file(&format!("blobs/sha256/{digest}"), 0o644, blob);
        }
        tar.finish()
    }

    fn layer_tar(&self) -> Vec<u8> {
        let mut tar = Tar::default();
        let mut dirs: Vec<String> = Vec::new();
        for f in &self.files {
            let mut parent = String::new();
            let parts: Vec<&str> = f.path.split('/').collect();
            for p in &parts[..parts.len().saturating_sub(1)] {
                if !parent.is_empty() {
                    parent.push('/');
                }
                parent.push_str(p);
                if !dirs.contains(&parent) {
                    dirs.push(parent.clone());
                    tar.dir(&parent);
                }
            }
            tar.file(&f.path, f.mode, &f.content);
        }
        tar.finish()
    }

    /// Writes [`Image::oci_archive`] to `path`.
    pub fn write_archive(&self, path: &Path) {
        std::fs::write(path, self.oci_archive())
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    }
}

/// This machine's architecture as OCI names it (containerd unpacks only
/// images for its platform).
fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// A ustar archive, enough for regular files and directories owned by
/// root.
#[derive(Default)]
struct Tar(Vec<u8>);

impl Tar {
    fn entry(&mut self, name: &str, mode: u32, kind: u8, content: &[u8]) {
        assert!(name.len() < 100, "tar entry name too long: {name}");
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        let octal = |h: &mut [u8; 512], at: usize, width: usize, v: u64| {
            let s = format!("{v:0w$o}\0", w = width - 1);
            h[at..at + width].copy_from_slice(s.as_bytes());
        };
        octal(&mut h, 100, 8, u64::from(mode));
        octal(&mut h, 108, 8, 0);
        octal(&mut h, 116, 8, 0);
        octal(&mut h, 124, 12, content.len() as u64);
        octal(&mut h, 136, 12, 0);
        h[156] = kind;
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
        let s = format!("{sum:06o}\0 ");
        h[148..156].copy_from_slice(s.as_bytes());
        self.0.extend_from_slice(&h);
        self.0.extend_from_slice(content);
        let pad = (512 - content.len() % 512) % 512;
        self.0.extend(std::iter::repeat_n(0u8, pad));
    }

    fn file(&mut self, name: &str, mode: u32, content: &[u8]) {
        self.entry(name, mode, b'0', content);
    }

    fn dir(&mut self, name: &str) {
        self.entry(&format!("{name}/"), 0o755, b'5', &[]);
    }

    fn finish(mut self) -> Vec<u8> {
        self.0.extend(std::iter::repeat_n(0u8, 1024));
        self.0
    }
}

/// Hex SHA-256 of `data`, by coreutils' `sha256sum`.
fn sha256(data: &[u8]) -> String {
    let mut child = Command::new("sha256sum")
        .env("PATH", child_path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run sha256sum: {e}"));
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(data)
            .unwrap_or_else(|e| panic!("writing to sha256sum: {e}"));
    }
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("sha256sum: {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    let hex = text.split_whitespace().next().unwrap_or_default();
    assert!(out.status.success() && hex.len() == 64, "sha256sum: {text}");
    hex.to_string()
}

/// The sandbox image's reference.
pub const PAUSE_IMAGE: &str = "lcnic.local/pause:1";

/// The pause program: PID 1 of every sandbox, holding its namespaces; exits
/// at SIGTERM (how containerd stops a sandbox) or SIGINT.
const PAUSE_C: &str = r#"#include <signal.h>
#include <unistd.h>
static void done(int sig) { (void)sig; _exit(0); }
int main(void) {
    signal(SIGTERM, done);
    signal(SIGINT, done);
    for (;;) pause();
}
"#;

/// The pause binary, built once per process (`gcc -static`, a fraction of a
/// second) into the test profile's directory, so it is never stale.
pub fn pause_binary() -> &'static Path {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match BIN.get_or_init(build_pause) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

fn build_pause() -> Result<PathBuf, String> {
    let dir = super::profile_dir().join("cri");
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let src = dir.join(format!(".pause-{}.c", testkit::names::unique_id()));
    let tmp = dir.join(format!(".pause-{}.tmp", testkit::names::unique_id()));
    std::fs::write(&src, PAUSE_C).map_err(|e| format!("cannot write {}: {e}", src.display()))?;
    let out = Command::new("gcc")
        .args(["-static", "-Os", "-s", "-o"])
        .arg(&tmp)
        .arg(&src)
        .env("PATH", child_path())
        .output();
    let _ = std::fs::remove_file(&src);
    let out = out.map_err(|e| {
        format!("cannot run gcc to build the pause binary ({e}): install gcc and libc6-dev (bash scripts/setup.sh)")
    })?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!(
            "gcc -static failed building the pause binary (install libc6-dev): {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let bin = dir.join("pause");
    std::fs::rename(&tmp, &bin).map_err(|e| format!("cannot install {}: {e}", bin.display()))?;
    Ok(bin)
}

/// The sandbox image: the pause binary alone.
pub fn pause_image() -> Image {
    let content = std::fs::read(pause_binary())
        .unwrap_or_else(|e| panic!("cannot read the pause binary: {e}"));
    Image {
        name: PAUSE_IMAGE.into(),
        files: vec![File {
            path: "pause".into(),
            mode: 0o755,
            content,
        }],
        entrypoint: vec!["/pause".into()],
    }
}

/// What the Dockerfile's final stage puts in the image: each `COPY`'s
/// destination with the file name of its source (one of the workspace's
/// binaries), and the `ENTRYPOINT`. Read from the Dockerfile so the test
/// image follows its layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerfileLayout {
    /// (source file name, destination path in the image)
    pub copies: Vec<(String, String)>,
    pub entrypoint: Vec<String>,
}

impl DockerfileLayout {
    pub fn parse(text: &str) -> Result<DockerfileLayout, String> {
        // Continuation lines joined; only the final stage counts.
        let joined = text.replace("\\\n", " ");
        let lines: Vec<&str> = joined
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        let last_from = lines
            .iter()
            .rposition(|l| l.to_ascii_uppercase().starts_with("FROM "))
            .ok_or("no FROM in the Dockerfile")?;
        let mut copies = Vec::new();
        let mut entrypoint = Vec::new();
        for line in &lines[last_from + 1..] {
            let (instr, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
            match instr.to_ascii_uppercase().as_str() {
                "COPY" => {
                    let words: Vec<&str> = rest
                        .split_whitespace()
                        .filter(|w| !w.starts_with("--"))
                        .collect();
                    let [srcs @ .., dest] = words.as_slice() else {
                        return Err(format!("cannot read {line:?}"));
                    };
                    for src in srcs {
                        let name = src.rsplit('/').next().unwrap_or(src).to_string();
                        let to = if dest.ends_with('/') {
                            format!("{dest}{name}")
                        } else {
                            dest.to_string()
                        };
                        copies.push((name, to));
                    }
                }
                "ENTRYPOINT" => {
                    let v: Value = serde_json::from_str(rest)
                        .map_err(|e| format!("ENTRYPOINT is not an exec-form array: {e}"))?;
                    entrypoint = v
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|s| s.as_str().map(String::from))
                                .collect()
                        })
                        .unwrap_or_default();
                }
                _ => {}
            }
        }
        if copies.is_empty() || entrypoint.is_empty() {
            return Err("the Dockerfile's final stage has no COPY or no ENTRYPOINT".into());
        }
        Ok(DockerfileLayout { copies, entrypoint })
    }

    /// The repository's Dockerfile.
    pub fn of_repository() -> DockerfileLayout {
        let path = super::workspace_root().join("Dockerfile");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        DockerfileLayout::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// Where the image holds the binary named `name`.
    pub fn destination(&self, name: &str) -> Option<&str> {
        self.copies
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, d)| d.as_str())
    }
}

/// linkerd-cni's image, built from this workspace's binaries with the
/// Dockerfile's layout. `binary(name)` gives the freshly built file for a
/// COPY source named `name`.
pub fn project_image(
    name: &str,
    layout: &DockerfileLayout,
    binary: impl Fn(&str) -> PathBuf,
) -> Image {
    let files = layout
        .copies
        .iter()
        .map(|(src, dest)| {
            let p = binary(src);
            File {
                path: dest.trim_start_matches('/').to_string(),
                mode: 0o755,
                content: std::fs::read(&p)
                    .unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display())),
            }
        })
        .collect();
    Image {
        name: name.into(),
        files,
        entrypoint: layout.entrypoint.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dockerfile_final_stage() {
        let text = "FROM rust AS build\nCOPY . .\nRUN x \\\n  y\nFROM scratch\n\
                    COPY --from=build /src/target/release/a /opt/cni/bin/a\n\
                    COPY --from=build /src/b /usr/local/bin/\n\
                    ENTRYPOINT [\"/usr/local/bin/b\"]\n";
        let l = DockerfileLayout::parse(text).unwrap();
        assert_eq!(
            l.copies,
            [
                ("a".to_string(), "/opt/cni/bin/a".to_string()),
                ("b".to_string(), "/usr/local/bin/b".to_string())
            ]
        );
        assert_eq!(l.entrypoint, ["/usr/local/bin/b"]);
    }

    #[test]
    fn tar_headers_have_valid_checksums() {
        let mut t = Tar::default();
        t.file("a/b", 0o755, b"hello");
        let bytes = t.finish();
        assert_eq!(bytes.len(), 512 + 512 + 1024);
        let mut h = bytes[..512].to_vec();
        let stored = u32::from_str_radix(std::str::from_utf8(&h[148..154]).unwrap(), 8).unwrap();
        h[148..156].copy_from_slice(b"        ");
        assert_eq!(stored, h.iter().map(|b| u32::from(*b)).sum::<u32>());
    }
}
