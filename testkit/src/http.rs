//! The HTTP-over-TLS plumbing of the fake API server ([`crate::api`]): the
//! TLS server config for a throwaway certificate, the accept loop, one
//! request head (and body) read from a connection, an answer written to
//! it, and the API server's `Status` objects.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rustls::ServerConfig;
use serde_json::{Value, json};

use crate::pki::TestPki;

/// One TLS connection from a client.
pub(crate) type Tls = rustls::StreamOwned<rustls::ServerConnection, TcpStream>;

/// Locks `m`, also after another handler panicked holding it: a fake
/// server keeps serving the rest of the test.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A TLS server config presenting `pki`'s server certificate.
pub(crate) fn server_tls(pki: &TestPki) -> std::io::Result<Arc<ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_no_client_auth()
        .with_single_cert(vec![pki.server_cert.clone()], pki.server_key_der())
        .map_err(std::io::Error::other)?;
    Ok(Arc::new(tls))
}

/// Hands every accepted connection to `serve` until `stopped` is set (the
/// stopper then wakes the blocked accept).
pub(crate) fn accept_until(
    listener: TcpListener,
    stopped: &AtomicBool,
    mut serve: impl FnMut(TcpStream),
) {
    for conn in listener.incoming() {
        if stopped.load(Ordering::SeqCst) {
            break;
        }
        let Ok(tcp) = conn else { continue };
        serve(tcp);
    }
}

/// The server side of TLS on `tcp`, buffered for reading requests.
pub(crate) fn accept_tls(
    tcp: TcpStream,
    tls: Arc<ServerConfig>,
) -> std::io::Result<BufReader<Tls>> {
    // Bounds a handler whose client went away without closing.
    tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
    tcp.set_nodelay(true)?;
    let conn = rustls::ServerConnection::new(tls).map_err(std::io::Error::other)?;
    Ok(BufReader::new(rustls::StreamOwned::new(conn, tcp)))
}

/// One request as read from a connection.
pub(crate) struct Request {
    pub method: String,
    /// The target without its query.
    pub path: String,
    /// Decoded query parameters, in order.
    pub query: Vec<(String, String)>,
    pub authorization: Option<String>,
    pub content_type: String,
    pub body: Vec<u8>,
}

/// Reads one request (head and `Content-Length` body); None at a clean EOF.
pub(crate) fn read_request(r: &mut impl BufRead) -> std::io::Result<Option<Request>> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let target = parts.next().unwrap_or_default();
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_string(), parse_query(q)),
        None => (target.to_string(), vec![]),
    };
    let mut authorization = None;
    let mut content_type = String::new();
    let mut body_len = 0usize;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            let v = v.trim().to_string();
            match k.trim().to_ascii_lowercase().as_str() {
                "authorization" => authorization = Some(v),
                "content-type" => content_type = v,
                "content-length" => body_len = v.parse().unwrap_or(0),
                _ => {}
            }
        }
    }
    let mut body = vec![];
    r.take(body_len as u64).read_to_end(&mut body)?;
    Ok(Some(Request {
        method,
        path,
        query,
        authorization,
        content_type,
        body,
    }))
}

fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(p), String::new()),
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => match s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                Some(v) => {
                    out.push(v);
                    i += 2;
                }
                None => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Writes a `Content-Length` answer with the JSON `body`.
pub(crate) fn write_json(w: &mut Tls, status: u16, body: &Value) -> std::io::Result<()> {
    write_raw(w, status, "application/json", &body.to_string())
}

/// Writes a `Content-Length` answer with `body` as it is.
pub(crate) fn write_raw(
    w: &mut Tls,
    status: u16,
    content_type: &str,
    body: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
        reason(status),
        body.len()
    );
    // One write, so head and body go out in one TLS record and segment
    // (two small writes meet Nagle and delayed ACKs: 40 ms each).
    w.write_all(format!("{head}{body}").as_bytes())?;
    w.flush()
}

/// A `Status` object, as the API server returns with errors.
pub(crate) fn status_json(code: u16, message: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason(code), "code": code,
    })
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Gone",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        _ => "Unknown",
    }
}
