//! `linkerd-cni-sh`: the image's `/bin/sh`, and nothing like a shell.
//!
//! The `linkerd2-cni` Helm chart gives its install-cni container the preStop
//! hook `/bin/sh -c "kill -15 1; sleep 15s"`, and the image has no shell.
//! This runs exactly that kind of script: `-c` with commands separated by
//! `;` or newlines, each `kill [-SIG | -N | -s SIG] PID` or
//! `sleep N[s|m]`. Anything else (another command, quoting, variables,
//! pipes, redirections) is refused as a whole, before anything runs, with
//! exit 127 and a message saying what this is: so the image gains no general
//! command interpreter.

use std::process::ExitCode;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const HELP: &str = "\
linkerd-cni-sh: the image's /bin/sh, which is not a shell. It runs only the
linkerd2-cni chart's preStop hook and scripts like it; anything else is
refused as a whole, before anything runs, with exit 127.

USAGE:
    linkerd-cni-sh -c SCRIPT   commands separated by `;` or newlines, each
                               `kill [-SIG | -N | -s SIG] PID` or
                               `sleep N[s|m]`
    linkerd-cni-sh --help      print this help

SETTINGS:
    None: it reads no environment and no file. The image's other programs'
    settings are in docs/configuration.md in the linkerd-cni repository.
";

/// What a shell exits with for a command it cannot run.
const NOT_SUPPORTED: u8 = 127;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Kill { signal: Signal, pid: i32 },
    Sleep(Duration),
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let script = match args.as_slice() {
        [flag] if flag == "--help" || flag == "-h" => {
            print!("{HELP}");
            return ExitCode::SUCCESS;
        }
        [flag, script, ..] if flag == "-c" => script,
        _ => {
            return refuse(&format!(
                "unsupported arguments {args:?}: only `-c SCRIPT` is supported"
            ));
        }
    };
    let steps = match parse(script) {
        Ok(s) => s,
        Err(e) => return refuse(&e),
    };
    let mut status = 0;
    for step in steps {
        status = match step {
            Step::Sleep(d) => {
                std::thread::sleep(d);
                0
            }
            Step::Kill { signal, pid } => match kill(Pid::from_raw(pid), signal) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("linkerd-cni-sh: kill {pid}: {e}");
                    1
                }
            },
        };
    }
    ExitCode::from(status)
}

fn refuse(why: &str) -> ExitCode {
    eprintln!(
        "linkerd-cni-sh: {why}. This image's /bin/sh is not a shell: it runs only `-c` \
         scripts of `kill [-SIG] PID` and `sleep N[s]` commands separated by `;`, for the \
         linkerd2-cni chart's preStop hook"
    );
    ExitCode::from(NOT_SUPPORTED)
}

/// The whole script, or why it is refused.
fn parse(script: &str) -> Result<Vec<Step>, String> {
    if let Some(c) = script
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || " \t\n;-.".contains(*c)))
    {
        return Err(format!("unsupported character {c:?} in {script:?}"));
    }
    let mut steps = vec![];
    for command in script.split([';', '\n']) {
        let words: Vec<&str> = command.split_whitespace().collect();
        match words.as_slice() {
            [] => {}
            ["kill", rest @ ..] => steps.push(parse_kill(rest)?),
            ["sleep", n] => steps.push(Step::Sleep(parse_duration(n)?)),
            ["sleep", ..] => return Err(format!("`{}`: sleep takes one duration", command.trim())),
            [other, ..] => return Err(format!("`{other}`: command not supported")),
        }
    }
    Ok(steps)
}

fn parse_kill(words: &[&str]) -> Result<Step, String> {
    let (signal, pid) = match words {
        ["-s", name, pid] => (parse_signal(name)?, pid),
        [flag, pid] if flag.starts_with('-') => (parse_signal(&flag[1..])?, pid),
        [pid] => (Signal::SIGTERM, pid),
        _ => return Err("kill: takes one process id".into()),
    };
    let pid = pid
        .parse::<i32>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("kill: {pid:?} is not a process id"))?;
    Ok(Step::Kill { signal, pid })
}

fn parse_signal(s: &str) -> Result<Signal, String> {
    if let Ok(n) = s.parse::<i32>() {
        return Signal::try_from(n).map_err(|_| format!("kill: unknown signal {n}"));
    }
    let name = s.to_ascii_uppercase();
    let name = name.strip_prefix("SIG").unwrap_or(&name);
    format!("SIG{name}")
        .parse::<Signal>()
        .map_err(|_| format!("kill: unknown signal {s:?}"))
}

/// `N`, `Ns` or `Nm`; N a non-negative decimal, at most a day.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = match s.char_indices().last() {
        Some((i, 's')) => (&s[..i], 1.0),
        Some((i, 'm')) => (&s[..i], 60.0),
        _ => (s, 1.0),
    };
    num.parse::<f64>()
        .ok()
        .map(|n| n * unit)
        .filter(|secs| secs.is_finite() && (0.0..=86_400.0).contains(secs))
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("sleep: invalid duration {s:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_charts_prestop_script() {
        assert_eq!(
            parse("kill -15 1; sleep 15s").unwrap(),
            [
                Step::Kill {
                    signal: Signal::SIGTERM,
                    pid: 1
                },
                Step::Sleep(Duration::from_secs(15)),
            ]
        );
    }

    #[test]
    fn kill_forms_and_durations() {
        for (script, signal) in [
            ("kill 7", Signal::SIGTERM),
            ("kill -TERM 7", Signal::SIGTERM),
            ("kill -SIGINT 7", Signal::SIGINT),
            ("kill -s KILL 7", Signal::SIGKILL),
            ("kill -9 7", Signal::SIGKILL),
        ] {
            assert_eq!(
                parse(script).unwrap(),
                [Step::Kill { signal, pid: 7 }],
                "{script}"
            );
        }
        assert_eq!(
            parse("sleep 2\nsleep 0.5;;sleep 1m").unwrap(),
            [
                Step::Sleep(Duration::from_secs(2)),
                Step::Sleep(Duration::from_millis(500)),
                Step::Sleep(Duration::from_secs(60)),
            ]
        );
    }

    #[test]
    fn anything_else_is_refused_whole() {
        for script in [
            "kill -15 1; rm -rf /",
            "echo hi",
            "kill -15 $PPID",
            "sleep 1 && kill 1",
            "kill -15 1 | cat",
            "kill \"1\"",
            "kill",
            "kill -15",
            "kill -15 -1",
            "kill -99 1",
            "kill -FOO 1",
            "sleep",
            "sleep 1 2",
            "sleep -1",
            "sleep 2d",
            "sleep 100000",
            // Beyond the chart's hook: one process per kill, no hours.
            "kill -15 1 2",
            "sleep 1h",
        ] {
            assert!(parse(script).is_err(), "{script}");
        }
    }
}
