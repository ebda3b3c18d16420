//! The legacy (x_tables) nat table's size, read in-process with
//! `IPT_SO_GET_INFO`: when it holds only its built-in chains' policies,
//! `*-save` has nothing to tell and is not run.

use std::os::fd::AsRawFd;

use nix::libc;
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType};

use super::rules::Family;

/// `IPT_SO_GET_INFO` / `IP6T_SO_GET_INFO` (`IPT_BASE_CTL`).
const SO_GET_INFO: libc::c_int = 64;
const NF_INET_NUMHOOKS: usize = 5;

/// `struct ipt_getinfo` (the same layout as `ip6t_getinfo`).
#[derive(Default)]
#[repr(C)]
struct GetInfo {
    name: [u8; 32],
    valid_hooks: u32,
    hook_entry: [u32; NF_INET_NUMHOOKS],
    underflow: [u32; NF_INET_NUMHOOKS],
    num_entries: u32,
    size: u32,
}

/// Whether the legacy nat table of `family` holds no rule and no user
/// chain: one policy entry per hook plus the closing error entry. Errs
/// when the table cannot be read (e.g. not loaded): then ask `*-save`.
pub fn nat_is_empty(family: Family) -> std::io::Result<bool> {
    let (domain, level) = match family {
        Family::V4 => (AddressFamily::Inet, libc::SOL_IP),
        Family::V6 => (AddressFamily::Inet6, libc::SOL_IPV6),
    };
    // Any inet socket reaches x_tables' sockopts; a datagram one needs no
    // CAP_NET_RAW.
    let fd = socket::socket(domain, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None)?;
    let mut info = GetInfo::default();
    info.name[..3].copy_from_slice(b"nat");
    let mut len = std::mem::size_of::<GetInfo>() as libc::socklen_t;
    // SAFETY: `info` is a live, writable `ipt_getinfo` of `len` bytes, the
    // kernel writes at most `len` bytes into it and updates `len`.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            SO_GET_INFO,
            (&raw mut info).cast::<libc::c_void>(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(info.num_entries == info.valid_hooks.count_ones() + 1)
}
