//! The plugin's side: one synchronous, bounded question.

use std::io::{self, BufRead, BufReader, Read, Write};
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
    let stream = connect(socket)?;
    let mut bounded = Bounded {
        stream: &stream,
        deadline,
    };
    let timed_out = |e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => AskError::TimedOut(budget),
        _ => e.into(),
    };
    bounded.write_all(&request.encode()).map_err(timed_out)?;
    // One byte past the bound tells a line too long from one that fits.
    let mut line = Vec::with_capacity(4096);
    BufReader::with_capacity(16 << 10, bounded)
        .take(MAX_ANSWER as u64 + 1)
        .read_until(b'\n', &mut line)
        .map_err(timed_out)?;
    if line.last() != Some(&b'\n') {
        return Err(if line.len() > MAX_ANSWER {
            AskError::TooLarge { limit: MAX_ANSWER }
        } else {
            AskError::Malformed("the connection closed before a whole answer".into())
        });
    }
    line.pop();
    let answer: Answer =
        serde_json::from_slice(&line).map_err(|e| AskError::Malformed(e.to_string()))?;
    if answer.v != VERSION {
        return Err(AskError::Version(answer.v));
    }
    Ok(answer)
}

/// The stream with a deadline: each read or write waits at most what is
/// left until it, so that no peer, however slowly it trickles, holds the
/// plugin past its budget.
struct Bounded<'a> {
    stream: &'a UnixStream,
    deadline: Instant,
}

impl Bounded<'_> {
    /// What is left until the deadline; a timeout once nothing is (std
    /// refuses a zero timeout).
    fn left(&self) -> io::Result<Duration> {
        match self.deadline.saturating_duration_since(Instant::now()) {
            Duration::ZERO => Err(io::ErrorKind::TimedOut.into()),
            left => Ok(left),
        }
    }
}

impl Read for Bounded<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.set_read_timeout(Some(self.left()?))?;
        self.stream.read(buf)
    }
}

impl Write for Bounded<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.set_write_timeout(Some(self.left()?))?;
        self.stream.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
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

    /// An agent that knows neither the namespace nor the Service may
    /// leave them out.
    #[test]
    fn an_answer_without_namespace_or_service_is_used() {
        let line = br#"{"v":1,"answer":"pod","pod":{},"source":"fetched"}
"#;
        let path = agent("bare", line.to_vec(), Duration::ZERO);
        let a = ask(&path, &request(), BUDGET).unwrap();
        let Body::Pod {
            namespace, service, ..
        } = a.body
        else {
            panic!("{:?}", a.body);
        };
        assert_eq!((namespace, service), (None, None));
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

    /// The bound is on the answer's line: one a byte past it is refused
    /// even when its newline comes right after; one at it is used.
    #[test]
    fn the_bound_is_exact() {
        let answer = |len: usize| {
            let mut line = Answer::new(Body::NotFound {
                message: "x".into(),
            })
            .encode();
            line.pop();
            line.resize(len, b' ');
            line.push(b'\n');
            line
        };
        let past = agent("past", answer(MAX_ANSWER + 1), Duration::ZERO);
        assert!(matches!(
            ask(&past, &request(), BUDGET),
            Err(AskError::TooLarge { .. })
        ));
        let at = agent("at", answer(MAX_ANSWER), Duration::ZERO);
        assert!(ask(&at, &request(), BUDGET).is_ok());
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
