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

/// One expression of a rule: its name and its `NFTA_EXPR_DATA`
/// attributes, in libnftnl's order. Rules are built from these and dumped
/// rules compared with them, so the one description serves both ways.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expr {
    pub name: &'static str,
    pub data: Vec<Field>,
}

/// An attribute of an expression: a payload, or attributes nested in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    Bytes(u16, Vec<u8>),
    Nest(u16, Vec<Field>),
}

/// A big-endian u32, as nf_tables takes its numbers.
fn u32_field(ty: u16, v: u32) -> Field {
    Field::Bytes(ty, v.to_be_bytes().to_vec())
}

/// A NUL-terminated string.
fn str_field(ty: u16, s: &str) -> Field {
    let mut b = s.as_bytes().to_vec();
    b.push(0);
    Field::Bytes(ty, b)
}

/// `struct nft_data` holding a value.
fn value(ty: u16, v: Vec<u8>) -> Field {
    Field::Nest(ty, vec![Field::Bytes(NFTA_DATA_VALUE, v)])
}

/// A rule as nf_tables takes it: its expressions and the protocol the
/// xtables extensions see (`NFTA_RULE_COMPAT`; what `-p` says).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftRule {
    pub exprs: Vec<Expr>,
    pub compat_proto: u32,
}

/// A comment that does not fit the comment match (iptables refuses it too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommentTooLong(pub String);

/// An xtables match or target (`kind`) through nft_compat.
fn xt(kind: &'static str, name: &str, rev: u32, info: Vec<u8>) -> Expr {
    Expr {
        name: kind,
        data: vec![str_field(1, name), u32_field(2, rev), Field::Bytes(3, info)],
    }
}

fn comment(text: &str) -> Result<Expr, CommentTooLong> {
    let c = format!("proxy-init/{text}");
    if c.len() >= COMMENT_LEN {
        return Err(CommentTooLong(c));
    }
    let mut info = c.into_bytes();
    info.resize(COMMENT_LEN, 0);
    Ok(xt("match", "comment", 0, info))
}

fn meta(key: u32) -> Expr {
    Expr {
        name: "meta",
        data: vec![u32_field(2, key), u32_field(1, NFT_REG_1)],
    }
}

fn tcp() -> [Expr; 2] {
    [meta(NFT_META_L4PROTO), cmp(vec![IPPROTO_TCP])]
}

fn cmp(data: Vec<u8>) -> Expr {
    Expr {
        name: "cmp",
        data: vec![
            u32_field(1, NFT_REG_1),
            u32_field(2, NFT_CMP_EQ),
            value(3, data),
        ],
    }
}

/// A load of `len` bytes at `offset` of header `base` into register 1.
fn payload(base: u32, offset: u32, len: u32) -> Expr {
    Expr {
        name: "payload",
        data: vec![
            u32_field(1, NFT_REG_1),
            u32_field(2, base),
            u32_field(3, offset),
            u32_field(4, len),
        ],
    }
}

/// Its values are the kernel's: a dumped rule's are zeroed before it is
/// compared (see `zero_counters`).
fn counter() -> Expr {
    Expr {
        name: "counter",
        data: vec![Field::Bytes(1, vec![0; 8]), Field::Bytes(2, vec![0; 8])],
    }
}

/// `immediate` into the verdict register.
fn verdict(code: i32, chain: Option<&str>) -> Expr {
    let mut v = vec![u32_field(NFTA_VERDICT_CODE, code as u32)];
    v.extend(chain.map(|c| str_field(NFTA_VERDICT_CHAIN, c)));
    Expr {
        name: "immediate",
        data: vec![
            u32_field(1, NFT_REG_VERDICT),
            Field::Nest(2, vec![Field::Nest(NFTA_DATA_VERDICT, v)]),
        ],
    }
}

/// `--dports`: `struct xt_multiport_v1`, ports in host order.
fn multiport(ports: &[PortRange]) -> Expr {
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
    xt("match", "multiport", 1, info)
}

/// `--uid-owner` / `--gid-owner`: `struct xt_owner_match_info`, padded to
/// 8 bytes as xtables aligns it.
fn owner(id: u32, what: u8) -> Expr {
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
    xt("match", "owner", 1, info)
}

/// `-j REDIRECT --to-ports`: IPv4's `nf_nat_ipv4_multi_range_compat`,
/// IPv6's `nf_nat_range` (revision 0 of each family's target).
fn redirect(family: Family, port: u16) -> Expr {
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
    xt("target", "REDIRECT", 0, info)
}

/// `-s net/prefix`, as iptables-nft matches it: nothing for /0; a load
/// and compare of the whole bytes for a byte-aligned prefix; otherwise the
/// whole address, masked.
fn source(s: &Subnet) -> Vec<Expr> {
    let (addr, offset): (Vec<u8>, u32) = match s.network {
        IpAddr::V4(a) => (a.octets().to_vec(), 12),
        IpAddr::V6(a) => (a.octets().to_vec(), 8),
    };
    let prefix = usize::from(s.prefix);
    if prefix == 0 {
        return vec![];
    }
    let load = |len: usize| payload(NFT_PAYLOAD_NETWORK_HEADER, offset, len as u32);
    if prefix.is_multiple_of(8) {
        let len = prefix / 8;
        return vec![load(len), cmp(addr[..len].to_vec())];
    }
    let mut mask = vec![0u8; addr.len()];
    for (i, m) in mask.iter_mut().enumerate() {
        let bits = prefix.saturating_sub(i * 8).min(8);
        *m = (0xff00u16 >> bits) as u8;
    }
    vec![
        load(addr.len()),
        Expr {
            name: "bitwise",
            data: vec![
                u32_field(1, NFT_REG_1),
                u32_field(2, NFT_REG_1),
                u32_field(3, addr.len() as u32),
                value(4, mask),
                value(5, vec![0; addr.len()]),
            ],
        },
        cmp(addr),
    ]
}

/// The nf_tables form of one of our chain rules.
pub fn rule(r: &Rule, family: Family) -> Result<NftRule, CommentTooLong> {
    let mut e: Vec<Expr> = Vec::new();
    let mut proto = 0;
    match r {
        Rule::IgnorePorts(ports) => {
            proto = IPPROTO_TCP;
            e.extend(tcp());
            e.push(multiport(ports));
        }
        Rule::IgnoreSubnet(s) => e.extend(source(s)),
        Rule::RedirectPort { port, .. } => {
            proto = IPPROTO_TCP;
            e.extend(tcp());
            e.push(payload(NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2));
            e.push(cmp(port.to_be_bytes().to_vec()));
        }
        Rule::RedirectAllIncoming { .. } | Rule::RedirectAllOutgoing { .. } => {
            proto = IPPROTO_TCP;
            e.extend(tcp());
        }
        // The rule model only holds ids in 1..=u32::MAX-1.
        Rule::IgnoreUid(id) => e.push(owner(u32::try_from(*id).unwrap_or(u32::MAX), XT_OWNER_UID)),
        Rule::IgnoreGid(id) => e.push(owner(u32::try_from(*id).unwrap_or(u32::MAX), XT_OWNER_GID)),
        Rule::IgnoreLoopback => {
            e.push(meta(NFT_META_OIFNAME));
            // The name and its NUL: an exact match, no `+` wildcard.
            e.push(cmp(b"lo\0".to_vec()));
        }
    }
    e.push(comment(&r.comment())?);
    e.push(counter());
    e.push(match r {
        Rule::RedirectPort { to, .. }
        | Rule::RedirectAllIncoming { to }
        | Rule::RedirectAllOutgoing { to } => redirect(family, *to),
        _ => verdict(NFT_RETURN, None),
    });
    Ok(NftRule {
        exprs: e,
        compat_proto: u32::from(proto),
    })
}

/// The nf_tables form of a jump into one of our chains.
pub fn jump(j: &Jump) -> Result<NftRule, CommentTooLong> {
    Ok(NftRule {
        exprs: vec![
            comment(j.comment)?,
            counter(),
            verdict(NFT_JUMP, Some(j.to)),
        ],
        compat_proto: 0,
    })
}

/// Writes `exprs` as `NFTA_RULE_EXPRESSIONS`' elements.
pub fn encode(w: &mut Writer, exprs: &[Expr]) {
    for e in exprs {
        let elem = w.nest(NFTA_LIST_ELEM);
        w.put_str(NFTA_EXPR_NAME, e.name);
        let data = w.nest(NFTA_EXPR_DATA);
        put_fields(w, &e.data);
        w.nest_end(data);
        w.nest_end(elem);
    }
}

fn put_fields(w: &mut Writer, fields: &[Field]) {
    for f in fields {
        match f {
            Field::Bytes(ty, v) => w.put(*ty, v),
            Field::Nest(ty, inner) => {
                let n = w.nest(*ty);
                put_fields(w, inner);
                w.nest_end(n);
            }
        }
    }
}

/// Whether a dumped `NFTA_RULE_EXPRESSIONS` list is `exprs`: as many
/// expressions, in order, each of the same name and holding every
/// attribute of ours with the same bytes. What the kernel dumps beyond
/// those (e.g. bitwise's operation, which defaults to mask-and-xor) is
/// never set by a rule that has them all.
pub fn matches(exprs: &[Expr], list: Attrs<'_>) -> bool {
    let mut dumped = list.filter(|a| a.ty == NFTA_LIST_ELEM);
    let same = exprs.iter().all(|e| {
        dumped.next().is_some_and(|elem| {
            let a = elem.nested();
            a.find(NFTA_EXPR_NAME).and_then(|n| n.str()) == Some(e.name)
                && a.find(NFTA_EXPR_DATA)
                    .is_some_and(|d| fields_match(&e.data, d.nested()))
        })
    });
    same && dumped.next().is_none()
}

fn fields_match(ours: &[Field], dumped: Attrs<'_>) -> bool {
    ours.iter().all(|f| match f {
        Field::Bytes(ty, v) => dumped.find(*ty).is_some_and(|a| a.data == v.as_slice()),
        Field::Nest(ty, inner) => dumped
            .find(*ty)
            .is_some_and(|a| fields_match(inner, a.nested())),
    })
}

/// The text of a dumped rule's comment match, if it has one.
pub fn comment_of(list: Attrs<'_>) -> Option<String> {
    list.filter(|a| a.ty == NFTA_LIST_ELEM).find_map(|elem| {
        let a = elem.nested();
        let d = a.find(NFTA_EXPR_DATA)?.nested();
        if a.find(NFTA_EXPR_NAME)?.str()? != "match" || d.find(1)?.str()? != "comment" {
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

    fn info_of(e: &Expr) -> &[u8] {
        match &e.data[2] {
            Field::Bytes(3, info) => info,
            _ => panic!("{e:?} has no info"),
        }
    }

    #[test]
    fn every_rule_encodes_and_decodes_to_itself() {
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
            let all: Vec<NftRule> = set
                .redirect
                .iter()
                .chain(&set.output)
                .map(|r| rule(r, family).unwrap())
                .collect();
            for (i, n) in all.iter().enumerate() {
                let mut w = Writer::new(0);
                let at = w.nest(4);
                encode(&mut w, &n.exprs);
                w.nest_end(at);
                let list = Attrs(w.bytes()).next().unwrap().nested();
                assert!(matches(&n.exprs, list), "{n:?}");
                // And no other rule of the set reads as this one.
                for (j, other) in all.iter().enumerate() {
                    assert_eq!(matches(&other.exprs, list), i == j, "{n:?} vs {other:?}");
                }
                assert!(comment_of(list).unwrap().starts_with("proxy-init/"));
            }
        }
    }

    #[test]
    fn xt_infos_have_the_kernel_sizes() {
        let ports = rules::parse_port_list("4191,1-2").unwrap();
        let m = multiport(&ports);
        let info = info_of(&m);
        assert_eq!(info.len(), 48);
        assert_eq!(&info[..2], &[1, 3]);
        assert_eq!(&info[2..8], &[0x5f, 0x10, 1, 0, 2, 0][..]);
        assert_eq!(&info[32..35], &[0, 1, 0]);
        assert_eq!(info_of(&owner(2102, XT_OWNER_UID)).len(), 24);
        assert_eq!(info_of(&redirect(Family::V4, 4143)).len(), 24);
        assert_eq!(info_of(&redirect(Family::V6, 4143)).len(), 40);
        assert_eq!(info_of(&comment("x").unwrap()).len(), COMMENT_LEN);
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
                let mut w = Writer::new(0);
                encode(&mut w, &n.exprs);
                let mut b = w.bytes().to_vec();
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
        let s = |t: &str| source(&Subnet::parse(t).unwrap());
        assert!(s("0.0.0.0/0").is_empty());
        assert_eq!(s("10.0.0.0/8").len(), 2);
        assert_eq!(s("10.0.0.0/8")[1], cmp(vec![10]));
        let masked = s("172.16.0.0/12");
        assert_eq!(masked.len(), 3);
        assert_eq!(masked[1].name, "bitwise");
        assert_eq!(
            masked[1].data[3],
            value(4, vec![0xff, 0xf0, 0, 0]),
            "{masked:?}"
        );
        assert_eq!(
            s("fd00::1/128")[0],
            payload(NFT_PAYLOAD_NETWORK_HEADER, 8, 16)
        );
    }
}
