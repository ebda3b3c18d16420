//! The plugin's side: one synchronous, bounded question.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, UnixAddr, sockopt};

use crate::{Answer, AskError, MAX_ANSWER, Request, VERSION};

/// Asks the agent listening at `socket`, all of it within `budget`.
pub fn ask(socket: &Path, request: &Request, budget: Duration) -> Result<Answer, AskError> {
    let deadline = Instant::now() + budget;
    let mut stream = connect(socket)?;
    write_all(&mut stream, &request.encode(), deadline, budget)?;
    let line = read_line(&mut stream, MAX_ANSWER, deadline, budget)?;
    let answer: Answer =
        serde_json::from_slice(&line).map_err(|e| AskError::Malformed(e.to_string()))?;
    if answer.v != VERSION {
        return Err(AskError::Version(answer.v));
    }
    Ok(answer)
}

/// Reads one line of at most `limit` bytes by `deadline`.
fn read_line(
    stream: &mut UnixStream,
    limit: usize,
    deadline: Instant,
    budget: Duration,
) -> Result<Vec<u8>, AskError> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 16 << 10];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(AskError::TimedOut(budget));
        }
        stream.set_read_timeout(Some(left))?;
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(AskError::TimedOut(budget));
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        if n == 0 {
            return Err(AskError::Malformed(
                "the connection closed before a whole answer".into(),
            ));
        }
        // Only the new bytes are searched: a long answer costs one pass.
        if let Some(end) = chunk[..n].iter().position(|&b| b == b'\n') {
            buf.extend_from_slice(&chunk[..end]);
            return Ok(buf);
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > limit {
            return Err(AskError::TooLarge { limit });
        }
    }
}

/// A connected stream to `path`, without waiting: a full backlog (an agent
/// that does not accept) is as good as no agent.
fn connect(path: &Path) -> Result<UnixStream, AskError> {
    let shown = || path.display().to_string();
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(AskError::NoAgent(shown()));
        }
        Err(e) => return Err(e.into()),
    };
    if !meta.file_type().is_socket() || meta.uid() != 0 {
        return Err(AskError::NotTrusted(shown()));
    }
    let fd: OwnedFd = socket::socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )
    .map_err(std::io::Error::from)?;
    let addr = UnixAddr::new(path).map_err(std::io::Error::from)?;
    match socket::connect(fd.as_raw_fd(), &addr) {
        Ok(()) => {}
        Err(Errno::ECONNREFUSED | Errno::ENOENT | Errno::EAGAIN) => {
            return Err(AskError::NoAgent(shown()));
        }
        Err(e) => return Err(std::io::Error::from(e).into()),
    }
    let peer =
        socket::getsockopt(&fd.as_fd(), sockopt::PeerCredentials).map_err(std::io::Error::from)?;
    if peer.uid() != 0 {
        return Err(AskError::PeerNotRoot(peer.uid()));
    }
    let stream = UnixStream::from(fd);
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// Writes all of `bytes` by `deadline`.
fn write_all(
    stream: &mut UnixStream,
    bytes: &[u8],
    deadline: Instant,
    budget: Duration,
) -> Result<(), AskError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(AskError::TimedOut(budget));
    }
    stream.set_write_timeout(Some(left))?;
    stream.write_all(bytes).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => AskError::TimedOut(budget),
        _ => e.into(),
    })
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader};
    use std::os::unix::net::UnixListener;
    use std::path::PathBuf;

    use super::*;
    use crate::{Body, MAX_REQUEST, Source};

    const BUDGET: Duration = Duration::from_millis(500);

    fn request() -> Request {
        Request {
            v: VERSION,
            namespace: "shop".into(),
            name: "web-1".into(),
            uid: None,
            budget_ms: 500,
        }
    }

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("lookup-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// An agent that reads one question and writes `answer` (raw bytes)
    /// after `delay`.
    fn agent(tag: &str, answer: Vec<u8>, delay: Duration) -> PathBuf {
        let path = dir(tag).join(crate::SOCKET);
        let listener = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            if let Ok((s, _)) = listener.accept() {
                let mut r = BufReader::new(&s);
                let mut line = String::new();
                let _ = r.read_line(&mut line);
                let q = Request::decode(line.trim_end().as_bytes()).unwrap();
                assert_eq!(q, request());
                std::thread::sleep(delay);
                let _ = (&s).write_all(&answer);
            }
        });
        path
    }

    #[test]
    fn a_well_formed_answer_is_used() {
        let body = Body::Pod {
            pod: serde_json::json!({"metadata": {"name": "web-1"}}),
            namespace: None,
            service: None,
            source: Source::Watch,
        };
        let path = agent("ok", Answer::new(body.clone()).encode(), Duration::ZERO);
        let a = ask(&path, &request(), BUDGET).unwrap();
        assert_eq!(a.body, body);
    }

    #[test]
    fn what_cannot_be_used_is_an_error_never_a_hang() {
        let missing = dir("missing").join(crate::SOCKET);
        assert!(matches!(
            ask(&missing, &request(), BUDGET),
            Err(AskError::NoAgent(_))
        ));

        let file = dir("file").join(crate::SOCKET);
        std::fs::write(&file, "").unwrap();
        assert!(matches!(
            ask(&file, &request(), BUDGET),
            Err(AskError::NotTrusted(_))
        ));

        // Bound, but nobody accepts: refused.
        let stale = dir("stale").join(crate::SOCKET);
        drop(UnixListener::bind(&stale).unwrap());
        assert!(matches!(
            ask(&stale, &request(), BUDGET),
            Err(AskError::NoAgent(_))
        ));

        let garbage = agent("garbage", b"<html>\n".to_vec(), Duration::ZERO);
        assert!(matches!(
            ask(&garbage, &request(), BUDGET),
            Err(AskError::Malformed(_))
        ));

        let newer = agent(
            "newer",
            br#"{"v":2,"answer":"not_found","message":"x"}
"#
            .to_vec(),
            Duration::ZERO,
        );
        assert!(matches!(
            ask(&newer, &request(), BUDGET),
            Err(AskError::Version(2))
        ));

        let huge = agent("huge", vec![b' '; MAX_ANSWER + 10], Duration::ZERO);
        assert!(matches!(
            ask(&huge, &request(), BUDGET),
            Err(AskError::TooLarge { .. })
        ));

        let slow = agent("slow", b"{}\n".to_vec(), Duration::from_secs(3));
        let started = Instant::now();
        assert!(matches!(
            ask(&slow, &request(), BUDGET),
            Err(AskError::TimedOut(_))
        ));
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn requests_are_checked() {
        let mut r = request();
        assert_eq!(
            Request::decode(&r.encode()[..r.encode().len() - 1]).unwrap(),
            r
        );
        r.v = 2;
        let line = r.encode();
        assert!(matches!(
            Request::decode(&line[..line.len() - 1]),
            Err(AskError::Version(2))
        ));
        assert!(matches!(
            Request::decode(br#"{"v":1,"namespace":"","name":"x","budget_ms":1}"#),
            Err(AskError::Malformed(_))
        ));
        assert!(matches!(
            Request::decode(&vec![b'x'; MAX_REQUEST + 1]),
            Err(AskError::TooLarge { .. })
        ));
    }
}
