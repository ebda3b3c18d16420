//! A minimal NETLINK_NETFILTER client for nf_tables: message and attribute
//! encoding, a socket whose every send and receive is bounded in time,
//! dumps, and transaction batches with their acknowledgements.
//!
//! Only what programming one table needs is here; the nf_tables message
//! types and attribute numbers are the kernel's uapi
//! (`linux/netfilter/nf_tables.h`, `linux/netfilter/nfnetlink.h`).

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{
    self, AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType, setsockopt, sockopt,
};
use nix::sys::time::TimeVal;

use super::NftError;

pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_DUMP_INTR: u16 = 0x10;
pub const NLM_F_EXCL: u16 = 0x200;
pub const NLM_F_CREATE: u16 = 0x400;
pub const NLM_F_APPEND: u16 = 0x800;
pub const NLM_F_DUMP: u16 = 0x300;

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 16;
const NFNL_MSG_BATCH_END: u16 = 17;
const NFNL_BATCH_GENID: u16 = 1;

pub const NFT_MSG_NEWTABLE: u16 = 0;
pub const NFT_MSG_NEWCHAIN: u16 = 3;
pub const NFT_MSG_GETCHAIN: u16 = 4;
pub const NFT_MSG_NEWRULE: u16 = 6;
pub const NFT_MSG_GETRULE: u16 = 7;
pub const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_GETGEN: u16 = 16;
const NFTA_GEN_ID: u16 = 1;

/// The largest datagram read: dumps come in skbs of at most 32 KiB.
const RECV_BUF: usize = 64 << 10;

/// Netlink messages being built into one buffer (a request or a batch).
#[derive(Debug)]
pub struct Writer {
    buf: Vec<u8>,
    msg_start: usize,
    seq: u32,
}

impl Default for Writer {
    /// Room for a whole batch or rule from the start: a buffer grown
    /// attribute by attribute showed in every ADD's instruction count.
    fn default() -> Writer {
        Writer {
            buf: Vec::with_capacity(4096),
            msg_start: 0,
            seq: 0,
        }
    }
}

impl Writer {
    /// Starts an nf_tables message (`nfgenmsg` header for `family`);
    /// returns its sequence number.
    pub fn begin(&mut self, msg: u16, flags: u16, family: u8) -> u32 {
        self.begin_raw((NFNL_SUBSYS_NFTABLES << 8) | msg, flags, family, 0)
    }

    fn begin_raw(&mut self, ty: u16, flags: u16, family: u8, res_id: u16) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.msg_start = self.buf.len();
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&self.seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        // nfgenmsg: family, version 0, res_id (big-endian).
        self.buf.push(family);
        self.buf.push(0);
        self.buf.extend_from_slice(&res_id.to_be_bytes());
        self.seq
    }

    /// Closes the message begun last.
    pub fn end(&mut self) {
        let len = (self.buf.len() - self.msg_start) as u32;
        self.buf[self.msg_start..self.msg_start + 4].copy_from_slice(&len.to_ne_bytes());
    }

    /// The batch header: what follows is one transaction, refused whole
    /// when the ruleset's generation is no longer `genid`.
    pub fn batch_begin(&mut self, genid: u32) {
        self.begin_raw(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, 0, NFNL_SUBSYS_NFTABLES);
        self.put_u32(NFNL_BATCH_GENID, genid);
        self.end();
    }

    pub fn batch_end(&mut self) {
        self.begin_raw(NFNL_MSG_BATCH_END, NLM_F_REQUEST, 0, NFNL_SUBSYS_NFTABLES);
        self.end();
    }

    /// One attribute holding `parts` back to back, written in place: a
    /// string and its NUL need no joined copy (every rule names several
    /// expressions, and an ADD encodes every rule).
    pub fn put(&mut self, ty: u16, parts: &[&[u8]]) {
        let len = 4 + parts.iter().map(|p| p.len()).sum::<usize>();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        for p in parts {
            self.buf.extend_from_slice(p);
        }
        self.buf.resize(self.buf.len().next_multiple_of(4), 0);
    }

    /// A big-endian u32, as nf_tables takes its numbers.
    pub fn put_u32(&mut self, ty: u16, v: u32) {
        self.put(ty, &[&v.to_be_bytes()]);
    }

    pub fn put_u64(&mut self, ty: u16, v: u64) {
        self.put(ty, &[&v.to_be_bytes()]);
    }

    /// A nested attribute whose content is already encoded.
    pub fn put_nested(&mut self, ty: u16, encoded: &[u8]) {
        self.put(ty | NLA_F_NESTED, &[encoded]);
    }

    /// A NUL-terminated string.
    pub fn put_str(&mut self, ty: u16, s: &str) {
        self.put(ty, &[s.as_bytes(), &[0]]);
    }

    /// Opens a nested attribute; close it with [`Writer::nest_end`].
    pub fn nest(&mut self, ty: u16) -> usize {
        let at = self.buf.len();
        self.put(ty | NLA_F_NESTED, &[]);
        at
    }

    pub fn nest_end(&mut self, at: usize) {
        let len = (self.buf.len() - at) as u16;
        self.buf[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

/// One attribute as read: its type (flags masked off), whether it is
/// flagged as nested, and its payload.
#[derive(Debug, Clone, Copy)]
pub struct Attr<'a> {
    pub ty: u16,
    pub nest: bool,
    pub data: &'a [u8],
}

impl<'a> Attr<'a> {
    pub fn nested(&self) -> Attrs<'a> {
        Attrs(self.data)
    }
}

/// The attributes of a payload, in order. Stops at the first malformed one.
#[derive(Debug, Clone, Copy)]
pub struct Attrs<'a>(pub &'a [u8]);

impl<'a> Iterator for Attrs<'a> {
    type Item = Attr<'a>;

    fn next(&mut self) -> Option<Attr<'a>> {
        let b = self.0;
        if b.len() < 4 {
            return None;
        }
        let len = usize::from(u16::from_ne_bytes([b[0], b[1]]));
        let ty = u16::from_ne_bytes([b[2], b[3]]);
        if len < 4 || len > b.len() {
            self.0 = &[];
            return None;
        }
        let data = &b[4..len];
        let next = len.next_multiple_of(4).min(b.len());
        self.0 = &b[next..];
        Some(Attr {
            ty: ty & NLA_TYPE_MASK,
            nest: ty & NLA_F_NESTED != 0,
            data,
        })
    }
}

impl<'a> Attrs<'a> {
    pub fn find(self, ty: u16) -> Option<Attr<'a>> {
        Iterator::find(&mut self.clone(), |a: &Attr<'a>| a.ty == ty)
    }

    /// Attribute `ty`, a big-endian u32 (as nf_tables gives its numbers).
    pub fn u32(self, ty: u16) -> Option<u32> {
        Some(u32::from_be_bytes(
            self.find(ty)?.data.get(..4)?.try_into().ok()?,
        ))
    }

    pub fn u64(self, ty: u16) -> Option<u64> {
        Some(u64::from_be_bytes(
            self.find(ty)?.data.get(..8)?.try_into().ok()?,
        ))
    }

    /// Attribute `ty`, a NUL-terminated string (the NUL and anything after
    /// it dropped).
    pub fn str(self, ty: u16) -> Option<&'a str> {
        let data = self.find(ty)?.data;
        let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
        std::str::from_utf8(&data[..end]).ok()
    }
}

/// One received message: netlink header fields and what follows the
/// header.
#[derive(Debug, Clone)]
pub struct Message {
    ty: u16,
    flags: u16,
    seq: u32,
    body: Vec<u8>,
}

impl Message {
    /// The nf_tables message type (`NFT_MSG_*`).
    pub fn nft_type(&self) -> u16 {
        self.ty & 0xff
    }

    /// The attributes after the nfgenmsg header.
    pub fn attrs(&self) -> Attrs<'_> {
        Attrs(self.body.get(4..).unwrap_or_default())
    }
}

/// A NETLINK_NETFILTER socket in the calling thread's network namespace.
pub struct Socket {
    fd: OwnedFd,
    seq: u32,
    timeout: Duration,
    deadline: Option<Instant>,
    buf: Vec<u8>,
    /// Messages received but not yet asked for.
    queued: VecDeque<Message>,
}

impl Socket {
    /// Opens the socket; no operation on it takes longer than `timeout`
    /// nor ends after `deadline`.
    pub fn open(timeout: Duration, deadline: Option<Instant>) -> Result<Socket, NftError> {
        let fd = socket::socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkNetFilter,
        )
        .map_err(NftError::Socket)?;
        // Any start will do on a fresh socket; the pid makes a trace
        // readable.
        let seq = std::process::id().wrapping_mul(1 << 12);
        Ok(Socket {
            fd,
            seq,
            timeout,
            deadline,
            buf: vec![0; RECV_BUF],
            queued: VecDeque::new(),
        })
    }

    pub fn writer(&self) -> Writer {
        Writer {
            seq: self.seq,
            ..Writer::default()
        }
    }

    /// The time left for the next step, never zero (a zero timeval would
    /// mean "block forever").
    fn arm(&self, what: &'static str) -> Result<(), NftError> {
        let left = crate::iptables::bounded(self.timeout, self.deadline);
        if left.is_zero() {
            return Err(NftError::TimedOut { what });
        }
        let tv = TimeVal::new(left.as_secs() as _, left.subsec_micros().max(1) as _);
        let io = |errno| NftError::Io { what, errno };
        setsockopt(&self.fd, sockopt::ReceiveTimeout, &tv).map_err(io)?;
        setsockopt(&self.fd, sockopt::SendTimeout, &tv).map_err(io)?;
        Ok(())
    }

    fn send(&mut self, w: &Writer, what: &'static str) -> Result<(), NftError> {
        self.seq = w.seq;
        // What is still queued answered an earlier request.
        self.queued.clear();
        self.arm(what)?;
        let fd = self.fd.as_raw_fd();
        let sent = uninterrupted(what, || socket::send(fd, &w.buf, MsgFlags::empty()))?;
        if sent != w.buf.len() {
            return Err(NftError::Malformed { what });
        }
        Ok(())
    }

    /// The next message received, reading a datagram (with `flags`) when
    /// none is queued.
    fn next(&mut self, what: &'static str, flags: MsgFlags) -> Result<Message, NftError> {
        loop {
            if let Some(m) = self.queued.pop_front() {
                return Ok(m);
            }
            self.recv(what, flags)?;
        }
    }

    /// Reads one datagram and queues its messages.
    fn recv(&mut self, what: &'static str, flags: MsgFlags) -> Result<(), NftError> {
        self.arm(what)?;
        let fd = self.fd.as_raw_fd();
        let n = uninterrupted(what, || {
            socket::recv(fd, &mut self.buf, MsgFlags::MSG_TRUNC | flags)
        })?;
        if n > self.buf.len() {
            return Err(NftError::Malformed { what });
        }
        let mut b = &self.buf[..n];
        while b.len() >= 16 {
            let len = u32::from_ne_bytes(b[0..4].try_into().unwrap_or_default()) as usize;
            if len < 16 || len > b.len() {
                return Err(NftError::Malformed { what });
            }
            let ty = u16::from_ne_bytes([b[4], b[5]]);
            let flags = u16::from_ne_bytes([b[6], b[7]]);
            let seq = u32::from_ne_bytes(b[8..12].try_into().unwrap_or_default());
            self.queued.push_back(Message {
                ty,
                flags,
                seq,
                body: b[16..len].to_vec(),
            });
            b = &b[len.next_multiple_of(4).min(b.len())..];
        }
        Ok(())
    }

    /// Sends request `msg` and reads its answer: with `NLM_F_DUMP` in
    /// `flags`, every message up to NLMSG_DONE, else the one message
    /// answering it. Answers to other requests are dropped: a fresh socket
    /// has no other request outstanding. Errs with [`NftError::Changed`]
    /// when the kernel flags a dump as interrupted by a concurrent change.
    pub fn request(
        &mut self,
        msg: u16,
        flags: u16,
        family: u8,
        attrs: impl FnOnce(&mut Writer),
        what: &'static str,
    ) -> Result<Vec<Message>, NftError> {
        let mut w = self.writer();
        let seq = w.begin(msg, NLM_F_REQUEST | flags, family);
        attrs(&mut w);
        w.end();
        self.send(&w, what)?;
        let mut out = Vec::new();
        let mut interrupted = false;
        loop {
            let m = self.next(what, MsgFlags::empty())?;
            if m.seq != seq {
                continue;
            }
            interrupted |= m.flags & NLM_F_DUMP_INTR != 0;
            match m.ty {
                NLMSG_DONE if interrupted => return Err(NftError::Changed),
                NLMSG_DONE => return Ok(out),
                NLMSG_ERROR => {
                    return match error_of(&m.body, what)? {
                        Some(e) => Err(e),
                        None => Ok(out),
                    };
                }
                _ => out.push(m),
            }
            if flags & NLM_F_DUMP == 0 {
                return Ok(out);
            }
        }
    }

    /// The ruleset's generation: a batch sent with it is refused if
    /// anything changed since.
    pub fn generation(&mut self) -> Result<u32, NftError> {
        let what = "generation query";
        let got = self.request(NFT_MSG_GETGEN, 0, 0, |_| {}, what)?;
        (got.first().and_then(|m| m.attrs().u32(NFTA_GEN_ID))).ok_or(NftError::Malformed { what })
    }

    /// Sends a batch (begun with [`Writer::batch_begin`], every command
    /// flagged `NLM_F_ACK`) and waits for each command's answer. The
    /// kernel applies all or nothing; [`NftError::Changed`] means the
    /// generation moved and nothing was applied. A refusal of no command
    /// (the batch header's) is the batch's, named `what`.
    pub fn commit(
        &mut self,
        w: &Writer,
        commands: &[(u32, String)],
        what: &'static str,
    ) -> Result<(), NftError> {
        self.send(w, what)?;
        let mut pending: Vec<u32> = commands.iter().map(|(s, _)| *s).collect();
        let mut first_error = None;
        while !pending.is_empty() {
            // The kernel handles a batch within the send, so once it has
            // refused a command, whatever else it answers is already
            // queued: read that without waiting.
            let flags = if first_error.is_some() {
                MsgFlags::MSG_DONTWAIT
            } else {
                MsgFlags::empty()
            };
            let m = match self.next(what, flags) {
                Ok(m) => m,
                Err(NftError::TimedOut { .. }) if first_error.is_some() => break,
                Err(e) => return Err(e),
            };
            if m.ty != NLMSG_ERROR {
                continue;
            }
            let err = error_of(&m.body, what)?;
            pending.retain(|&p| p != m.seq);
            match (err, &first_error) {
                // Only the header is refused so: for the generation.
                (
                    Some(NftError::Refused {
                        errno: Errno::ERESTART,
                        ..
                    }),
                    _,
                ) => {
                    return Err(NftError::Changed);
                }
                (Some(NftError::Refused { errno, .. }), None) => {
                    let cmd = commands.iter().find(|(c, _)| *c == m.seq);
                    first_error = Some(NftError::Refused {
                        what: cmd.map_or(what, |(_, d)| d.as_str()).to_string(),
                        errno,
                    });
                }
                _ => {}
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// `call` (a send or a receive) again while interrupted; EAGAIN is the
/// timeout [`Socket::arm`] set running out.
fn uninterrupted(
    what: &'static str,
    mut call: impl FnMut() -> nix::Result<usize>,
) -> Result<usize, NftError> {
    loop {
        match call() {
            Err(Errno::EINTR) => {}
            Err(Errno::EAGAIN) => return Err(NftError::TimedOut { what }),
            Err(errno) => return Err(NftError::Io { what, errno }),
            Ok(n) => return Ok(n),
        }
    }
}

/// The error an NLMSG_ERROR carries; None for an acknowledgement.
fn error_of(body: &[u8], what: &'static str) -> Result<Option<NftError>, NftError> {
    let code = body
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .map(i32::from_ne_bytes)
        .ok_or(NftError::Malformed { what })?;
    Ok((code != 0).then(|| NftError::Refused {
        what: what.to_string(),
        errno: Errno::from_raw(-code),
    }))
}
