//! The pods the plugin sent back (CNI code 11) for having run a stale copy
//! of the primary's chain in owned mode, so that no pod is sent back more
//! than a bound: the record [`Retries`] in [`STALE_RETRIES_FILE`] in the
//! plugin's state dir, updated under the state dir's lock.

use std::path::Path;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::record::{self, Record};

/// The pods sent back, in the plugin's state dir.
pub const STALE_RETRIES_FILE: &str = "owned-retries.json";

/// Entries older than this are forgotten: a pod's sandbox is retried
/// within seconds to minutes.
const STALE_RETRIES_WINDOW: Duration = Duration::from_secs(600);

/// Longest wait for the state dir's lock around the history's update:
/// concurrent ADDs of other pods each count their own retry (without the
/// lock, one could overwrite another's and a pod be sent back again).
const STALE_RETRIES_LOCK: Duration = Duration::from_secs(1);

/// The record: per pod id, how often it was sent back and when last
/// (seconds since the epoch).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Retries(pub Map<String, Value>);

impl Record for Retries {
    const FILE: &'static str = STALE_RETRIES_FILE;
    const VERSION: u64 = 1;

    fn to_json(&self) -> Map<String, Value> {
        self.0.clone()
    }

    fn from_json(m: Map<String, Value>) -> Result<Self, String> {
        Ok(Retries(m))
    }
}

/// Whether pod `id` may be sent back once more for a stale copy (and
/// counts it), or has been sent back `max` times and is let through. A pod
/// is sent back only once that is recorded: when the history cannot be
/// locked (a write without the lock could lose another ADD's count) or
/// saved, the ADD is let through (the copy it ran holds linkerd-cni), since
/// a send-back nobody counted could be one more than `max`. A history that
/// cannot be read (nor is root's own: another's could let a pod through at
/// once, or send it back for ever) is none.
pub fn send_back_again(state_dir: &Path, id: &str, max: u64) -> bool {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let updated = record::update(state_dir, STALE_RETRIES_LOCK, |r: &mut Retries| {
        let seen = &mut r.0;
        // Times ahead of now are no times (they would never expire).
        seen.retain(|_, v| {
            v.get(1).and_then(Value::as_u64).is_some_and(|t| {
                t <= now.saturating_add(1) && now - t.min(now) < STALE_RETRIES_WINDOW.as_secs()
            })
        });
        let count = seen
            .get(id)
            .and_then(|v| v.get(0))
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let again = count < max;
        if again {
            seen.insert(id.to_string(), serde_json::json!([count + 1, now]));
        } else {
            seen.remove(id);
        }
        again
    });
    match updated {
        Ok(again) => again,
        Err(e) => {
            log::warn!(
                "retry history {} not updated: {e}; this ADD is not sent back",
                record::path::<Retries>(state_dir).display()
            );
            false
        }
    }
}
