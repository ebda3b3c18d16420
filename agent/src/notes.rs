//! Log a state once: the reconcile runs every few seconds, and a line per
//! pass about an unchanged condition ("no primary config yet") would drown
//! the lines about actions taken. A condition is logged when it starts or
//! changes, and its end is logged once when it was a problem.

use std::collections::HashMap;

use tracing::Level;

#[derive(Debug, Default)]
pub struct Notes {
    /// topic -> (level, message) last logged.
    last: HashMap<String, (Level, String)>,
}

impl Notes {
    /// Logs `msg` unless it is what was last logged about `topic`.
    pub fn log_change(&mut self, topic: &str, level: Level, msg: String) {
        self.log_if_changed(topic, level, msg);
    }

    /// [`Notes::log_change`], returning whether it logged.
    fn log_if_changed(&mut self, topic: &str, level: Level, msg: String) -> bool {
        if self.last.get(topic).is_some_and(|(_, m)| *m == msg) {
            return false;
        }
        event(level, &msg);
        self.last.insert(topic.to_string(), (level, msg));
        true
    }

    /// Records `msg` as logged without logging it (an action's own log line
    /// already told the story).
    pub fn mark_logged(&mut self, topic: &str, level: Level, msg: String) {
        self.last.insert(topic.to_string(), (level, msg));
    }

    /// Forgets `topic` silently: an action's own log line said it is over.
    pub fn clear_silently(&mut self, topic: &str) {
        self.last.remove(topic);
    }

    /// The condition about `topic` is over: when it was a warning or an
    /// error, `resolved` is logged once.
    pub fn clear(&mut self, topic: &str, resolved: impl FnOnce() -> String) {
        self.clear_logged(topic, resolved);
    }

    /// [`Notes::clear`], returning whether it logged.
    fn clear_logged(&mut self, topic: &str, resolved: impl FnOnce() -> String) -> bool {
        match self.last.remove(topic) {
            Some((level, _)) if level <= Level::WARN => {
                tracing::info!("{}", resolved());
                true
            }
            _ => false,
        }
    }
}

/// `msg` at `level`, which tracing's macros take only as a constant.
fn event(level: Level, msg: &str) {
    match level {
        Level::ERROR => tracing::error!("{msg}"),
        Level::WARN => tracing::warn!("{msg}"),
        Level::INFO => tracing::info!("{msg}"),
        Level::DEBUG => tracing::debug!("{msg}"),
        _ => tracing::trace!("{msg}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_per_change_and_resolution_only_for_problems() {
        let mut n = Notes::default();
        assert!(n.log_if_changed("chain", Level::INFO, "waiting".into()));
        assert!(!n.log_if_changed("chain", Level::INFO, "waiting".into()));
        assert!(n.log_if_changed("chain", Level::INFO, "chained".into()));
        // An info state ending is not news.
        assert!(!n.clear_logged("chain", || "over".into()));
        assert!(n.log_if_changed("kc", Level::ERROR, "no token".into()));
        assert!(!n.log_if_changed("kc", Level::ERROR, "no token".into()));
        assert!(n.clear_logged("kc", || "token back".into()));
        assert!(!n.clear_logged("kc", || "token back".into()));
        // After an action line, the problem is forgotten without a word.
        n.log_change("bin", Level::ERROR, "cannot copy".into());
        n.clear_silently("bin");
        assert!(!n.clear_logged("bin", || "ok".into()));
        // mark_logged(): the next identical state is not logged again.
        n.mark_logged("chain", Level::INFO, "chained in x".into());
        assert!(!n.log_if_changed("chain", Level::INFO, "chained in x".into()));
    }
}
