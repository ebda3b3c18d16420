//! linkerd's rules as nf_tables expressions, exactly as `iptables-nft`
//! (1.8) builds them from the same rule text: native `meta`/`payload`/
//! `cmp`/`bitwise` for `-p`, `-o`, `-s` and `--dport`; xtables extensions
//! through nft_compat (`match multiport` rev 1, `owner` rev 1, `comment`
//! rev 0; `target REDIRECT` rev 0) with their binary info; a `counter`
//! before the verdict; and the rule's compat protocol. `iptables-nft`
//! decodes such rules back into the same text, so `iptables-nft-save`,
//! `-D` and `-F` treat them as its own.
//!
//! A dumped rule is compared with the same model, attribute by attribute,
//! so that "is this rule ours" needs no decoder (counter values aside).

use std::net::IpAddr;

use super::NftError;
use super::netlink::{Attrs, Writer};
use crate::iptables::rules::{Family, Jump, PortRange, Rule, Subnet};

const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;

const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
const NFT_CMP_EQ: u32 = 0;
const NFT_META_OIFNAME: u32 = 7;
const NFT_META_L4PROTO: u32 = 16;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
pub const NFT_JUMP: i32 = -3;
pub const NFT_RETURN: i32 = -5;

const IPPROTO_TCP: u8 = 6;
/// `XT_MAX_COMMENT_LEN`: the comment match's buffer, NUL included.
pub const COMMENT_LEN: usize = 256;
const XT_MULTIPORT_DESTINATION: u8 = 1;
const XT_OWNER_UID: u8 = 1;
const XT_OWNER_GID: u8 = 2;
const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 2;

/// A rule as nf_tables takes it: its `NFTA_RULE_EXPRESSIONS` elements,
/// encoded as iptables-nft (libnftnl) does, and the protocol the xtables
/// extensions see (`NFTA_RULE_COMPAT`; what `-p` says).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftRule {
    pub exprs: Vec<u8>,
    pub compat_proto: u32,
}

/// Appends expression `name`, whose attributes `data` writes.
fn expr(w: &mut Writer, name: &str, data: impl FnOnce(&mut Writer)) {
    let elem = w.nest(NFTA_LIST_ELEM);
    w.put_str(NFTA_EXPR_NAME, name);
    let d = w.nest(NFTA_EXPR_DATA);
    data(w);
    w.nest_end(d);
    w.nest_end(elem);
}

/// `struct nft_data` holding a value.
fn put_value(w: &mut Writer, ty: u16, v: &[u8]) {
    let n = w.nest(ty);
    w.put(NFTA_DATA_VALUE, &[v]);
    w.nest_end(n);
}

/// An xtables match or target (`kind`) through nft_compat.
fn xt(w: &mut Writer, kind: &str, name: &str, rev: u32, info: &[u8]) {
    expr(w, kind, |w| {
        w.put_str(1, name);
        w.put_u32(2, rev);
        w.put(3, &[info]);
    });
}

/// The comment match's info; a comment that does not fit it is refused
/// (as iptables refuses it).
fn comment(text: &str) -> Result<Vec<u8>, NftError> {
    let c = format!("proxy-init/{text}");
    if c.len() >= COMMENT_LEN {
        return Err(NftError::Comment(c));
    }
    let mut info = c.into_bytes();
    info.resize(COMMENT_LEN, 0);
    Ok(info)
}

fn meta(w: &mut Writer, key: u32) {
    expr(w, "meta", |w| {
        w.put_u32(2, key);
        w.put_u32(1, NFT_REG_1);
    });
}

fn cmp(w: &mut Writer, data: &[u8]) {
    expr(w, "cmp", |w| {
        w.put_u32(1, NFT_REG_1);
        w.put_u32(2, NFT_CMP_EQ);
        put_value(w, 3, data);
    });
}

/// A load of `len` bytes at `offset` of header `base` into register 1.
fn payload(w: &mut Writer, base: u32, offset: u32, len: u32) {
    expr(w, "payload", |w| {
        w.put_u32(1, NFT_REG_1);
        w.put_u32(2, base);
        w.put_u32(3, offset);
        w.put_u32(4, len);
    });
}

/// Its values are the kernel's: a dumped rule's are zeroed before it is
/// compared (see `zero_counters`).
fn counter(w: &mut Writer) {
    expr(w, "counter", |w| {
        w.put_u64(1, 0);
        w.put_u64(2, 0);
    });
}

/// `immediate` into the verdict register.
fn verdict(w: &mut Writer, code: i32, chain: Option<&str>) {
    expr(w, "immediate", |w| {
        w.put_u32(1, NFT_REG_VERDICT);
        let d = w.nest(2);
        let v = w.nest(NFTA_DATA_VERDICT);
        w.put_u32(NFTA_VERDICT_CODE, code as u32);
        if let Some(c) = chain {
            w.put_str(NFTA_VERDICT_CHAIN, c);
        }
        w.nest_end(v);
        w.nest_end(d);
    });
}

/// `--dports`: `struct xt_multiport_v1`, ports in host order.
fn multiport(ports: &[PortRange]) -> Vec<u8> {
    let mut list = Vec::new();
    let mut pflags = Vec::new();
    for p in ports {
        list.push(p.low);
        pflags.push(u8::from(p.low != p.high));
        if p.low != p.high {
            list.push(p.high);
            pflags.push(0);
        }
    }
    // flags, count, ports[15], pflags[15], invert.
    let mut info = vec![XT_MULTIPORT_DESTINATION, list.len() as u8];
    for i in 0..15 {
        info.extend_from_slice(&list.get(i).copied().unwrap_or(0).to_ne_bytes());
    }
    for i in 0..15 {
        info.push(pflags.get(i).copied().unwrap_or(0));
    }
    info.push(0);
    info
}

/// `--uid-owner` / `--gid-owner`: `struct xt_owner_match_info`, padded to
/// 8 bytes as xtables aligns it.
fn owner(id: u32, what: u8) -> Vec<u8> {
    let (uid, gid) = if what == XT_OWNER_UID {
        (id, 0)
    } else {
        (0, id)
    };
    let mut info = Vec::with_capacity(24);
    for v in [uid, uid, gid, gid] {
        info.extend_from_slice(&v.to_ne_bytes());
    }
    info.extend_from_slice(&[what, 0]);
    info.resize(24, 0);
    info
}

/// `-j REDIRECT --to-ports`: IPv4's `nf_nat_ipv4_multi_range_compat`,
/// IPv6's `nf_nat_range` (revision 0 of each family's target).
fn redirect(family: Family, port: u16) -> Vec<u8> {
    let p = port.to_be_bytes();
    let mut info = Vec::with_capacity(40);
    match family {
        Family::V4 => {
            info.extend_from_slice(&1u32.to_ne_bytes());
            info.extend_from_slice(&NF_NAT_RANGE_PROTO_SPECIFIED.to_ne_bytes());
            info.extend_from_slice(&[0; 8]);
            info.extend_from_slice(&p);
            info.extend_from_slice(&p);
            info.resize(24, 0);
        }
        Family::V6 => {
            info.extend_from_slice(&NF_NAT_RANGE_PROTO_SPECIFIED.to_ne_bytes());
            info.extend_from_slice(&[0; 32]);
            info.extend_from_slice(&p);
            info.extend_from_slice(&p);
        }
    }
    info
}

/// `-s net/prefix`, as iptables-nft matches it: nothing for /0; a load
/// and compare of the whole bytes for a byte-aligned prefix; otherwise the
/// whole address, masked.
fn source(w: &mut Writer, s: &Subnet) {
    let (addr, offset): (Vec<u8>, u32) = match s.network {
        IpAddr::V4(a) => (a.octets().to_vec(), 12),
        IpAddr::V6(a) => (a.octets().to_vec(), 8),
    };
    let prefix = usize::from(s.prefix);
    if prefix == 0 {
        return;
    }
    if prefix.is_multiple_of(8) {
        let len = prefix / 8;
        payload(w, NFT_PAYLOAD_NETWORK_HEADER, offset, len as u32);
        return cmp(w, &addr[..len]);
    }
    let mut mask = vec![0u8; addr.len()];
    for (i, m) in mask.iter_mut().enumerate() {
        let bits = prefix.saturating_sub(i * 8).min(8);
        *m = (0xff00u16 >> bits) as u8;
    }
    let len = addr.len() as u32;
    payload(w, NFT_PAYLOAD_NETWORK_HEADER, offset, len);
    expr(w, "bitwise", |w| {
        w.put_u32(1, NFT_REG_1);
        w.put_u32(2, NFT_REG_1);
        w.put_u32(3, len);
        put_value(w, 4, &mask);
        put_value(w, 5, &vec![0; addr.len()]);
    });
    cmp(w, &addr);
}

/// The nf_tables form of one of our chain rules.
pub fn rule(r: &Rule, family: Family) -> Result<NftRule, NftError> {
    let w = &mut Writer::default();
    // `-p tcp`: matched natively, and the protocol the extensions see.
    let tcp = !matches!(
        r,
        Rule::IgnoreSubnet(_) | Rule::IgnoreUid(_) | Rule::IgnoreGid(_) | Rule::IgnoreLoopback
    );
    if tcp {
        meta(w, NFT_META_L4PROTO);
        cmp(w, &[IPPROTO_TCP]);
    }
    match r {
        Rule::IgnorePorts(ports) => xt(w, "match", "multiport", 1, &multiport(ports)),
        Rule::IgnoreSubnet(s) => source(w, s),
        Rule::RedirectPort { port, .. } => {
            payload(w, NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2);
            cmp(w, &port.to_be_bytes());
        }
        Rule::RedirectAllIncoming { .. } | Rule::RedirectAllOutgoing { .. } => {}
        // The rule model only holds ids in 1..=u32::MAX-1.
        Rule::IgnoreUid(id) => {
            let info = owner(u32::try_from(*id).unwrap_or(u32::MAX), XT_OWNER_UID);
            xt(w, "match", "owner", 1, &info);
        }
        Rule::IgnoreGid(id) => {
            let info = owner(u32::try_from(*id).unwrap_or(u32::MAX), XT_OWNER_GID);
            xt(w, "match", "owner", 1, &info);
        }
        Rule::IgnoreLoopback => {
            meta(w, NFT_META_OIFNAME);
            // The name and its NUL: an exact match, no `+` wildcard.
            cmp(w, b"lo\0");
        }
    }
    xt(w, "match", "comment", 0, &comment(&r.comment())?);
    counter(w);
    match r {
        Rule::RedirectPort { to, .. }
        | Rule::RedirectAllIncoming { to }
        | Rule::RedirectAllOutgoing { to } => {
            xt(w, "target", "REDIRECT", 0, &redirect(family, *to));
        }
        _ => verdict(w, NFT_RETURN, None),
    }
    Ok(NftRule {
        exprs: std::mem::take(w).into_bytes(),
        compat_proto: if tcp { IPPROTO_TCP.into() } else { 0 },
    })
}

/// The nf_tables form of a jump into one of our chains.
pub fn jump(j: &Jump) -> Result<NftRule, NftError> {
    let w = &mut Writer::default();
    xt(w, "match", "comment", 0, &comment(j.comment)?);
    counter(w);
    verdict(w, NFT_JUMP, Some(j.to));
    Ok(NftRule {
        exprs: std::mem::take(w).into_bytes(),
        compat_proto: 0,
    })
}

/// Whether a dumped `NFTA_RULE_EXPRESSIONS` list is `ours`: as many
/// expressions, in order, each holding every attribute of ours with the
/// same bytes, and the same inside the attributes we nest (which we flag
/// as nested; the kernel's dump does not). What the kernel dumps beyond
/// ours (e.g. bitwise's operation, whose default is our mask-and-xor) is
/// never set in a rule that has all of ours.
pub fn matches(ours: &[u8], mut dumped: Attrs<'_>) -> bool {
    let mut ours = Attrs(ours);
    loop {
        match (ours.next(), dumped.next()) {
            (None, None) => return true,
            (Some(o), Some(d)) if o.ty == d.ty && covers(o.nested(), d.nested()) => {}
            _ => return false,
        }
    }
}

fn covers(mut ours: Attrs<'_>, dumped: Attrs<'_>) -> bool {
    ours.all(|o| {
        dumped.find(o.ty).is_some_and(|d| {
            if o.nest {
                covers(o.nested(), d.nested())
            } else {
                o.data == d.data
            }
        })
    })
}

/// The expressions of a dumped list: each one's name and data.
pub fn exprs<'a>(list: Attrs<'a>) -> impl Iterator<Item = (&'a str, Attrs<'a>)> {
    list.filter(|a| a.ty == NFTA_LIST_ELEM).filter_map(|elem| {
        let a = elem.nested();
        Some((a.str(NFTA_EXPR_NAME)?, a.find(NFTA_EXPR_DATA)?.nested()))
    })
}

/// The text of a dumped rule's comment match, if it has one.
pub fn comment_of(list: Attrs<'_>) -> Option<String> {
    exprs(list).find_map(|(name, d)| {
        if name != "match" || d.str(1)? != "comment" {
            return None;
        }
        let info = d.find(3)?.data;
        let end = info.iter().position(|&b| b == 0).unwrap_or(info.len());
        Some(String::from_utf8_lossy(&info[..end]).into_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iptables::rules::{self, RedirectSpec, RuleSet};

    fn encoded(f: impl FnOnce(&mut Writer)) -> Vec<u8> {
        let mut w = Writer::default();
        f(&mut w);
        w.into_bytes()
    }

    /// `list` as the kernel dumps it: nested attributes not flagged so.
    fn unflagged(list: &[u8]) -> Vec<u8> {
        let mut out = list.to_vec();
        let base = list.as_ptr() as usize;
        fn walk(a: Attrs<'_>, base: usize, out: &mut [u8]) {
            for at in a {
                if at.nest {
                    let i = at.data.as_ptr() as usize - base - 2;
                    let ty = u16::from_ne_bytes([out[i], out[i + 1]]) & 0x7fff;
                    out[i..i + 2].copy_from_slice(&ty.to_ne_bytes());
                    walk(at.nested(), base, out);
                }
            }
        }
        walk(Attrs(list), base, &mut out);
        out
    }

    #[test]
    fn every_rule_read_back_matches_itself_only() {
        let spec = RedirectSpec {
            proxy_gid: 2103,
            ports_to_redirect: vec![8080],
            outbound_ports_to_ignore: rules::parse_port_list("25,1000-2000").unwrap(),
            subnets_to_ignore: rules::parse_subnet_list(
                "10.0.0.0/8,172.16.0.0/12,0.0.0.0/0,fd00::/13,fd00:1::/64",
            )
            .unwrap(),
            ..RedirectSpec::default()
        };
        for family in [Family::V4, Family::V6] {
            let set = RuleSet::build(&spec, family);
            let mut all: Vec<NftRule> = set
                .redirect
                .iter()
                .chain(&set.output)
                .map(|r| rule(r, family).unwrap())
                .collect();
            all.extend(rules::JUMPS.iter().map(|j| jump(j).unwrap()));
            for (i, n) in all.iter().enumerate() {
                let dumped = unflagged(&n.exprs);
                assert_ne!(dumped, n.exprs);
                // And no other rule of the set reads as this one.
                for (j, other) in all.iter().enumerate() {
                    let same = matches(&other.exprs, Attrs(&dumped));
                    assert_eq!(same, i == j, "{n:?} vs {other:?}");
                }
                let c = comment_of(Attrs(&dumped)).unwrap();
                assert!(c.starts_with("proxy-init/"), "{c}");
            }
        }
    }

    #[test]
    fn xt_infos_have_the_kernel_sizes() {
        let ports = rules::parse_port_list("4191,1-2").unwrap();
        let info = multiport(&ports);
        assert_eq!(info.len(), 48);
        assert_eq!(&info[..2], &[1, 3]);
        assert_eq!(&info[2..8], &[0x5f, 0x10, 1, 0, 2, 0][..]);
        assert_eq!(&info[32..35], &[0, 1, 0]);
        assert_eq!(owner(2102, XT_OWNER_UID).len(), 24);
        assert_eq!(redirect(Family::V4, 4143).len(), 24);
        assert_eq!(redirect(Family::V6, 4143).len(), 40);
        assert_eq!(comment("x").unwrap().len(), COMMENT_LEN);
        assert!(comment(&"x".repeat(250)).is_err());
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Whatever a kernel (or anything posing as one) answers, reading
            /// it never panics; a valid list read back after a bit flip
            /// still does not.
            #[test]
            fn decoding_any_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
                let n = rule(&Rule::IgnoreLoopback, Family::V4).unwrap();
                let _ = matches(&n.exprs, Attrs(&bytes));
                let _ = comment_of(Attrs(&bytes));
                let _ = crate::iptables::nft::zero_counters(&bytes);
            }

            #[test]
            fn a_damaged_rule_never_panics(at in 0usize..600, bit in 0u8..8) {
                let n = rule(&Rule::RedirectPort { port: 8080, to: 4143 }, Family::V4).unwrap();
                let mut b = n.exprs.clone();
                let i = at % b.len();
                b[i] ^= 1 << bit;
                let _ = matches(&n.exprs, Attrs(&b));
                let _ = comment_of(Attrs(&b));
                let _ = crate::iptables::nft::zero_counters(&b);
            }
        }
    }

    #[test]
    fn prefixes_match_as_iptables_nft_does() {
        let s = |t: &str| encoded(|w| source(w, &Subnet::parse(t).unwrap()));
        let load = |w: &mut Writer, offset, len| {
            payload(w, NFT_PAYLOAD_NETWORK_HEADER, offset, len);
        };
        assert!(s("0.0.0.0/0").is_empty());
        let whole = encoded(|w| {
            load(w, 12, 1);
            cmp(w, &[10]);
        });
        assert_eq!(s("10.0.0.0/8"), whole);
        let masked = s("172.16.0.0/12");
        assert_eq!(Attrs(&masked).count(), 3);
        let bitwise = Attrs(&masked).nth(1).unwrap().nested();
        let mask = bitwise.find(NFTA_EXPR_DATA).unwrap().nested().find(4);
        assert_eq!(
            mask.unwrap().nested().find(NFTA_DATA_VALUE).unwrap().data,
            &[0xff, 0xf0, 0, 0]
        );
        let host = s("fd00::1/128");
        assert_eq!(Attrs(&host).count(), 2);
        assert!(host.starts_with(&encoded(|w| load(w, 8, 16))));
    }
}
