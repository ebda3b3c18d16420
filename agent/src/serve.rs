//! The installer's `/metrics` endpoint: a small HTTP/1.1 server on a
//! thread of its own, std sockets and `poll`, no async runtime.
//!
//! It serves one page to a scraper, so it holds itself to that: the whole
//! request head within [`HEADER_TIMEOUT`] of the connection, no connection
//! silent for [`IDLE_TIMEOUT`] (reading or writing), at most
//! [`MAX_CONNECTIONS`] at once (more are closed on accept), a head of at
//! most [`MAX_HEAD`] bytes, no request body, one response per connection.
//! The page is rendered on request; nothing here touches the node.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
pub const MAX_CONNECTIONS: usize = 16;
pub const MAX_HEAD: usize = 8 * 1024;

/// The page, rendered for each request.
pub type Render = Box<dyn Fn() -> String + Send>;

/// Binds `addr` and serves `/metrics` from `render` on a new thread, for
/// the life of the process.
pub fn start(addr: SocketAddr, render: Render) -> io::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let local = listener.local_addr()?;
    let handle = std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || serve(&listener, &render))?;
    Ok((local, handle))
}

struct Conn {
    stream: TcpStream,
    head: Vec<u8>,
    /// The response, once the head is complete, and how much is sent.
    out: Option<(Vec<u8>, usize)>,
    /// Response sent, write side shut: what the client still sends is read
    /// and dropped until it closes (closing with unread bytes would reset
    /// the connection and could destroy the response before it is read).
    draining: bool,
    accepted: Instant,
    progress: Instant,
}

impl Conn {
    /// When it is closed if nothing happens.
    fn deadline(&self) -> Instant {
        let idle = self.progress + IDLE_TIMEOUT;
        match self.out {
            None => idle.min(self.accepted + HEADER_TIMEOUT),
            Some(_) => idle,
        }
    }
}

/// Whether the connection stays open.
enum Step {
    Open,
    Close,
}

fn serve(listener: &TcpListener, render: &Render) {
    let mut conns: Vec<Conn> = Vec::new();
    loop {
        let now = Instant::now();
        conns.retain(|c| c.deadline() > now);
        let timeout = conns
            .iter()
            .map(|c| c.deadline().saturating_duration_since(now))
            .min()
            .map_or(PollTimeout::NONE, |d| {
                // Round up: waking a little late is fine, spinning is not.
                PollTimeout::try_from(d + Duration::from_millis(1)).unwrap_or(PollTimeout::MAX)
            });
        let (accept_ready, ready) = {
            let mut fds = Vec::with_capacity(conns.len() + 1);
            fds.push(PollFd::new(listener.as_fd(), PollFlags::POLLIN));
            for c in &conns {
                let want = if c.out.is_some() && !c.draining {
                    PollFlags::POLLOUT
                } else {
                    PollFlags::POLLIN
                };
                fds.push(PollFd::new(c.stream.as_fd(), want));
            }
            match poll(&mut fds, timeout) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => {
                    tracing::warn!("metrics: poll failed: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            let ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
            let accept_ready = ready(&fds[0]);
            let conns_ready: Vec<bool> = fds[1..].iter().map(ready).collect();
            (accept_ready, conns_ready)
        };
        let mut i = 0;
        conns.retain_mut(|c| {
            let r = ready[i];
            i += 1;
            !r || matches!(step(c, render), Step::Open)
        });
        if accept_ready {
            accept(listener, &mut conns);
        }
    }
}

fn accept(listener: &TcpListener, conns: &mut Vec<Conn>) {
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                // Over the cap: closed at once rather than left waiting.
                if conns.len() >= MAX_CONNECTIONS || stream.set_nonblocking(true).is_err() {
                    continue;
                }
                let now = Instant::now();
                conns.push(Conn {
                    stream,
                    head: Vec::new(),
                    out: None,
                    draining: false,
                    accepted: now,
                    progress: now,
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                // EMFILE and the like: the connection stays in the backlog;
                // a pause keeps this from spinning.
                tracing::warn!("metrics: cannot accept a connection: {e}");
                std::thread::sleep(Duration::from_millis(100));
                return;
            }
        }
    }
}

/// Reads or writes what the connection is ready for.
fn step(c: &mut Conn, render: &Render) -> Step {
    if c.draining {
        let mut buf = [0u8; 2048];
        return match c.stream.read(&mut buf) {
            Ok(0) => Step::Close,
            Ok(_) => Step::Open,
            Err(e) if retry(&e) => Step::Open,
            Err(_) => Step::Close,
        };
    }
    if let Some((out, sent)) = &mut c.out {
        return match c.stream.write(&out[*sent..]) {
            Ok(0) => Step::Close,
            Ok(n) => {
                *sent += n;
                c.progress = Instant::now();
                if *sent == out.len() {
                    let _ = c.stream.shutdown(Shutdown::Write);
                    c.draining = true;
                    Step::Open
                } else {
                    Step::Open
                }
            }
            Err(e) if retry(&e) => Step::Open,
            Err(_) => Step::Close,
        };
    }
    let mut buf = [0u8; 2048];
    match c.stream.read(&mut buf) {
        Ok(0) => Step::Close,
        Ok(n) => {
            c.progress = Instant::now();
            c.head.extend_from_slice(&buf[..n]);
            match find(&c.head, b"\r\n\r\n") {
                Some(end) if end + 4 <= MAX_HEAD => {
                    c.out = Some((respond(&c.head[..end], render), 0));
                }
                _ if c.head.len() > MAX_HEAD => {
                    c.out = Some((response("431 Request Header Fields Too Large", ""), 0));
                }
                _ => {}
            }
            Step::Open
        }
        Err(e) if retry(&e) => Step::Open,
        Err(_) => Step::Close,
    }
}

fn retry(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The response to a request head.
fn respond(head: &[u8], render: &Render) -> Vec<u8> {
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (method, target) = (parts.next().unwrap_or_default(), parts.next());
    let path = target.map(|t| t.split(|&b| b == b'?').next().unwrap_or_default());
    match (method, path) {
        (b"GET" | b"HEAD", Some(b"/metrics")) => {
            let body = render();
            let mut r = response("200 OK", &body);
            if method == b"HEAD" {
                r.truncate(r.len() - body.len());
            }
            r
        }
        (b"GET" | b"HEAD", Some(_)) => response("404 Not Found", "only /metrics is served\n"),
        (_, Some(_)) => response("405 Method Not Allowed", ""),
        (_, None) => response("400 Bad Request", ""),
    }
}

fn response(status: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> SocketAddr {
        let (addr, _) = start(
            "127.0.0.1:0".parse().unwrap(),
            Box::new(|| "linkerd_cni_passes_total 3\n".to_string()),
        )
        .unwrap();
        addr
    }

    fn get(addr: SocketAddr, request: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_metrics_and_nothing_else() {
        let addr = server();
        let r = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(r.contains("Content-Length: 27\r\n"), "{r}");
        assert!(r.ends_with("\r\n\r\nlinkerd_cni_passes_total 3\n"), "{r}");
        let r = get(addr, "HEAD /metrics HTTP/1.1\r\n\r\n");
        assert!(
            r.starts_with("HTTP/1.1 200 OK") && r.ends_with("\r\n\r\n"),
            "{r}"
        );
        let r = get(addr, "GET /metrics?x=1 HTTP/1.0\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 200 OK"), "{r}");
        assert!(get(addr, "GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(get(addr, "POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        let big = format!(
            "GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n",
            "a".repeat(MAX_HEAD)
        );
        assert!(get(addr, &big).starts_with("HTTP/1.1 431"));
    }

    /// Connections past the cap are closed at once; the server answers
    /// again once the others are gone.
    #[test]
    fn connections_past_the_cap_are_closed() {
        let addr = server();
        let held: Vec<TcpStream> = (0..MAX_CONNECTIONS)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        // Accepted in order: once the last is answered, all are in (the
        // answered one stays until its client closes).
        assert!(request(&held[MAX_CONNECTIONS - 1]).starts_with("HTTP/1.1 200"));
        let over = TcpStream::connect(addr).unwrap();
        over.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        assert_eq!(request(&over), "", "a connection over the cap was served");
        drop(held);
        // Once the server has seen those closes (a connection racing them
        // is still over the cap, by design), it serves again.
        assert!(testkit::wait_until(Duration::from_secs(10), || {
            request(&TcpStream::connect(addr).unwrap()).starts_with("HTTP/1.1 200")
        }));
    }

    /// One GET on `s`; what comes back until the server closes (nothing
    /// when it closed without answering).
    fn request(mut s: &TcpStream) -> String {
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    /// A client that sends nothing, or half a head, is closed after the
    /// header timeout; others are served meanwhile.
    #[test]
    fn a_silent_or_slow_client_is_closed_after_the_header_timeout() {
        let addr = server();
        let mut silent = TcpStream::connect(addr).unwrap();
        let mut slow = TcpStream::connect(addr).unwrap();
        slow.write_all(b"GET /metrics HTTP/1.1\r\nX: ").unwrap();
        let start = Instant::now();
        let other = TcpStream::connect(addr).unwrap();
        assert!(request(&other).starts_with("HTTP/1.1 200"));
        for s in [&mut silent, &mut slow] {
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            assert_eq!(out, "");
        }
        let took = start.elapsed();
        // Bounded, with room for a loaded machine: not a speed measurement.
        assert!(
            took >= HEADER_TIMEOUT - Duration::from_millis(100),
            "{took:?}"
        );
        assert!(took < HEADER_TIMEOUT + Duration::from_secs(20), "{took:?}");
    }
}
