//! linkerd's rules as nf_tables expressions, exactly as `iptables-nft`
//! (1.8) builds them from the same rule text: native `meta`/`payload`/
//! `cmp`/`bitwise` for `-p`, `-o`, `-s` and `--dport`; xtables extensions
//! through nft_compat (`match multiport` rev 1, `owner` rev 1, `comment`
//! rev 0; `target REDIRECT` rev 0) with their binary info; a `counter`
//! before the verdict; and the rule's compat protocol. `iptables-nft`
//! decodes such rules back into the same text, so `iptables-nft-save`,
//! `-D` and `-F` treat them as its own.
//!
//! The same model decodes a dumped rule, so that "is this rule ours" is
//! an equality of expression lists (counter values aside).

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
const NFT_BITWISE_MASK_XOR: u32 = 0;
pub const NFT_JUMP: i32 = -3;
pub const NFT_RETURN: i32 = -5;

const IPPROTO_TCP: u8 = 6;
/// `XT_MAX_COMMENT_LEN`: the comment match's buffer, NUL included.
pub const COMMENT_LEN: usize = 256;
const XT_MULTIPORT_DESTINATION: u8 = 1;
const XT_OWNER_UID: u8 = 1;
const XT_OWNER_GID: u8 = 2;
const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 2;

/// One expression of a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    Meta {
        key: u32,
        dreg: u32,
    },
    Cmp {
        sreg: u32,
        op: u32,
        data: Vec<u8>,
    },
    Payload {
        dreg: u32,
        base: u32,
        offset: u32,
        len: u32,
    },
    Bitwise {
        sreg: u32,
        dreg: u32,
        len: u32,
        mask: Vec<u8>,
        xor: Vec<u8>,
    },
    /// An xtables match through nft_compat.
    Match {
        name: String,
        rev: u32,
        info: Vec<u8>,
    },
    /// An xtables target through nft_compat.
    Target {
        name: String,
        rev: u32,
        info: Vec<u8>,
    },
    /// Its values are the kernel's, never compared.
    Counter,
    /// `immediate` into the verdict register.
    Verdict {
        code: i32,
        chain: Option<String>,
    },
    /// Anything else (by name): never one of ours.
    Other(String),
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

fn comment(text: &str) -> Result<Expr, CommentTooLong> {
    let c = format!("proxy-init/{text}");
    if c.len() >= COMMENT_LEN {
        return Err(CommentTooLong(c));
    }
    let mut info = c.into_bytes();
    info.resize(COMMENT_LEN, 0);
    Ok(Expr::Match {
        name: "comment".into(),
        rev: 0,
        info,
    })
}

fn tcp() -> [Expr; 2] {
    [
        Expr::Meta {
            key: NFT_META_L4PROTO,
            dreg: NFT_REG_1,
        },
        cmp(vec![IPPROTO_TCP]),
    ]
}

fn cmp(data: Vec<u8>) -> Expr {
    Expr::Cmp {
        sreg: NFT_REG_1,
        op: NFT_CMP_EQ,
        data,
    }
}

fn verdict(code: i32) -> Expr {
    Expr::Verdict { code, chain: None }
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
    Expr::Match {
        name: "multiport".into(),
        rev: 1,
        info,
    }
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
    Expr::Match {
        name: "owner".into(),
        rev: 1,
        info,
    }
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
    Expr::Target {
        name: "REDIRECT".into(),
        rev: 0,
        info,
    }
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
    let load = |len: usize| Expr::Payload {
        dreg: NFT_REG_1,
        base: NFT_PAYLOAD_NETWORK_HEADER,
        offset,
        len: len as u32,
    };
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
        Expr::Bitwise {
            sreg: NFT_REG_1,
            dreg: NFT_REG_1,
            len: addr.len() as u32,
            mask,
            xor: vec![0; addr.len()],
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
            e.push(Expr::Payload {
                dreg: NFT_REG_1,
                base: NFT_PAYLOAD_TRANSPORT_HEADER,
                offset: 2,
                len: 2,
            });
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
            e.push(Expr::Meta {
                key: NFT_META_OIFNAME,
                dreg: NFT_REG_1,
            });
            // The name and its NUL: an exact match, no `+` wildcard.
            e.push(cmp(b"lo\0".to_vec()));
        }
    }
    e.push(comment(&r.comment())?);
    e.push(Expr::Counter);
    e.push(match r {
        Rule::RedirectPort { to, .. }
        | Rule::RedirectAllIncoming { to }
        | Rule::RedirectAllOutgoing { to } => redirect(family, *to),
        _ => verdict(NFT_RETURN),
    });
    Ok(NftRule {
        exprs: e,
        compat_proto: u32::from(proto),
    })
}

/// The nf_tables form of a jump into one of our chains.
pub fn jump(j: &Jump) -> NftRule {
    NftRule {
        exprs: vec![
            // A constant of ours, well under the limit.
            comment(j.comment).unwrap_or(Expr::Other("comment".into())),
            Expr::Counter,
            Expr::Verdict {
                code: NFT_JUMP,
                chain: Some(j.to.to_string()),
            },
        ],
        compat_proto: 0,
    }
}

fn put_value(w: &mut Writer, ty: u16, v: &[u8]) {
    let n = w.nest(ty);
    w.put(NFTA_DATA_VALUE, v);
    w.nest_end(n);
}

/// Writes `exprs` as `NFTA_RULE_EXPRESSIONS`' elements, attribute by
/// attribute in libnftnl's order.
pub fn encode(w: &mut Writer, exprs: &[Expr]) {
    for e in exprs {
        let elem = w.nest(NFTA_LIST_ELEM);
        let name = match e {
            Expr::Meta { .. } => "meta",
            Expr::Cmp { .. } => "cmp",
            Expr::Payload { .. } => "payload",
            Expr::Bitwise { .. } => "bitwise",
            Expr::Match { .. } => "match",
            Expr::Target { .. } => "target",
            Expr::Counter => "counter",
            Expr::Verdict { .. } => "immediate",
            Expr::Other(n) => n.as_str(),
        };
        w.put_str(NFTA_EXPR_NAME, name);
        let data = w.nest(NFTA_EXPR_DATA);
        match e {
            Expr::Meta { key, dreg } => {
                w.put_u32(2, *key);
                w.put_u32(1, *dreg);
            }
            Expr::Cmp { sreg, op, data } => {
                w.put_u32(1, *sreg);
                w.put_u32(2, *op);
                put_value(w, 3, data);
            }
            Expr::Payload {
                dreg,
                base,
                offset,
                len,
            } => {
                w.put_u32(1, *dreg);
                w.put_u32(2, *base);
                w.put_u32(3, *offset);
                w.put_u32(4, *len);
            }
            Expr::Bitwise {
                sreg,
                dreg,
                len,
                mask,
                xor,
            } => {
                w.put_u32(1, *sreg);
                w.put_u32(2, *dreg);
                w.put_u32(3, *len);
                put_value(w, 4, mask);
                put_value(w, 5, xor);
            }
            Expr::Match { name, rev, info } | Expr::Target { name, rev, info } => {
                w.put_str(1, name);
                w.put_u32(2, *rev);
                w.put(3, info);
            }
            Expr::Counter => {
                w.put_u64(1, 0);
                w.put_u64(2, 0);
            }
            Expr::Verdict { code, chain } => {
                w.put_u32(1, NFT_REG_VERDICT);
                let d = w.nest(2);
                let v = w.nest(NFTA_DATA_VERDICT);
                w.put_u32(NFTA_VERDICT_CODE, *code as u32);
                if let Some(c) = chain {
                    w.put_str(NFTA_VERDICT_CHAIN, c);
                }
                w.nest_end(v);
                w.nest_end(d);
            }
            Expr::Other(_) => {}
        }
        w.nest_end(data);
        w.nest_end(elem);
    }
}

/// Reads `NFTA_RULE_EXPRESSIONS` as the kernel dumps it.
pub fn decode(list: Attrs<'_>) -> Vec<Expr> {
    list.filter(|a| a.ty == NFTA_LIST_ELEM)
        .map(|elem| {
            let name = elem
                .nested()
                .find(NFTA_EXPR_NAME)
                .and_then(|a| a.str())
                .unwrap_or_default()
                .to_string();
            let data = elem
                .nested()
                .find(NFTA_EXPR_DATA)
                .map(|a| a.nested())
                .unwrap_or(Attrs(&[]));
            decode_one(&name, data).unwrap_or(Expr::Other(name))
        })
        .collect()
}

fn decode_one(name: &str, d: Attrs<'_>) -> Option<Expr> {
    let u = |ty| d.find(ty).and_then(|a| a.u32());
    let value = |ty| {
        d.find(ty)
            .and_then(|a| a.nested().find(NFTA_DATA_VALUE))
            .map(|v| v.data.to_vec())
    };
    let bytes = |ty| d.find(ty).map(|a| a.data.to_vec());
    let text = |ty| d.find(ty).and_then(|a| a.str()).map(str::to_string);
    Some(match name {
        "meta" => Expr::Meta {
            key: u(2)?,
            dreg: u(1)?,
        },
        "cmp" => Expr::Cmp {
            sreg: u(1)?,
            op: u(2)?,
            data: value(3)?,
        },
        "payload" => {
            // A payload write (sreg) is not a load.
            if d.find(5).is_some() {
                return None;
            }
            Expr::Payload {
                dreg: u(1)?,
                base: u(2)?,
                offset: u(3)?,
                len: u(4)?,
            }
        }
        "bitwise" => {
            if u(6).is_some_and(|op| op != NFT_BITWISE_MASK_XOR) {
                return None;
            }
            Expr::Bitwise {
                sreg: u(1)?,
                dreg: u(2)?,
                len: u(3)?,
                mask: value(4)?,
                xor: value(5)?,
            }
        }
        "match" => Expr::Match {
            name: text(1)?,
            rev: u(2)?,
            info: bytes(3)?,
        },
        "target" => Expr::Target {
            name: text(1)?,
            rev: u(2)?,
            info: bytes(3)?,
        },
        "counter" => Expr::Counter,
        "immediate" => {
            if u(1)? != NFT_REG_VERDICT {
                return None;
            }
            let v = d.find(2)?.nested().find(NFTA_DATA_VERDICT)?.nested();
            Expr::Verdict {
                code: v.find(NFTA_VERDICT_CODE)?.u32()? as i32,
                chain: v
                    .find(NFTA_VERDICT_CHAIN)
                    .and_then(|a| a.str())
                    .map(str::to_string),
            }
        }
        _ => return None,
    })
}

/// The text of a rule's comment match, if it has one.
pub fn comment_of(exprs: &[Expr]) -> Option<String> {
    exprs.iter().find_map(|e| match e {
        Expr::Match { name, info, .. } if name == "comment" => {
            let end = info.iter().position(|&b| b == 0).unwrap_or(info.len());
            Some(String::from_utf8_lossy(&info[..end]).into_owned())
        }
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iptables::rules::{self, RedirectSpec, RuleSet};

    fn info_of(e: &Expr) -> &[u8] {
        match e {
            Expr::Match { info, .. } | Expr::Target { info, .. } => info,
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
            for r in set.redirect.iter().chain(&set.output) {
                let n = rule(r, family).unwrap();
                let mut w = Writer::new(0);
                let at = w.nest(4);
                encode(&mut w, &n.exprs);
                w.nest_end(at);
                let list = Attrs(w.bytes()).next().unwrap().nested();
                assert_eq!(decode(list), n.exprs, "{r:?}");
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
                let _ = decode(Attrs(&bytes));
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
                let _ = decode(Attrs(&b));
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
        assert!(
            matches!(&masked[1], Expr::Bitwise { mask, .. } if mask == &[0xff, 0xf0, 0, 0]),
            "{masked:?}"
        );
        assert!(matches!(
            &s("fd00::1/128")[0],
            Expr::Payload {
                len: 16,
                offset: 8,
                ..
            }
        ));
    }
}
