//! Say a state once: the reconcile runs every few seconds, and a line per
//! pass about an unchanged condition ("no primary config yet") would drown
//! the lines about actions taken. A condition is logged when it starts or
//! changes, and its end is logged once when it was a problem.

use std::collections::HashMap;

use log::Level;

#[derive(Debug, Default)]
pub struct Notes {
    /// topic -> (level, message) last logged.
    last: HashMap<String, (Level, String)>,
}

impl Notes {
    /// Logs `msg` unless it is what was last said about `topic`.
    pub fn say(&mut self, topic: &str, level: Level, msg: String) {
        if self.last.get(topic).is_some_and(|(_, m)| *m == msg) {
            return;
        }
        log::log!(level, "{msg}");
        self.last.insert(topic.to_string(), (level, msg));
    }

    /// Records `msg` as said without logging it (an action's own log line
    /// already told the story).
    pub fn assume(&mut self, topic: &str, level: Level, msg: String) {
        self.last.insert(topic.to_string(), (level, msg));
    }

    /// The condition about `topic` is over: when it was a warning or an
    /// error, `resolved` is logged once.
    pub fn clear(&mut self, topic: &str, resolved: impl FnOnce() -> String) {
        if let Some((level, _)) = self.last.remove(topic)
            && level <= Level::Warn
        {
            log::info!("{}", resolved());
        }
    }
}
