//! The check that ends every demo and benchmark run, after the story's
//! guards have run: is anything of this process left? Everything the
//! harness makes carries this process's pid in its name
//! (`lcnic-<kind>-<pid>-<n>`), so what is left is found by name, not
//! remembered: network namespaces, temp dirs, and processes (an installer, a
//! plugin or the libcni driver) whose command line or environment names one
//! of those temp dirs. Whatever is found is stopped or removed, and said.

use std::path::Path;
use std::time::{Duration, Instant};

use testkit::names::{self, PREFIX};

/// Stops and removes what this process left, and reports on stderr under
/// `name`. Returns whether everything was already gone.
pub fn check(name: &str) -> bool {
    let me = std::process::id();
    let tmp = std::env::temp_dir().display().to_string();
    let processes = processes_naming(&tmp, me);
    for (pid, _) in &processes {
        signal(*pid, libc::SIGKILL);
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while processes
        .iter()
        .any(|(p, _)| Path::new(&format!("/proc/{p}")).exists())
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let removed = names::remove_named(|pid| pid == me);
    if processes.is_empty() && removed.is_empty() {
        eprintln!(
            "{name}: clean-up checked: no process, network namespace or temp dir of this run is left"
        );
        return true;
    }
    eprintln!("{name}: the run left these behind; removed them now:");
    for (p, cmd) in &processes {
        eprintln!("  process {p}: {cmd}");
    }
    for r in &removed {
        eprintln!("  {r}");
    }
    false
}

fn signal(pid: u32, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) has no memory-safety preconditions; the pid was
        // found by this run's names an instant ago.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// Whether `text` mentions a temp path `<tmp>/lcnic-<kind>-<pid>-<n>` of
/// process `pid`.
fn mentions_temp_of(text: &str, tmp: &str, pid: u32) -> bool {
    let needle = format!("{tmp}/{PREFIX}");
    text.match_indices(&needle).any(|(i, _)| {
        let name: String = text[i + tmp.len() + 1..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        names::owner_pid(&name) == Some(pid)
    })
}

/// Other processes whose command line or environment names a temp dir of
/// process `pid`.
fn processes_naming(tmp: &str, pid: u32) -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| *p != pid)
        .filter_map(|p| {
            let read = |f: &str| {
                std::fs::read(format!("/proc/{p}/{f}"))
                    .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                    .unwrap_or_default()
            };
            let cmdline = read("cmdline");
            (mentions_temp_of(&cmdline, tmp, pid) || mentions_temp_of(&read("environ"), tmp, pid))
                .then(|| (p, cmdline.trim().to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_temp_paths_of_one_pid_only() {
        let env =
            "PATH=/bin NETCONFPATH=/tmp/lcnic-node-42-3/net.d CNI_PATH=/tmp/lcnic-node-42-3/bin";
        assert!(mentions_temp_of(env, "/tmp", 42));
        assert!(!mentions_temp_of(env, "/tmp", 4));
        assert!(!mentions_temp_of(env, "/var/tmp", 42));
        assert!(!mentions_temp_of("X=/tmp/lcnic-node-420-3", "/tmp", 42));
    }
}
