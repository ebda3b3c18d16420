//! Counting how each ADD ended, in the plugin's state dir (see
//! `linkerd_cni_state::outcomes`, which owns the file): the mapping from
//! an ADD's result to its counter.

use std::path::Path;

use linkerd_cni_state::outcomes::{self, Outcome, RetryCause};

use crate::cni::{CniError, code};

/// The counter `result` adds to: its own when the ADD succeeded, else its
/// error's.
pub fn of(result: &Result<Outcome, CniError>) -> Outcome {
    match result {
        Ok(o) => *o,
        Err(e) if e.code == code::TRY_AGAIN_LATER => {
            Outcome::TryAgain(e.retry_cause.unwrap_or(RetryCause::Other))
        }
        Err(e) => Outcome::Failed(e.code),
    }
}

/// Adds `result` to the counters in `state_dir`. Never fails the ADD: a
/// count that cannot be made is logged at debug level and lost.
pub fn count(state_dir: &Path, result: &Result<Outcome, CniError>) {
    if let Err(e) = outcomes::count(state_dir, of(result)) {
        log::debug!(
            "cannot count this ADD's outcome in {}: {e}",
            state_dir.join(outcomes::OUTCOMES_FILE).display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use linkerd_cni_state::outcomes::PassCause;

    #[test]
    fn results_map_to_their_counters() {
        let cases = [
            (Ok(Outcome::Meshed), Outcome::Meshed),
            (Ok(Outcome::Unmeshed), Outcome::Unmeshed),
            (Ok(Outcome::Exempt), Outcome::Exempt),
            (
                Ok(Outcome::PassedThrough(PassCause::Forbidden)),
                Outcome::PassedThrough(PassCause::Forbidden),
            ),
            (
                Err(CniError::try_again(RetryCause::Deadline, "m", "d")),
                Outcome::TryAgain(RetryCause::Deadline),
            ),
            (
                Err(CniError::new(code::TRY_AGAIN_LATER, "m", "d")),
                Outcome::TryAgain(RetryCause::Other),
            ),
            (
                Err(CniError::new(code::IPTABLES, "m", "d")),
                Outcome::Failed(101),
            ),
        ];
        for (r, want) in cases {
            assert_eq!(of(&r), want, "{r:?}");
        }
    }
}
