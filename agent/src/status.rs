//! `linkerd-cni-installer status`: the node's state for a person, in the
//! style of `linkerd-cni chain status`. What is on disk is read here (the
//! chain in its mode, readiness, the plugin's ADD counters, the
//! credential); what only the running installer knows (its repairs, fights,
//! last pass) comes from its own `/metrics` when that is on, the same
//! numbers a scraper sees, asked on its root-only admin socket (which no
//! pod can fill, as it can the metrics port).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use linkerd_cni_state::outcomes;

use crate::installer::Installer;
use crate::metrics::{REPAIR_CAUSES, Sources, Verdict};

/// The most a scrape of the running installer may take.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);
/// The most of it read.
const MAX_PAGE: usize = 4 << 20;
/// The most `check --live` waits for the running installer's answer.
const LIVE_TIMEOUT: Duration = Duration::from_secs(3);

/// The report, and whether the node is healthy (chained and ready).
/// `stood_in`: the variables unset in this process (see `main`), without
/// which readiness cannot be judged: said, and left out of the verdict.
pub fn report(inst: &Installer, stood_in: &[&str]) -> (String, bool) {
    let cfg = inst.config();
    let v = inst.chain_verdict();
    let problems = if stood_in.is_empty() {
        inst.check()
    } else {
        vec![]
    };
    let sources = inst.metrics_sources();
    let now = SystemTime::now();
    let mut rows = vec![("mode", mode_line(&v))];
    if let (Some(why), true) = (&v.reason, v.configured == v.selected) {
        rows.push(("mode chosen", why.clone()));
    }
    let chain = match &v.problem {
        None => "healthy: linkerd-cni is chained".to_string(),
        Some(p) => format!("NOT healthy: {p}"),
    };
    let ready = match problems.first() {
        None if !stood_in.is_empty() => format!(
            "unknown: {} not set here (readiness compares the kubeconfig and the entry with \
             them: run this in the install-cni container, or set them); the chain is judged \
             against the entry file on the node",
            stood_in.join(", ")
        ),
        None => "yes".to_string(),
        Some(p) => format!(
            "no: {}",
            p.lines().map(str::trim).collect::<Vec<_>>().join(" ")
        ),
    };
    let socket = sources.plugin_state_dir.join(crate::repair::admin::SOCKET);
    rows.extend([
        ("chain", chain),
        ("ready", ready),
        ("credential", credential_line(&sources, now)),
        ("plugin ADDs", plugin_line(&sources.plugin_state_dir)),
        (
            "installer",
            installer_line(cfg.metrics_addr.is_some(), &socket, now),
        ),
    ]);
    let mut o = String::new();
    for (key, value) in rows {
        let _ = writeln!(o, "{:<15}{value}", format!("{key}:"));
    }
    (o, v.healthy() && problems.is_empty())
}

/// The plugin's credential: its age, and when it is refreshed.
fn credential_line(sources: &Sources, now: SystemTime) -> String {
    let Some(c) = sources.credential() else {
        let at = sources.kubeconfig.display();
        return format!("unknown (no token with iat/exp claims in {at})");
    };
    let age = now.duration_since(c.issued).unwrap_or_default();
    let refresh = match c.next_refresh.map(|r| r.duration_since(now)) {
        None => String::new(),
        Some(Ok(d)) => format!(", refreshed in {}", human(d)),
        Some(Err(_)) => ", refresh overdue".into(),
    };
    format!("token issued {} ago{refresh}", human(age))
}

fn mode_line(v: &Verdict) -> String {
    let selected = v.selected.as_str();
    if v.configured == v.selected {
        return selected.to_string();
    }
    let why = v
        .reason
        .as_ref()
        .map(|r| format!(": {r}"))
        .unwrap_or_default();
    format!(
        "{selected} (the entry asks for {}{why})",
        v.configured.as_str()
    )
}

/// The plugin's counters by outcome, each with its causes (the counters
/// come in slot order, each outcome's causes side by side).
fn plugin_line(dir: &Path) -> String {
    let file = dir.join(outcomes::OUTCOMES_FILE);
    let counts = match outcomes::read(dir) {
        Ok(c) => c,
        Err(e) => return format!("cannot read {}: {e}", file.display()),
    };
    let parts: Vec<String> = counts
        .chunk_by(|(a, _), (b, _)| a.kind() == b.kind())
        .map(|kind| {
            // Counts read from a file: saturating, whatever it holds.
            let n = kind.iter().fold(0u64, |sum, (_, n)| sum.saturating_add(*n));
            let causes: Vec<String> = kind
                .iter()
                .filter(|(o, n)| *n > 0 && !o.cause().is_empty())
                .map(|(o, n)| format!("{} {n}", o.cause()))
                .collect();
            let name = kind[0].0.kind().replace('_', " ");
            match causes.is_empty() {
                true => format!("{name} {n}"),
                false => format!("{name} {n} ({})", causes.join(", ")),
            }
        })
        .collect();
    format!("{} (counted in {})", parts.join(", "), file.display())
}

/// What the running installer reports on its `/metrics`, asked on its
/// admin `socket`.
fn installer_line(metrics_on: bool, socket: &Path, now: SystemTime) -> String {
    if !metrics_on {
        return "metrics off (LINKERD_CNI_METRICS_ADDR unset): its repairs, fights and passes \
                are in its log"
            .into();
    }
    let at = format!("/metrics on {}", socket.display());
    let m = match scrape(socket) {
        Ok(m) => m,
        Err(e) => return format!("cannot read {at}: {e}"),
    };
    let get = |k: &str| m.get(k).copied().unwrap_or_default();
    if !m.contains_key("linkerd_cni_passes_total") {
        return format!(
            "none of its metrics on {at}: it could not serve LINKERD_CNI_METRICS_ADDR (its \
             log says why)"
        );
    }
    let counts = REPAIR_CAUSES.map(|c| {
        (
            c,
            get(&format!("linkerd_cni_chain_repairs_total{{cause=\"{c}\"}}")),
        )
    });
    let total: f64 = counts.iter().map(|(_, n)| n).sum();
    let repairs: Vec<String> = counts
        .iter()
        .filter(|(_, n)| *n > 0.0)
        .map(|(c, n)| format!("{c} {n}"))
        .collect();
    let last = m
        .get("linkerd_cni_last_pass_timestamp_seconds")
        .map(|&t| last_pass(t, now))
        .unwrap_or_else(|| "no pass yet".into());
    let mut s = format!(
        "{} passes, {last}; repairs {total}",
        get("linkerd_cni_passes_total")
    );
    if !repairs.is_empty() {
        let _ = write!(s, " ({})", repairs.join(", "));
    }
    let _ = write!(
        s,
        "; fights {}; repairs held back {} (from {at})",
        get("linkerd_cni_chain_fights_total"),
        get("linkerd_cni_chain_repairs_held_back_total")
    );
    s
}

/// The last pass's Unix time `t` as its age at `now`. The page's number is
/// whatever answers at the address: one no clock can hold (negative, not
/// finite, past the clock's range) is said as it is.
fn last_pass(t: f64, now: SystemTime) -> String {
    match Duration::try_from_secs_f64(t)
        .ok()
        .and_then(|d| UNIX_EPOCH.checked_add(d))
    {
        Some(at) => format!(
            "last pass {} ago",
            human(now.duration_since(at).unwrap_or_default())
        ),
        None => format!("last pass at an invalid time ({t})"),
    }
}

/// One GET of the running installer's page on its admin `socket`, each
/// sample as `name{labels}` -> value.
fn scrape(socket: &Path) -> io::Result<BTreeMap<String, f64>> {
    let body = get(socket.to_path_buf(), "/metrics", SCRAPE_TIMEOUT)?;
    Ok(body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect())
}

/// `GET path` on the admin `socket`: the body of a 200, else the status
/// line and the body as the error. All of it within `bound`, however slowly
/// the other end answers (a timeout per read would let one byte per read
/// keep it waiting forever, and a connect to a Unix socket whose backlog is
/// full blocks): on a thread of its own, left behind when it does not end
/// in time.
fn get(socket: PathBuf, path: &str, bound: Duration) -> io::Result<String> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: linkerd-cni\r\n\r\n");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let exchange = || -> io::Result<Vec<u8>> {
            let mut s = UnixStream::connect(&socket)?;
            s.write_all(request.as_bytes())?;
            let mut bytes = Vec::new();
            // The server closes once it has answered.
            s.take(MAX_PAGE as u64 + 1).read_to_end(&mut bytes)?;
            Ok(bytes)
        };
        let _ = tx.send(exchange());
    });
    let bytes = rx.recv_timeout(bound).map_err(|_| {
        let within = format!("no complete answer within {} s", bound.as_secs_f32());
        io::Error::new(io::ErrorKind::TimedOut, within)
    })??;
    if bytes.len() > MAX_PAGE {
        let large = format!("the answer is larger than {} MiB", MAX_PAGE >> 20);
        return Err(io::Error::other(large));
    }
    let text =
        String::from_utf8(bytes).map_err(|_| io::Error::other("the answer is not UTF-8 text"))?;
    match text.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") => Ok(body.to_string()),
        Some((head, body)) => Err(io::Error::other(format!(
            "{}: {}",
            head.lines().next().unwrap_or_default(),
            body.trim()
        ))),
        None => Err(io::Error::other("no HTTP answer")),
    }
}

/// Whether the installer running on this node answers `/live` on its admin
/// socket in `state_dir` (root's alone: no pod can fill it) within
/// [`LIVE_TIMEOUT`]. Its answer, or why not.
pub fn live(state_dir: &Path) -> Result<String, String> {
    use std::io::ErrorKind::{ConnectionRefused, NotFound, TimedOut};
    let path = state_dir.join(crate::repair::admin::SOCKET);
    let at = path.display();
    match get(path.clone(), "/live", LIVE_TIMEOUT) {
        Ok(body) => Ok(format!("{} (from {at})", body.trim())),
        Err(e) if matches!(e.kind(), NotFound | ConnectionRefused) => Err(format!(
            "the installer is not running on this node: nothing listens on {at} ({e})"
        )),
        Err(e) if e.kind() == TimedOut => Err(format!(
            "the installer did not answer on {at} within {} s: it is hung or overloaded",
            LIVE_TIMEOUT.as_secs()
        )),
        Err(e) => Err(format!("the installer's answer on {at}: {e}")),
    }
}

/// `d` as a person reads it: `42 s`, `5 min`, `3 h 20 min`, `2 d 4 h`.
fn human(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..120 => format!("{s} s"),
        120..7200 => format!("{} min", s / 60),
        7200..172_800 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_for_people() {
        assert_eq!(human(Duration::from_secs(42)), "42 s");
        assert_eq!(human(Duration::from_secs(300)), "5 min");
        assert_eq!(human(Duration::from_secs(12_000)), "3 h 20 min");
        assert_eq!(human(Duration::from_secs(187_200)), "2 d 4 h");
    }

    /// A one-shot HTTP server on a socket in `dir` answering `page` with
    /// `200`, `pause` between its bytes; the socket's path.
    fn serve_once(dir: &testkit::TempDir, page: String, pause: Duration) -> PathBuf {
        let socket = dir.path().join(crate::repair::admin::SOCKET);
        let _ = std::fs::remove_file(&socket);
        let l = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        std::thread::spawn(move || {
            let Ok((mut c, _)) = l.accept() else { return };
            let mut head = [0u8; 1024];
            let _ = c.read(&mut head);
            let answer = format!("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n{page}");
            if pause.is_zero() {
                let _ = c.write_all(answer.as_bytes());
                return;
            }
            for b in answer.as_bytes() {
                if c.write_all(&[*b]).is_err() {
                    return;
                }
                std::thread::sleep(pause);
            }
        });
        socket
    }

    /// The page's last-pass time is the answering server's word: values no
    /// clock holds are reported, not a panic (an abort in the release
    /// build).
    #[test]
    fn a_last_pass_time_no_clock_holds_is_reported_not_a_panic() {
        let tmp = testkit::TempDir::new("status-clock").unwrap();
        for t in [
            "-1",
            "NaN",
            "+Inf",
            "-Inf",
            "1e19",
            "1.8446744073709552e19",
            "1e300",
        ] {
            let socket = serve_once(
                &tmp,
                format!(
                    "linkerd_cni_last_pass_timestamp_seconds {t}\nlinkerd_cni_passes_total 3\n"
                ),
                Duration::ZERO,
            );
            let l = installer_line(true, &socket, SystemTime::now());
            assert!(l.contains("last pass at an invalid time ("), "{t}: {l}");
            assert!(l.starts_with("3 passes"), "{t}: {l}");
        }
        let now = UNIX_EPOCH + Duration::from_secs(1_000_100);
        assert_eq!(last_pass(1_000_000.0, now), "last pass 100 s ago");
    }

    /// The 2 s bound the whole exchange: a server sending a byte every
    /// 1.5 s (each read within a per-read timeout) is given up on at 2 s.
    #[test]
    fn a_server_trickling_its_answer_is_given_up_on_in_time() {
        let tmp = testkit::TempDir::new("status-trickle").unwrap();
        let socket = serve_once(
            &tmp,
            "linkerd_cni_passes_total 3\n".into(),
            Duration::from_millis(1500),
        );
        let start = std::time::Instant::now();
        let got = scrape(&socket);
        let took = start.elapsed();
        assert!(got.is_err(), "{got:?}");
        assert!(
            took < SCRAPE_TIMEOUT + Duration::from_secs(1),
            "took {took:?}"
        );
        let e = got.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
    }

    #[test]
    fn a_scrape_reads_the_samples() {
        let tmp = testkit::TempDir::new("status-scrape").unwrap();
        let socket = serve_once(
            &tmp,
            "# HELP x y\nlinkerd_cni_passes_total 3\nlinkerd_cni_chain_fights_total 1\n".into(),
            Duration::ZERO,
        );
        let m = scrape(&socket).unwrap();
        assert_eq!(m.get("linkerd_cni_passes_total"), Some(&3.0));
        assert_eq!(m.get("linkerd_cni_chain_fights_total"), Some(&1.0));
    }

    /// Metrics on, but the running installer's page holds none of its
    /// metrics (it could not bind its port): said, not read as zeros.
    #[test]
    fn a_page_without_the_installer_metrics_is_not_read_as_zeros() {
        let tmp = testkit::TempDir::new("status-none").unwrap();
        let socket = serve_once(&tmp, "# EOF\n".into(), Duration::ZERO);
        let l = installer_line(true, &socket, SystemTime::now());
        assert!(l.starts_with("none of its metrics on /metrics on "), "{l}");
    }

    #[test]
    fn the_credential_says_its_age_and_its_refresh() {
        use base64::Engine;
        let tmp = testkit::TempDir::new("status-credential").unwrap();
        let sources = Sources {
            plugin_state_dir: tmp.path().to_path_buf(),
            token_file: tmp.path().join("token"),
            kubeconfig: tmp.path().join("kubeconfig"),
        };
        let at = |s: u64| UNIX_EPOCH + Duration::from_secs(s);
        let l = credential_line(&sources, at(4600));
        assert!(
            l.starts_with("unknown (no token with iat/exp claims in /"),
            "{l}"
        );
        let claims = r#"{"iat":1000,"exp":11000}"#;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(claims);
        std::fs::write(
            &sources.kubeconfig,
            format!(r#"{{"users":[{{"name":"x","user":{{"token":"h.{b64}.s"}}}}]}}"#),
        )
        .unwrap();
        // Not the installer's own token: refreshed at half its lifetime.
        assert_eq!(
            credential_line(&sources, at(4600)),
            "token issued 60 min ago, refreshed in 23 min"
        );
        assert_eq!(
            credential_line(&sources, at(7000)),
            "token issued 100 min ago, refresh overdue"
        );
    }

    /// Counters at the top of a u64 (a corrupt file) add up without a
    /// panic: the sum saturates.
    #[test]
    fn plugin_counts_at_their_maximum_saturate() {
        let tmp = testkit::TempDir::new("status-max").unwrap();
        std::fs::write(
            tmp.path().join(outcomes::OUTCOMES_FILE),
            vec![0xff; outcomes::SLOTS * 8],
        )
        .unwrap();
        let l = plugin_line(tmp.path());
        assert!(l.contains(&format!("failed {}", u64::MAX)), "{l}");
    }

    #[test]
    fn plugin_counts_by_outcome_with_causes() {
        let tmp = testkit::TempDir::new("status").unwrap();
        for o in [
            outcomes::Outcome::Meshed,
            outcomes::Outcome::Meshed,
            outcomes::Outcome::TryAgain(outcomes::RetryCause::StaleOwnedCopy),
            outcomes::Outcome::Failed(101),
        ] {
            outcomes::count(tmp.path(), o).unwrap();
        }
        let l = plugin_line(tmp.path());
        assert!(
            l.starts_with(
                "meshed 2, unmeshed 0, exempt 0, passed through 0, try again 1 (stale_owned_copy 1), failed 1 (101 1)"
            ),
            "{l}"
        );
    }
}
