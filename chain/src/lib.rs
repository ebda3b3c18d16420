//! Chain integrity: keeping linkerd-cni's entry last in the node's active
//! network config, from the state on disk (never from watch events).
//!
//! Shared by the plugin (checks on every ADD, repairs within a budget), the
//! installer (reconciles at start, on a timer and on events), the plugin
//! binary's `chain` CLI and the repair controller's gate. A crate of its own
//! so that the installer gets it without the plugin's Kubernetes client, TLS
//! and YAML: it needs only the file system. This crate owns:
//!
//! - which file is active, exactly as containerd picks it (`scan`, by
//!   [`mod@names`] alone);
//! - the two layouts, symmetric: [`inline`] (our entry last in the primary's
//!   file: [`Diagnosis`], [`ChainState`]) and [`owned`] (a conflist of our
//!   own, recognised by its marker);
//! - the keeper ([`keep`]), the one caller that sequences them, under one
//!   deadline, with the limit on repeated repairs as a trait
//!   ([`RepairLimit`]: a [`FightHistory`], in memory for the installer, on
//!   the wall clock for the short-lived plugin, which keeps it in its state
//!   dir; [`NoLimit`] for the CLI); and the one
//!   definition of healthy ([`health`]);
//! - the text-preserving edit (`plan`, `text`) and the crash-safe write
//!   ([`mod@write`], also the installer's for its binaries and kubeconfig)
//!   under the conf-dir lock ([`lock_dir`]), safe against concurrent
//!   writers that do not take our lock, and recovery from a killed write;
//! - the desired entry ([`Entry`], which is always one of ours), persisted
//!   by the installer in [`ENTRY_FILE`];
//! - the way out on uninstall ([`unchain`]).
//!
//! The conf dir only: the plugin's state dir (its memo of a healthy chain,
//! its repair history, the installer's heartbeat) is the state crate's
//! (`linkerd_cni_state`), which builds on this one.

mod entry;
mod error;
mod fight;
pub mod inline;
mod keeper;
mod lock;
pub mod names;
mod options;
pub mod owned;
mod plan;
mod recover;
mod scan;
mod sha256;
mod state;
mod text;
pub mod write;

pub use entry::{
    ENTRY_FILE, Entry, MODE_REASON_KEY, PLUGIN_TYPE, Replaced, load_entry, persist_entry,
    remove_entry_file,
};
pub use error::{ChainError, EntryProblem};
pub use fight::{FightHistory, content_sha256};
pub use inline::Diagnosis;
#[cfg(test)]
pub(crate) use inline::diagnose;
pub use keeper::{
    Action, Context, Health, HeldBack, HoldCause, Layout, ModeChoice, NoLimit, RepairLimit, Report,
    Retired, health, keep, unchain,
};
pub use lock::{DirLock, LOCK_FILE, flock_until, lock_dir, remove_lock_file};
pub use names::{CONFIG_EXTENSIONS, is_config_name};
pub use options::RepairOptions;
pub use scan::{MAX_CONFIG_SIZE, open_regular, read_file};
pub use state::ChainState;
pub use write::TEMP_PREFIX;

#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod testutil;
