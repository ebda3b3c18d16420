//! The state of the active config as far as linkerd-cni is concerned: what
//! the inline layout's diagnosis finds, and what the copy in owned mode is
//! checked against.

use std::fmt;

/// The state of the active config, as far as linkerd-cni is concerned.
/// Positions are 0-based indices into the chain's `plugins`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainState {
    /// One linkerd-cni entry, last, equal to the desired one.
    Healthy,
    /// No config file at all: the primary CNI has not written its own yet.
    NoPrimaryConfig,
    /// The active config holds no plugin but linkerd-cni: not a primary's.
    NoPrimaryPlugin,
    /// The active file cannot be read or is not a config the runtime can
    /// load. Never touched: it is reported for its owner to fix.
    Invalid { reason: String },
    /// The active file is a single-plugin `.conf` (or `.json`): it must
    /// become a `.conflist` to hold a chain.
    SingleConf,
    /// No linkerd-cni entry in the chain.
    Missing,
    /// One entry, not last.
    NotLast { position: usize, len: usize },
    /// Several entries.
    Duplicated { positions: Vec<usize>, len: usize },
    /// One entry, last, but different from the desired one in `keys`.
    Stale { position: usize, keys: Vec<String> },
}

impl ChainState {
    /// Whether [`repair`] would rewrite the active file.
    pub fn is_repairable(&self) -> bool {
        matches!(
            self,
            ChainState::SingleConf
                | ChainState::Missing
                | ChainState::NotLast { .. }
                | ChainState::Duplicated { .. }
                | ChainState::Stale { .. }
        )
    }

    /// What is wrong, for people.
    pub fn describe(&self) -> String {
        match self {
            ChainState::Healthy => "healthy: the linkerd-cni entry is last and up to date".into(),
            ChainState::NoPrimaryConfig => {
                "no network config yet (no *.conf, *.conflist or *.json file)".into()
            }
            ChainState::NoPrimaryPlugin => {
                "the active config holds no plugin but linkerd-cni (not a primary CNI's config)"
                    .into()
            }
            ChainState::Invalid { reason } => format!("the active config is unusable: {reason}"),
            ChainState::SingleConf => {
                "the active config is a single-plugin file, which cannot hold a chain".into()
            }
            ChainState::Missing => "the linkerd-cni entry is missing".into(),
            ChainState::NotLast { position, len } => format!(
                "the linkerd-cni entry is plugin {} of {len}, not last",
                position + 1
            ),
            ChainState::Duplicated { positions, len } => format!(
                "{} linkerd-cni entries, at plugins {} of {len}",
                positions.len(),
                positions
                    .iter()
                    .map(|p| (p + 1).to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            ChainState::Stale { position, keys } => format!(
                "the linkerd-cni entry (plugin {}) differs from the desired one in {}",
                position + 1,
                keys.iter()
                    .map(|k| format!("{k:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

impl fmt::Display for ChainState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}
