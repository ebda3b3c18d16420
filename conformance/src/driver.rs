//! One run of the libcni driver, and what it reports: libcni's answer, or
//! its error with the CNI error object libcni decoded from the failing
//! plugin, plus the trace of every plugin execution libcni made.

use std::fmt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::sys;

/// One plugin execution, as libcni made it.
#[derive(Debug, Clone)]
pub struct Exec {
    /// The plugin's file name (its `type`).
    pub plugin: String,
    /// `CNI_COMMAND`: ADD, CHECK, DEL, VERSION.
    pub command: String,
    /// The `CNI_*` environment the plugin ran with.
    pub env: Vec<(String, String)>,
    /// The config libcni built for this plugin (list name and version,
    /// `prevResult`, `runtimeConfig` injected).
    pub stdin: Value,
    /// Empty when the execution failed: libcni decodes a failed plugin's
    /// stdout into its error and keeps the bytes (see `Node::replay`).
    pub stdout: String,
    pub stderr: String,
    /// libcni's error for this execution, if it failed.
    pub error: Option<String>,
    pub duration: Duration,
}

impl Exec {
    /// The `prevResult` libcni handed this plugin.
    pub fn prev_result(&self) -> Option<&Value> {
        self.stdin.get("prevResult")
    }

    /// Stdout as JSON (a result, or an error object).
    pub fn stdout_json(&self) -> Option<Value> {
        serde_json::from_str(&self.stdout).ok()
    }
}

fn parse_trace(text: &str) -> Vec<Exec> {
    let Ok(Value::Array(items)) = serde_json::from_str::<Value>(text) else {
        return Vec::new();
    };
    let s = |v: &Value, k: &str| v[k].as_str().unwrap_or_default().to_string();
    items
        .iter()
        .map(|r| {
            let stdin = s(r, "stdin");
            Exec {
                plugin: s(r, "plugin"),
                command: s(r, "command"),
                env: r["env"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                            .collect()
                    })
                    .unwrap_or_default(),
                stdin: serde_json::from_str(&stdin).unwrap_or(Value::String(stdin)),
                stdout: s(r, "stdout"),
                stderr: s(r, "stderr"),
                error: r["error"].as_str().map(String::from),
                duration: Duration::from_micros(r["durationUs"].as_u64().unwrap_or(0)),
            }
        })
        .collect()
}

fn write_trace(f: &mut fmt::Formatter<'_>, trace: &[Exec]) -> fmt::Result {
    writeln!(f, "plugin executions by libcni:")?;
    if trace.is_empty() {
        writeln!(f, "  (none)")?;
    }
    for e in trace {
        match &e.error {
            None => writeln!(f, "  {} {}: ok ({:?})", e.command, e.plugin, e.duration)?,
            Some(err) => writeln!(f, "  {} {}: FAILED: {err}", e.command, e.plugin)?,
        }
        for line in e.stderr.lines() {
            writeln!(f, "    stderr: {line}")?;
        }
    }
    Ok(())
}

/// A successful driver run.
#[derive(Clone)]
pub struct Completed {
    pub stdout: String,
    pub stderr: String,
    pub trace: Vec<Exec>,
}

impl Completed {
    /// Stdout as JSON: the ADD result libcni returns to the runtime, the
    /// VERSION info, or the capabilities of a validated list.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "driver stdout is not JSON ({e}): {:?}\n{self:?}",
                self.stdout
            )
        })
    }

    /// The executions of plugin `plugin`, in order.
    pub fn execs<'a>(&'a self, plugin: &'a str) -> impl Iterator<Item = &'a Exec> + 'a {
        self.trace.iter().filter(move |e| e.plugin == plugin)
    }
}

impl fmt::Debug for Completed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "libcni succeeded: {}", self.stdout)?;
        write_trace(f, &self.trace)
    }
}

/// A failed driver run: libcni's error, and the CNI error object inside it
/// when a plugin printed one that libcni could decode.
#[derive(Clone)]
pub struct Failed {
    /// libcni's error text, as a runtime would log it.
    pub error: String,
    pub code: Option<u64>,
    pub msg: Option<String>,
    pub details: Option<String>,
    pub exit_code: Option<i32>,
    pub stderr: String,
    pub trace: Vec<Exec>,
}

impl Failed {
    /// The executions of plugin `plugin`, in order.
    pub fn execs<'a>(&'a self, plugin: &'a str) -> impl Iterator<Item = &'a Exec> + 'a {
        self.trace.iter().filter(move |e| e.plugin == plugin)
    }
}

impl fmt::Debug for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "libcni failed (exit {:?}): {}",
            self.exit_code, self.error
        )?;
        if let Some(code) = self.code {
            writeln!(
                f,
                "CNI error: code {code}, msg {:?}, details {:?}",
                self.msg.as_deref().unwrap_or(""),
                self.details.as_deref().unwrap_or("")
            )?;
        }
        write_trace(f, &self.trace)
    }
}

impl std::error::Error for Failed {}

/// What libcni did for one driver run. (`Failed` is boxed: it carries the
/// whole trace.)
pub type Outcome = Result<Completed, Box<Failed>>;

/// Runs the prepared driver command (see `Node::driver_command`) and
/// collects its answer and the trace written to `trace_file`.
pub(crate) fn run(mut cmd: Command, trace_file: &Path) -> Outcome {
    let out = sys::output(&mut cmd);
    let trace = std::fs::read_to_string(trace_file)
        .map(|t| parse_trace(&t))
        .unwrap_or_default();
    let _ = std::fs::remove_file(trace_file);
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        return Ok(Completed {
            stdout,
            stderr,
            trace,
        });
    }
    // -error-json: {"error", and "code"/"msg"/"details" when decoded}.
    let e: Value = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    Err(Box::new(Failed {
        error: e["error"]
            .as_str()
            .map(String::from)
            .unwrap_or_else(|| stderr.trim().to_string()),
        code: e["code"].as_u64(),
        msg: e["msg"].as_str().map(String::from),
        details: e["details"].as_str().map(String::from),
        exit_code: out.status.code(),
        stderr,
        trace,
    }))
}
