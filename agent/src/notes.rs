//! Log a state once: the reconcile runs every few seconds, and a line per
//! pass about an unchanged condition ("no primary config yet") would drown
//! the lines about actions taken. A condition is logged when it starts or
//! changes, and its end is logged once when it was a problem. A line
//! about something that recurs (refused connections) is said at most once
//! an interval instead ([`Throttle`]), as Events are.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tracing::Level;

#[derive(Debug, Default)]
pub struct Notes {
    /// topic -> (level, message) last logged.
    last: HashMap<String, (Level, String)>,
}

impl Notes {
    /// Logs `msg` unless it is what was last logged about `topic`.
    pub fn log_change(&mut self, topic: &str, level: Level, msg: String) {
        if self.last.get(topic).is_some_and(|(_, m)| *m == msg) {
            return;
        }
        event(level, &msg);
        self.last.insert(topic.to_string(), (level, msg));
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
        if let Some((level, _)) = self.last.remove(topic)
            && level <= Level::WARN
        {
            tracing::info!("{}", resolved());
        }
    }
}

/// A log line (or an Event) at most every `every`, counting what it left
/// out.
#[derive(Debug)]
pub struct Throttle {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttle {
    pub fn new(every: Duration) -> Throttle {
        Throttle {
            every,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(suppressed since the last line)` when a line may be logged
    /// now, `None` when this one is to be left out.
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.saturating_duration_since(t) < self.every => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
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
    use std::sync::{Arc, Mutex};

    /// Whether `f` logged anything.
    fn logs(f: impl FnOnce()) -> bool {
        #[derive(Clone, Default)]
        struct Lines(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let out = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(Level::TRACE)
            .with_writer(move || out.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        !lines.0.lock().unwrap().is_empty()
    }

    /// Whether [`Notes::log_change`] logged.
    fn change(n: &mut Notes, topic: &str, level: Level, msg: &str) -> bool {
        logs(|| n.log_change(topic, level, msg.into()))
    }

    /// Whether [`Notes::clear`] logged.
    fn cleared(n: &mut Notes, topic: &str, resolved: &str) -> bool {
        logs(|| n.clear(topic, || resolved.into()))
    }

    #[test]
    fn once_per_change_and_resolution_only_for_problems() {
        let mut n = Notes::default();
        assert!(change(&mut n, "chain", Level::INFO, "waiting"));
        assert!(!change(&mut n, "chain", Level::INFO, "waiting"));
        assert!(change(&mut n, "chain", Level::INFO, "chained"));
        // An info state ending is not news.
        assert!(!cleared(&mut n, "chain", "over"));
        assert!(change(&mut n, "kc", Level::ERROR, "no token"));
        assert!(!change(&mut n, "kc", Level::ERROR, "no token"));
        assert!(cleared(&mut n, "kc", "token back"));
        assert!(!cleared(&mut n, "kc", "token back"));
        // After an action line, the problem is forgotten without a word.
        n.log_change("bin", Level::ERROR, "cannot copy".into());
        n.clear_silently("bin");
        assert!(!cleared(&mut n, "bin", "ok"));
        // mark_logged(): the next identical state is not logged again.
        n.mark_logged("chain", Level::INFO, "chained in x".into());
        assert!(!change(&mut n, "chain", Level::INFO, "chained in x"));
    }

    #[test]
    fn throttle_logs_once_per_interval_with_the_count() {
        let t0 = Instant::now();
        let mut t = Throttle::new(Duration::from_secs(60));
        assert_eq!(t.allow(t0), Some(0));
        for s in 1..=5 {
            assert_eq!(t.allow(t0 + Duration::from_secs(s)), None);
        }
        assert_eq!(t.allow(t0 + Duration::from_secs(61)), Some(5));
        assert_eq!(t.allow(t0 + Duration::from_secs(62)), None);
    }
}
