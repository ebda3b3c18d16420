//! A unary gRPC client over HTTP/2 on a Unix socket: what the kubelet's CRI
//! client does, reduced to the calls the tests make.
//!
//! One multi-threaded tokio runtime per client drives the HTTP/2 connection;
//! callers stay synchronous (`call` blocks, with a deadline), so test
//! threads can call concurrently through one connection, as the kubelet's
//! goroutines do.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::{Buf, Bytes};
use tokio::net::UnixStream;
use tokio::runtime::Runtime;

/// A failed call.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GrpcError {
    /// The server answered with a non-OK `grpc-status`: `message` is its
    /// `grpc-message`, decoded; for CRI that carries the runtime's error,
    /// e.g. the CNI plugin's.
    #[error("gRPC status {code}: {message}")]
    Status { code: u32, message: String },
    /// No answer within the deadline.
    #[error("no answer from {method} within {timeout:?}")]
    Timeout { method: String, timeout: Duration },
    /// The connection or the HTTP/2 exchange failed.
    #[error("{what}: {detail}")]
    Transport { what: String, detail: String },
}

fn transport(what: impl Into<String>, e: impl std::fmt::Display) -> GrpcError {
    GrpcError::Transport {
        what: what.into(),
        detail: e.to_string(),
    }
}

/// A connected client.
pub struct Client {
    rt: Runtime,
    send: h2::client::SendRequest<Bytes>,
    socket: PathBuf,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("socket", &self.socket)
            .finish()
    }
}

impl Client {
    /// Connects to the gRPC server on the Unix socket `socket`.
    pub fn connect(socket: &Path) -> Result<Client, GrpcError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| transport("cannot start the tokio runtime", e))?;
        let send = rt.block_on(async {
            let stream = tokio::time::timeout(Duration::from_secs(5), UnixStream::connect(socket))
                .await
                .map_err(|_| transport(format!("connecting to {}", socket.display()), "timeout"))?
                .map_err(|e| transport(format!("connecting to {}", socket.display()), e))?;
            let (send, conn) = h2::client::handshake(stream)
                .await
                .map_err(|e| transport("HTTP/2 handshake", e))?;
            // The connection's I/O runs on the runtime until the client and
            // every request handle are gone.
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok::<_, GrpcError>(send)
        })?;
        Ok(Client {
            rt,
            send,
            socket: socket.to_path_buf(),
        })
    }

    /// A unary call of `method` (`/package.Service/Method`) with the
    /// encoded request message; returns the encoded response message.
    pub fn call(
        &self,
        method: &str,
        request: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, GrpcError> {
        let send = self.send.clone();
        let fut = unary(send, method.to_string(), request, timeout);
        self.rt
            .block_on(async { tokio::time::timeout(timeout, fut).await })
            .unwrap_or_else(|_| {
                Err(GrpcError::Timeout {
                    method: method.to_string(),
                    timeout,
                })
            })
    }
}

async fn unary(
    send: h2::client::SendRequest<Bytes>,
    method: String,
    request: Vec<u8>,
    timeout: Duration,
) -> Result<Vec<u8>, GrpcError> {
    let mut send = send
        .ready()
        .await
        .map_err(|e| transport("HTTP/2 stream", e))?;
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("http://localhost{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", format!("{}m", timeout.as_millis()))
        .body(())
        .map_err(|e| transport("building the request", e))?;
    let (response, mut body) = send
        .send_request(req, false)
        .map_err(|e| transport(format!("sending {method}"), e))?;
    // Length-prefixed message: not compressed, 4-byte big-endian length.
    let len = u32::try_from(request.len()).map_err(|e| transport("request size", e))?;
    let mut framed = Vec::with_capacity(5 + request.len());
    framed.push(0);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(&request);
    body.send_data(Bytes::from(framed), true)
        .map_err(|e| transport(format!("sending {method}"), e))?;

    let response = response
        .await
        .map_err(|e| transport(format!("{method} response"), e))?;
    let (head, mut recv) = response.into_parts();
    // A "trailers-only" answer (an error) has the status in the headers.
    if let Some(err) = status_error(&head.headers) {
        return Err(err);
    }
    if head.status != http::StatusCode::OK {
        return Err(transport(
            method.clone(),
            format!("HTTP status {}", head.status),
        ));
    }
    let mut data = Vec::new();
    while let Some(chunk) = recv.data().await {
        let chunk = chunk.map_err(|e| transport(format!("{method} body"), e))?;
        let n = chunk.len();
        data.extend_from_slice(chunk.chunk());
        // Keep the peer's window open for large answers.
        let _ = recv.flow_control().release_capacity(n);
    }
    let trailers = recv
        .trailers()
        .await
        .map_err(|e| transport(format!("{method} trailers"), e))?
        .unwrap_or_default();
    if let Some(err) = status_error(&trailers) {
        return Err(err);
    }
    if trailers.get("grpc-status").is_none() {
        return Err(transport(method.clone(), "no grpc-status in the answer"));
    }
    match data.as_slice() {
        [0, l0, l1, l2, l3, rest @ ..] => {
            let len = u32::from_be_bytes([*l0, *l1, *l2, *l3]) as usize;
            rest.get(..len)
                .map(<[u8]>::to_vec)
                .ok_or_else(|| transport(method.clone(), "truncated message"))
        }
        _ => Err(transport(
            method.clone(),
            "no (uncompressed) message in the answer",
        )),
    }
}

/// The error a non-zero `grpc-status` stands for.
fn status_error(headers: &http::HeaderMap) -> Option<GrpcError> {
    let code: u32 = headers
        .get("grpc-status")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    if code == 0 {
        return None;
    }
    let message = headers
        .get("grpc-message")
        .map(|m| percent_decode(m.as_bytes()))
        .unwrap_or_default();
    Some(GrpcError::Status { code, message })
}

/// gRPC percent-encodes `grpc-message` (RFC 3986 style, `%XX`).
fn percent_decode(b: &[u8]) -> String {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::percent_decode;

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode(b"a%20b%3A%zz%"), "a b:%zz%");
    }
}
