//! linkerd's redirect rules in a pod's network namespace.
//!
//! - [`rules`]: the typed model (what the rules are, upstream's exact text).
//! - [`table`]: the live nat table, the restore batch, the differences.
//! - [`nft`]: `iptables-mode: nft` in-process, over netlink.
//! - [`exec`]: the node's iptables binaries, run with a time bound.
//! - [`legacy`]: whether a legacy nat table is empty, read in-process.
//!
//! Each address family is programmed with ONE transaction in the pod's
//! netns: in nft mode an nf_tables batch over netlink, the same rules
//! `iptables-nft-restore` would install (its binary is the fallback when
//! netlink is refused); otherwise ONE `*-restore --noflush` call, after
//! reading the table with `*-save` (skipped when the table is known empty).

pub mod exec;
pub mod legacy;
pub mod nft;
pub mod rules;
pub mod table;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use thiserror::Error;

pub use exec::{ExecError, Tools};
pub use nft::NftError;
pub use rules::{Family, RedirectSpec, RuleSet};
pub use table::NatTable;

use crate::config::IptablesMode;
use crate::netns::{self, NetnsError};

/// How to drive iptables.
#[derive(Debug, Clone)]
pub struct Driver {
    pub mode: IptablesMode,
    /// `use-wait-flag`: pass `-w` to `*-restore`.
    pub wait: bool,
    /// The most one iptables command may take.
    pub timeout: Duration,
    /// Where to look for the binaries.
    pub dirs: Vec<PathBuf>,
    /// When set, no command runs past it (the ADD's deadline).
    pub deadline: Option<Instant>,
}

impl Driver {
    pub fn new(mode: IptablesMode, wait: bool) -> Driver {
        Driver {
            mode,
            wait,
            // Generous: with -w, iptables waits on the node-wide xtables
            // lock, which kube-proxy can hold for seconds on big clusters.
            timeout: Duration::from_secs(30),
            dirs: exec::search_dirs(std::env::var_os("PATH").as_deref()),
            deadline: None,
        }
    }

    /// The same driver, whose commands all end by `deadline`.
    pub fn until(mut self, deadline: Instant) -> Driver {
        self.deadline = Some(deadline);
        self
    }

    /// Makes the netns at `netns` hold exactly each set's chains and jumps.
    pub fn apply(&self, netns: &Path, sets: &[RuleSet]) -> Result<(), IptablesError> {
        netns::run_in(netns, || -> Result<(), IptablesError> {
            for set in sets {
                let in_process = || nft::apply(set, self.timeout, self.deadline);
                if let Err(t) = self.in_process_or_binaries(set.family, in_process)? {
                    self.restore(netns, set, &t)?;
                }
            }
            Ok(())
        })?
    }

    /// How the netns at `netns` differs from the sets; empty when it matches.
    pub fn verify(&self, netns: &Path, sets: &[RuleSet]) -> Result<Vec<String>, IptablesError> {
        netns::run_in(netns, || -> Result<Vec<String>, IptablesError> {
            let mut diffs = Vec::new();
            for set in sets {
                let in_process = || nft::verify(set, self.timeout, self.deadline);
                match self.in_process_or_binaries(set.family, in_process)? {
                    Ok(d) => diffs.extend(d),
                    Err(t) => diffs.extend(table::differences(set, &self.current(&t)?)),
                }
            }
            Ok(diffs)
        })?
    }

    /// In nft mode, what `in_process` gives; otherwise, or when it fails,
    /// the binaries to do it with instead.
    fn in_process_or_binaries<T>(
        &self,
        family: Family,
        in_process: impl FnOnce() -> Result<T, NftError>,
    ) -> Result<Result<T, Tools>, IptablesError> {
        if self.mode != IptablesMode::Nft {
            return Ok(Err(Tools::find(self.mode, family, &self.dirs)?));
        }
        let netlink = match in_process() {
            Ok(v) => return Ok(Ok(v)),
            Err(e) => e,
        };
        // nf_tables cannot be programmed over netlink (e.g. a kernel or a
        // sandbox refusing NETLINK_NETFILTER): the binaries, if any.
        match Tools::find(self.mode, family, &self.dirs) {
            Ok(t) => {
                log::warn!(
                    "{family} rules over netlink failed ({netlink}); using {} instead",
                    t.restore.display()
                );
                Ok(Err(t))
            }
            Err(exec) => Err(IptablesError::Netlink {
                family,
                netlink,
                exec,
            }),
        }
    }

    /// One `*-restore --noflush` batch bringing the table to `set`.
    fn restore(&self, netns: &Path, set: &RuleSet, t: &Tools) -> Result<(), IptablesError> {
        let batch = table::restore_batch(set, &self.current(t)?);
        log::debug!(
            "{} --noflush{} in {}:\n{batch}",
            t.restore.display(),
            if self.wait { " -w" } else { "" },
            netns.display()
        );
        t.restore(&batch, self.wait, bounded(self.timeout, self.deadline))?;
        Ok(())
    }

    /// The nat table as `*-save` prints it. When the table is known, read
    /// in-process, to hold no rule and no chain of its own (a new pod's),
    /// `*-save` is not run: it would print nothing more.
    fn current(&self, t: &Tools) -> Result<NatTable, IptablesError> {
        let empty = match t.mode {
            IptablesMode::Legacy => legacy::nat_is_empty(t.family).ok(),
            IptablesMode::Nft => nft::dump(t.family, self.timeout, self.deadline)
                .ok()
                .map(|l| l.is_empty()),
            // `iptables` may be either backend.
            IptablesMode::Plain => None,
        };
        if empty == Some(true) {
            return Ok(NatTable::default());
        }
        let timeout = bounded(self.timeout, self.deadline);
        Ok(NatTable::parse(&t.save(timeout)?))
    }
}

/// `timeout`, cut to what is left before `deadline` (zero once past it).
pub(crate) fn bounded(timeout: Duration, deadline: Option<Instant>) -> Duration {
    deadline.map_or(timeout, |d| {
        timeout.min(d.saturating_duration_since(Instant::now()))
    })
}

#[derive(Debug, Error)]
pub enum IptablesError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error(
        "cannot program the {family} rules over netlink ({netlink}), and cannot fall back on the node's binaries: {exec}"
    )]
    Netlink {
        family: Family,
        netlink: NftError,
        exec: ExecError,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn driver(mode: IptablesMode, dirs: Vec<PathBuf>) -> Driver {
        Driver {
            dirs,
            ..Driver::new(mode, false)
        }
    }

    fn refused() -> Result<(), NftError> {
        Err(NftError::Socket(nix::errno::Errno::EPROTONOSUPPORT))
    }

    #[test]
    fn a_refused_netlink_falls_back_on_the_nft_binaries() {
        let d = testkit::TempDir::new("fallback").unwrap();
        for n in ["iptables-nft-save", "iptables-nft-restore"] {
            let p = d.path().join(n);
            std::fs::write(&p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let nft = driver(IptablesMode::Nft, vec![d.path().to_path_buf()]);
        // In-process when it works: no binary is looked up.
        assert!(matches!(
            nft.in_process_or_binaries(Family::V4, || Ok(7)),
            Ok(Ok(7))
        ));
        let t = nft
            .in_process_or_binaries(Family::V4, refused)
            .unwrap()
            .unwrap_err();
        assert_eq!(t.restore, d.path().join("iptables-nft-restore"));
        // Legacy never tries netlink.
        let legacy = driver(IptablesMode::Legacy, vec![d.path().to_path_buf()]);
        let ran = std::cell::Cell::new(false);
        let r = legacy.in_process_or_binaries(Family::V4, || {
            ran.set(true);
            Ok(())
        });
        assert!(!ran.get());
        // Only nft binaries here: the fallback order finds them.
        assert_eq!(r.unwrap().unwrap_err().mode, IptablesMode::Nft);

        // Neither netlink nor binaries (IPv6 has none here): both causes.
        let e = nft.in_process_or_binaries(Family::V6, refused).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, IptablesError::Netlink { .. }), "{msg}");
        assert!(
            msg.contains("over netlink")
                && msg.contains("netfilter netlink socket")
                && msg.contains("install iptables on the node"),
            "{msg}"
        );
    }
}
