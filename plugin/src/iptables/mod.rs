//! linkerd's redirect rules in a pod's network namespace.
//!
//! - [`rules`]: the typed model (what the rules are, upstream's exact text).
//! - [`table`]: the live nat table, the restore batch, the differences.
//! - [`exec`]: the node's iptables binaries, run with a time bound.
//!
//! Each address family is programmed with ONE `*-restore --noflush` call, in
//! the pod's netns, after reading the table with `*-save` there.

pub mod exec;
pub mod rules;
pub mod table;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use thiserror::Error;

pub use exec::{ExecError, Tools};
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

    /// The bound for the next command: its own timeout, cut to what is left
    /// before the deadline.
    fn step_timeout(&self) -> Duration {
        match self.deadline {
            Some(d) => self
                .timeout
                .min(d.saturating_duration_since(Instant::now())),
            None => self.timeout,
        }
    }

    fn tools(&self, sets: &[RuleSet]) -> Result<Vec<Tools>, IptablesError> {
        sets.iter()
            .map(|s| Tools::find(self.mode, s.family, &self.dirs).map_err(IptablesError::Exec))
            .collect()
    }

    /// Makes the netns at `netns` hold exactly each set's chains and jumps.
    pub fn apply(&self, netns: &Path, sets: &[RuleSet]) -> Result<(), IptablesError> {
        let tools = self.tools(sets)?;
        netns::run_in(netns, || -> Result<(), IptablesError> {
            for (set, t) in sets.iter().zip(&tools) {
                let current = NatTable::parse(&t.save(self.step_timeout())?);
                let batch = table::restore_batch(set, &current);
                log::debug!(
                    "{} --noflush{} in {}:\n{batch}",
                    t.restore.display(),
                    if self.wait { " -w" } else { "" },
                    netns.display()
                );
                t.restore(&batch, self.wait, self.step_timeout())?;
            }
            Ok(())
        })?
    }

    /// How the netns at `netns` differs from the sets; empty when it matches.
    pub fn verify(&self, netns: &Path, sets: &[RuleSet]) -> Result<Vec<String>, IptablesError> {
        let tools = self.tools(sets)?;
        netns::run_in(netns, || -> Result<Vec<String>, IptablesError> {
            let mut diffs = Vec::new();
            for (set, t) in sets.iter().zip(&tools) {
                let current = NatTable::parse(&t.save(self.step_timeout())?);
                diffs.extend(table::differences(set, &current));
            }
            Ok(diffs)
        })?
    }
}

#[derive(Debug, Error)]
pub enum IptablesError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Exec(#[from] ExecError),
}
