//! The plugin's ADD outcomes, counted: how every ADD on the node ended
//! (meshed, unmeshed, exempt, passed through and why, sent back with code 11
//! and why, failed and with which code), so that the installer can export
//! what no single short-lived plugin process remembers.
//!
//! One file in the plugin's state dir (tmpfs, never the conf dir, where any
//! write makes runtimes reload): [`OUTCOMES_FILE`], [`SLOTS`] little-endian
//! `u64` counters at fixed offsets, nothing else. An ADD adds one to one
//! slot under an exclusive `flock` of the file: one read and one aligned
//! 8-byte write in place, so concurrent ADDs never lose a count and no reader
//! (who takes the lock shared) sees a half-updated slot. The file is never
//! replaced, so there is no temp file to leave behind; a slot's meaning
//! never changes once shipped (new causes take free slots, and a newer
//! layout takes a new file name), so plugins of different versions on one
//! node count into the same file.
//!
//! Counting is best effort: a state dir that cannot be written, or a lock
//! held past [`LOCK_WAIT`], loses that one count and never fails the ADD.
//! The file is opened without following links and used only when it is
//! root's own regular file ([`crate::statefile`]), for counting and reading.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

/// The counters file in the plugin's state dir. The version is in the name:
/// a different layout is a different file.
pub const OUTCOMES_FILE: &str = "add-outcomes.v1";
/// Slots in the file (a fixed size, so creating it is one `ftruncate`).
pub const SLOTS: usize = 64;
const FILE_LEN: u64 = (SLOTS * 8) as u64;
/// The longest an ADD waits for another's count: each holds the lock for
/// two system calls, so only a stopped process holds it longer.
pub const LOCK_WAIT: Duration = Duration::from_millis(50);

/// Why a pod was passed through without rules although it may be meshed:
/// the plugin could not tell. A cause's value is its slot in the file:
/// shipped slots never move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PassCause {
    /// The kubeconfig does not exist (an uninstall, or no installer yet).
    KubeconfigMissing = 8,
    /// HTTP 401 on the pod GET: a dead token.
    Unauthorized = 9,
    /// HTTP 403 on the pod GET: RBAC without pods.
    Forbidden = 10,
    /// `kubernetes.agent-only`: no node agent answered, and none is
    /// expected (no live installer heartbeat: the DaemonSet is gone).
    NoAgent = 11,
    /// A cause this table does not name (a newer plugin's).
    Other = 15,
}

impl PassCause {
    /// Every cause, with its label.
    const ALL: [(PassCause, &'static str); 5] = [
        (PassCause::KubeconfigMissing, "kubeconfig_missing"),
        (PassCause::Unauthorized, "unauthorized"),
        (PassCause::Forbidden, "forbidden"),
        (PassCause::NoAgent, "no_agent"),
        (PassCause::Other, "other"),
    ];
}

/// Why an ADD answered code 11 ("try again later"). A cause's value is its
/// slot in the file: shipped slots never move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RetryCause {
    /// Owned mode: the ADD ran a stale copy of the primary's chain.
    StaleOwnedCopy = 16,
    /// The API server was unreachable, slow or overloaded.
    ApiUnavailable = 17,
    /// The ADD's deadline (`add_deadline_seconds`) ran out.
    Deadline = 18,
    /// The API server rejected the plugin's credentials while an installer
    /// is alive to renew them.
    CredentialsRejected = 19,
    /// The kubeconfig does not exist while an installer is alive: it is
    /// being written (or rewritten) by it.
    KubeconfigMissing = 20,
    /// `kubernetes.agent-only`: no node agent answered while one is
    /// expected (the installer's heartbeat is live).
    NoAgent = 21,
    /// A cause this table does not name.
    Other = 31,
}

impl RetryCause {
    /// Every cause, with its label.
    const ALL: [(RetryCause, &'static str); 7] = [
        (RetryCause::StaleOwnedCopy, "stale_owned_copy"),
        (RetryCause::ApiUnavailable, "api_unavailable"),
        (RetryCause::Deadline, "deadline"),
        (RetryCause::CredentialsRejected, "credentials_rejected"),
        (RetryCause::KubeconfigMissing, "kubeconfig_missing"),
        (RetryCause::NoAgent, "no_agent"),
        (RetryCause::Other, "other"),
    ];
}

/// How one ADD ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Rules installed (or, with `simulate`, would have been).
    Meshed,
    /// No `linkerd-proxy`, or its own `linkerd-init`: not ours to redirect.
    Unmeshed,
    /// An exempt namespace, or not a Kubernetes pod at all.
    Exempt,
    PassedThrough(PassCause),
    TryAgain(RetryCause),
    /// Any other CNI error, by code.
    Failed(u32),
}

/// The error codes with a slot of their own; others count as `other`.
const FAILED_CODES: [u32; 12] = [1, 2, 3, 4, 5, 6, 7, 100, 101, 102, 103, 199];

impl Outcome {
    /// The outcome's slot in the file. Shipped slots never move.
    fn slot(self) -> usize {
        match self {
            Outcome::Meshed => 0,
            Outcome::Unmeshed => 1,
            Outcome::Exempt => 2,
            Outcome::PassedThrough(c) => c as usize,
            Outcome::TryAgain(c) => c as usize,
            Outcome::Failed(code) => match FAILED_CODES.iter().position(|&c| c == code) {
                Some(i) => 32 + i,
                None => SLOTS - 1,
            },
        }
    }

    /// Every outcome with a slot, in slot order.
    pub fn all() -> Vec<Outcome> {
        let mut v = vec![Outcome::Meshed, Outcome::Unmeshed, Outcome::Exempt];
        v.extend(PassCause::ALL.map(|(c, _)| Outcome::PassedThrough(c)));
        v.extend(RetryCause::ALL.map(|(c, _)| Outcome::TryAgain(c)));
        v.extend(FAILED_CODES.map(Outcome::Failed));
        v.push(Outcome::Failed(0));
        v
    }

    /// The outcome's kind: `meshed`, `unmeshed`, `exempt`,
    /// `passed_through`, `try_again` or `failed`.
    pub fn kind(self) -> &'static str {
        match self {
            Outcome::Meshed => "meshed",
            Outcome::Unmeshed => "unmeshed",
            Outcome::Exempt => "exempt",
            Outcome::PassedThrough(_) => "passed_through",
            Outcome::TryAgain(_) => "try_again",
            Outcome::Failed(_) => "failed",
        }
    }

    /// The cause within the kind (the code for `failed`, `other` for a
    /// code without a slot); empty for the kinds without causes.
    pub fn cause(self) -> String {
        match self {
            Outcome::Meshed | Outcome::Unmeshed | Outcome::Exempt => String::new(),
            Outcome::PassedThrough(c) => label(&PassCause::ALL, c).into(),
            Outcome::TryAgain(c) => label(&RetryCause::ALL, c).into(),
            Outcome::Failed(code) if FAILED_CODES.contains(&code) => code.to_string(),
            Outcome::Failed(_) => "other".into(),
        }
    }
}

/// `cause`'s label in `all`, its cause table.
fn label<C: PartialEq>(all: &[(C, &'static str)], cause: C) -> &'static str {
    all.iter()
        .find(|(c, _)| *c == cause)
        .map_or("other", |(_, l)| l)
}

/// Adds one to `outcome`'s counter in `state_dir`, creating the dir (0700)
/// and the file (0600) when missing.
pub fn count(state_dir: &Path, outcome: Outcome) -> io::Result<()> {
    let path = state_dir.join(OUTCOMES_FILE);
    // Non-blocking, never through a link, and refused unless root's own
    // regular file: whatever sits in its place (a FIFO, a device) must not
    // hold up an ADD, and no ADD may write into a file a link points at.
    let open = || crate::statefile::open_rw(&path, 0o600);
    let file = match open() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            crate::record::create_dir(state_dir).map_err(io::Error::other)?;
            open()?
        }
        r => r?,
    };
    lock(&file, true)?;
    let off = (outcome.slot() * 8) as u64;
    let mut b = [0u8; 8];
    // A slot past the end: a file just created (or cut short), extended
    // with zeros, which a reader sees as zero counts either way. No stat
    // first: one system call fewer on every ADD.
    if file.read_at(&mut b, off)? < b.len() {
        file.set_len(FILE_LEN)?;
        b = [0; 8];
    }
    let n = u64::from_le_bytes(b).wrapping_add(1);
    file.write_all_at(&n.to_le_bytes(), off)
}

/// Every counter in `state_dir`, in slot order; all zero when the file
/// does not exist yet.
pub fn read(state_dir: &Path) -> io::Result<Vec<(Outcome, u64)>> {
    let mut buf = [0u8; FILE_LEN as usize];
    match crate::statefile::open(&state_dir.join(OUTCOMES_FILE)) {
        Ok(file) => {
            lock(&file, false)?;
            // A short file reads as zeros past its end.
            let mut bytes = Vec::with_capacity(buf.len());
            (&file).take(FILE_LEN).read_to_end(&mut bytes)?;
            buf[..bytes.len()].copy_from_slice(&bytes);
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    Ok(Outcome::all()
        .into_iter()
        .map(|o| {
            let i = o.slot() * 8;
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[i..i + 8]);
            (o, u64::from_le_bytes(b))
        })
        .collect())
}

/// Takes the file's lock (exclusive or shared), waiting at most
/// [`LOCK_WAIT`]; released when the file is closed.
fn lock(file: &File, exclusive: bool) -> io::Result<()> {
    crate::record::flock_within(file, exclusive, LOCK_WAIT)
        .map_err(|e| io::Error::new(e.kind(), format!("{OUTCOMES_FILE}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn every_outcome_has_its_own_slot_and_label() {
        let all = Outcome::all();
        let slots: HashSet<usize> = all.iter().map(|o| o.slot()).collect();
        assert_eq!(slots.len(), all.len());
        assert!(slots.iter().all(|&s| s < SLOTS));
        let labels: HashSet<(&str, String)> = all.iter().map(|o| (o.kind(), o.cause())).collect();
        assert_eq!(labels.len(), all.len());
        // A code without a slot shares `other`.
        assert_eq!(Outcome::Failed(42).slot(), Outcome::Failed(0).slot());
        assert_eq!(Outcome::Failed(42).cause(), "other");
    }

    #[test]
    fn counts_add_up_across_threads_and_a_missing_dir() {
        let tmp = testkit::TempDir::new("outcomes").unwrap();
        let dir = tmp.path().join("state");
        assert!(read(&dir).unwrap().iter().all(|(_, n)| *n == 0));
        std::thread::scope(|s| {
            for t in 0..8 {
                let dir = &dir;
                s.spawn(move || {
                    for _ in 0..50 {
                        let o = if t % 2 == 0 {
                            Outcome::Meshed
                        } else {
                            Outcome::TryAgain(RetryCause::Deadline)
                        };
                        count(dir, o).unwrap();
                    }
                });
            }
        });
        count(&dir, Outcome::Failed(101)).unwrap();
        let got: Vec<(Outcome, u64)> = read(&dir)
            .unwrap()
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .collect();
        assert_eq!(
            got,
            vec![
                (Outcome::Meshed, 200),
                (Outcome::TryAgain(RetryCause::Deadline), 200),
                (Outcome::Failed(101), 1),
            ]
        );
        let len = std::fs::metadata(dir.join(OUTCOMES_FILE)).unwrap().len();
        assert_eq!(len, FILE_LEN);
    }

    /// A counter file that is not a regular file (a FIFO would block a
    /// plain open until a writer comes) is refused at once, by the
    /// installer's read and by the plugin's count alike.
    #[test]
    fn a_counter_file_that_is_not_regular_is_refused_without_blocking() {
        let within = Duration::from_secs(20);
        let tmp = testkit::TempDir::new("outcomes-fifo").unwrap();
        let dir = tmp.path().to_path_buf();
        testkit::mkfifo(&dir.join(OUTCOMES_FILE));
        let d = dir.clone();
        let e = testkit::bounded("read a FIFO", within, move || read(&d)).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let d = dir.clone();
        let e = testkit::bounded("count into a FIFO", within, move || {
            count(&d, Outcome::Meshed)
        })
        .unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        // A directory in its place.
        let d = tmp.path().join("dir");
        std::fs::create_dir_all(d.join(OUTCOMES_FILE)).unwrap();
        assert!(read(&d).is_err());
        assert!(count(&d, Outcome::Meshed).is_err());
    }

    #[test]
    fn a_short_file_reads_as_zeros_and_is_extended() {
        let tmp = testkit::TempDir::new("outcomes").unwrap();
        std::fs::write(tmp.path().join(OUTCOMES_FILE), 5u64.to_le_bytes()).unwrap();
        let first = read(tmp.path()).unwrap();
        assert_eq!(first[0], (Outcome::Meshed, 5));
        assert!(first[1..].iter().all(|(_, n)| *n == 0));
        count(tmp.path(), Outcome::Exempt).unwrap();
        let after = read(tmp.path()).unwrap();
        assert_eq!(after[0].1, 5);
        assert_eq!(after[2], (Outcome::Exempt, 1));
    }

    /// The counters file is never opened through a link (every ADD would
    /// write into the link's target, or create it) nor used unless root's
    /// own: the count is lost, the target untouched.
    #[test]
    fn a_counter_file_that_is_a_link_or_not_roots_own_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        testkit::require_root("chown");
        let tmp = testkit::TempDir::new("outcomes-link").unwrap();
        let path = tmp.path().join(OUTCOMES_FILE);
        let absent = tmp.path().join("created-through-the-link");
        std::os::unix::fs::symlink(&absent, &path).unwrap();
        assert!(count(tmp.path(), Outcome::Meshed).is_err());
        assert!(!absent.exists(), "created through the link");
        assert!(read(tmp.path()).is_err());
        std::fs::remove_file(&path).unwrap();
        let target = tmp.path().join("target");
        std::fs::write(&target, [7u8; 16]).unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        assert!(count(tmp.path(), Outcome::Meshed).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), [7u8; 16]);
        std::fs::remove_file(&path).unwrap();
        count(tmp.path(), Outcome::Meshed).unwrap();
        std::os::unix::fs::chown(&path, Some(1000), None).unwrap();
        assert!(count(tmp.path(), Outcome::Meshed).is_err());
        assert!(read(tmp.path()).is_err());
        std::os::unix::fs::chown(&path, Some(0), None).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(count(tmp.path(), Outcome::Meshed).is_err());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        count(tmp.path(), Outcome::Meshed).unwrap();
        assert_eq!(read(tmp.path()).unwrap()[0], (Outcome::Meshed, 2));
    }
}
