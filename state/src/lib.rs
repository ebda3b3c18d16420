//! The plugin's state dir on a node (`state_dir`, [`heartbeat::DEFAULT_STATE_DIR`]):
//! what linkerd-cni remembers between short-lived plugin processes and tells
//! between the installer and the plugin, never in the CNI conf dir (where
//! every write would make the runtime reload its network config). This
//! crate owns every file there:
//!
//! - the installer's heartbeat, which tells the plugin whether an installer
//!   is alive to rewrite rejected credentials ([`heartbeat`]);
//! - the plugin's ADD outcome counters, which the installer exports
//!   ([`outcomes`]);
//! - the plugin's healthy verdict remembered by the conf dir's stamps
//!   between ADDs ([`memo`]);
//! - the plugin's repair history, for telling another agent undoing its
//!   repairs ([`fight`]), and the pods it sent back for a stale chain
//!   ([`retries`]);
//! - the rule every one of them is read and written by: root's own regular
//!   files only, never through a link ([`statefile`]);
//! - one discipline for all of them ([`record`]): each file is one typed
//!   record of one writer with its format's version (in the JSON records'
//!   `"v"`, in the memo's first line, in the counters' file name), replaced
//!   whole and atomically, and every read-modify-write is under one `flock`
//!   taken with a bounded wait: the state dir's lock for the records, the
//!   counters file's own for the counts made in place on every ADD.
//!
//! It builds on the chain crate (the conf dir's keeper), never the other
//! way: the keeper takes the repair history through its `RepairLimit`
//! trait.

pub mod fight;
pub mod heartbeat;
pub mod memo;
pub mod outcomes;
pub mod record;
pub mod retries;
pub mod statefile;

pub use fight::{FIGHT_STATE_FILE, PersistedFights};

#[cfg(test)]
pub(crate) mod testutil;
