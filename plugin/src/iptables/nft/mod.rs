//! `iptables-mode: nft` without the node's binaries: linkerd's chains
//! programmed over netlink (NETLINK_NETFILTER, one nf_tables transaction
//! per family), in the calling thread's network namespace.
//!
//! What lands in the kernel is what `iptables-nft-restore --noflush` makes
//! of the batch [`super::table::restore_batch`] writes: table `nat` of
//! family ip/ip6, our chains created (or flushed when they exist) and
//! refilled, base chains PREROUTING/OUTPUT with iptables-nft's hooks and
//! priorities created when a jump needs them, and the jumps appended only
//! when absent. The decisions are taken on the same [`NatTable`] view the
//! restore path reads from `*-save`, so both paths agree by construction;
//! expressions are in [`expr`].
//!
//! The table is read and written under its generation id: a concurrent
//! change between the two makes the kernel refuse the batch whole, and
//! the read and write are redone.

pub mod expr;
pub mod netlink;

use std::time::{Duration, Instant};

use nix::errno::Errno;
use thiserror::Error;

use self::expr::NftRule;
use self::netlink::{
    Attrs, NFT_MSG_DELRULE, NFT_MSG_GETCHAIN, NFT_MSG_GETRULE, NFT_MSG_NEWCHAIN, NFT_MSG_NEWRULE,
    NFT_MSG_NEWTABLE, NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST,
    Socket, Writer,
};
use super::rules::{Family, JUMPS, OUTPUT_CHAIN, REDIRECT_CHAIN, RuleSet};
use super::table::{self, NatTable};

/// The table iptables-nft keeps `-t nat` in.
pub const TABLE: &str = "nat";

/// How often a read-and-commit is redone when the table keeps changing
/// under it (each is bounded by the deadline too).
const MAX_ATTEMPTS: usize = 8;

const NFTA_TABLE_NAME: u16 = 1;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_HANDLE: u16 = 3;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_RULE_COMPAT: u16 = 5;
const NFTA_RULE_COMPAT_PROTO: u16 = 1;
const NFTA_RULE_COMPAT_FLAGS: u16 = 2;
const NF_ACCEPT: u32 = 1;

#[derive(Debug, Error)]
pub enum NftError {
    #[error("cannot open a netfilter netlink socket: {0}")]
    Socket(Errno),
    #[error("netlink {what}: {errno}")]
    Io { what: &'static str, errno: Errno },
    #[error("netlink {what}: no answer in time")]
    TimedOut { what: &'static str },
    #[error("nf_tables refused {what}: {errno}")]
    Refused { what: String, errno: Errno },
    #[error("netlink {what}: malformed answer")]
    Malformed { what: &'static str },
    #[error("the nat table changed while it was being read or written")]
    Changed,
    #[error("comment {0:?} is longer than the comment match takes (255 bytes)")]
    Comment(String),
}

/// The nf_tables family of an address family.
fn nfproto(f: Family) -> u8 {
    match f {
        Family::V4 => 2,
        Family::V6 => 10,
    }
}

/// The hook and priority iptables-nft gives the nat base chain `name` a
/// jump of ours starts from (`NF_INET_PRE_ROUTING`/`NF_INET_LOCAL_OUT` at
/// `NF_IP_PRI_NAT_DST`); None for our own chains.
fn base_hook(name: &str) -> Option<(u32, i32)> {
    match name {
        "PREROUTING" => Some((0, -100)),
        "OUTPUT" => Some((3, -100)),
        _ => None,
    }
}

/// A chain of the table as the kernel lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainInfo {
    pub name: String,
    /// Base chains: hook number, priority, policy and type.
    pub hook: Option<(u32, i32, u32, String)>,
}

/// A rule of the table as the kernel dumps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleInfo {
    pub chain: String,
    pub handle: u64,
    /// `NFTA_RULE_EXPRESSIONS` byte for byte, counter values zeroed.
    pub raw: Vec<u8>,
}

/// The nat table of one family: its chains and rules in kernel order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    pub genid: u32,
    pub chains: Vec<ChainInfo>,
    pub rules: Vec<RuleInfo>,
}

impl Listing {
    /// No rule and no chain but base chains: what `*-save` would show as
    /// an empty table.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.chains.iter().all(|c| c.hook.is_some())
    }
}

/// `step` again while the nat table of `family` changes under it (a dump
/// interrupted, a batch refused for its generation).
fn retried<T>(
    family: Family,
    mut step: impl FnMut() -> Result<T, NftError>,
) -> Result<T, NftError> {
    for _ in 1..MAX_ATTEMPTS {
        match step() {
            Err(NftError::Changed) => {
                log::debug!("{family} nat table changed under us: reading it again");
            }
            r => return r,
        }
    }
    step()
}

/// Reads the nat table of `family`. Its existence needs no query of its
/// own: the batch creates it when absent, and without it the dumps are
/// empty.
fn list(sock: &mut Socket, family: Family) -> Result<Listing, NftError> {
    let fam = nfproto(family);
    let mut l = Listing {
        genid: sock.generation()?,
        ..Listing::default()
    };
    for m in sock.request(NFT_MSG_GETCHAIN, NLM_F_DUMP, fam, |_| {}, "chain dump")? {
        if m.nft_type() != NFT_MSG_NEWCHAIN || m.attrs().str(NFTA_CHAIN_TABLE) != Some(TABLE) {
            continue;
        }
        let a = m.attrs();
        let Some(name) = a.str(NFTA_CHAIN_NAME) else {
            continue;
        };
        let hook = a.find(NFTA_CHAIN_HOOK).map(|h| {
            let h = h.nested();
            (
                h.u32(NFTA_HOOK_HOOKNUM).unwrap_or(0),
                h.u32(NFTA_HOOK_PRIORITY).unwrap_or(0) as i32,
                a.u32(NFTA_CHAIN_POLICY).unwrap_or(0),
                a.str(NFTA_CHAIN_TYPE).unwrap_or_default().to_string(),
            )
        });
        l.chains.push(ChainInfo {
            name: name.to_string(),
            hook,
        });
    }
    let dumped = sock.request(
        NFT_MSG_GETRULE,
        NLM_F_DUMP,
        fam,
        |w| w.put_str(NFTA_RULE_TABLE, TABLE),
        "rule dump",
    )?;
    for m in dumped {
        if m.nft_type() != NFT_MSG_NEWRULE || m.attrs().str(NFTA_RULE_TABLE) != Some(TABLE) {
            continue;
        }
        let a = m.attrs();
        let chain = a.str(NFTA_RULE_CHAIN).unwrap_or_default().to_string();
        let handle = a.u64(NFTA_RULE_HANDLE).unwrap_or(0);
        let raw = a
            .find(NFTA_RULE_EXPRESSIONS)
            .map_or_else(Vec::new, |list| zero_counters(list.data));
        l.rules.push(RuleInfo { chain, handle, raw });
    }
    Ok(l)
}

/// A copy of an expression list with every counter's values set to 0.
pub(crate) fn zero_counters(list: &[u8]) -> Vec<u8> {
    let mut out = list.to_vec();
    let base = list.as_ptr() as usize;
    for (_, data) in expr::exprs(Attrs(list)).filter(|(name, _)| *name == "counter") {
        for v in data {
            let at = v.data.as_ptr() as usize - base;
            out[at..at + v.data.len()].fill(0);
        }
    }
    out
}

/// Our chains' rules, then the jumps into them: each with its chain, its
/// `*-save` text and its nf_tables form.
type Ours = Vec<(&'static str, String, NftRule)>;

fn ours(set: &RuleSet) -> Result<Ours, NftError> {
    let chains = [(REDIRECT_CHAIN, &set.redirect), (OUTPUT_CHAIN, &set.output)];
    let rules = chains.into_iter().flat_map(|(chain, rules)| {
        rules
            .iter()
            .map(move |r| Ok((chain, r.spec(), expr::rule(r, set.family)?)))
    });
    let jumps = JUMPS
        .into_iter()
        .map(|j| Ok((j.from, j.spec(), expr::jump(&j)?)));
    rules.chain(jumps).collect()
}

/// The listing as the restore path would read it from `*-save`: a dumped
/// rule reads as our text when its expressions are exactly one of ours,
/// else as a placeholder naming it (never equal to any of our specs).
fn view(want: &Ours, l: &Listing) -> NatTable {
    let mut t = NatTable::default();
    for c in &l.chains {
        t.add_chain(&c.name);
    }
    for r in &l.rules {
        let list = Attrs(&r.raw);
        let spec = match want.iter().find(|(_, _, n)| expr::matches(&n.exprs, list)) {
            Some((_, spec, _)) => spec.clone(),
            None => {
                let comment = expr::comment_of(list).map(|c| format!(", comment {c:?}"));
                let (handle, comment) = (r.handle, comment.unwrap_or_default());
                format!("(a rule linkerd-cni did not write, handle {handle}{comment})")
            }
        };
        t.add_rule(&r.chain, spec);
    }
    t
}

/// The nat table of `family` in this thread's network namespace.
pub fn dump(
    family: Family,
    timeout: Duration,
    deadline: Option<Instant>,
) -> Result<Listing, NftError> {
    let mut sock = Socket::open(timeout, deadline)?;
    retried(family, || list(&mut sock, family))
}

/// How the nat table differs from `set`, as [`table::differences`] says.
pub fn verify(
    set: &RuleSet,
    timeout: Duration,
    deadline: Option<Instant>,
) -> Result<Vec<String>, NftError> {
    let want = ours(set)?;
    let l = dump(set.family, timeout, deadline)?;
    Ok(table::differences(set, &view(&want, &l)))
}

/// Makes the nat table hold exactly `set`'s chains and jumps.
pub fn apply(set: &RuleSet, timeout: Duration, deadline: Option<Instant>) -> Result<(), NftError> {
    let want = ours(set)?;
    let mut sock = Socket::open(timeout, deadline)?;
    retried(set.family, || {
        let l = list(&mut sock, set.family)?;
        let (w, commands) = batch(set.family, &want, &l, sock.writer());
        sock.commit(&w, &commands, "rule batch")
    })
}

/// The transaction: what `iptables-nft-restore --noflush` sends for
/// [`table::restore_batch`]'s text on the listed table, in its order.
fn batch(family: Family, want: &Ours, l: &Listing, mut w: Writer) -> (Writer, Vec<(u32, String)>) {
    let current = view(want, l);
    let fam = nfproto(family);
    w.batch_begin(l.genid);
    let ack = NLM_F_REQUEST | NLM_F_ACK;
    // Created when absent; an existing one is left as it is.
    let s = w.begin(NFT_MSG_NEWTABLE, ack | NLM_F_CREATE, fam);
    w.put_str(NFTA_TABLE_NAME, TABLE);
    w.end();
    let mut commands = vec![(s, format!("creating table {TABLE}"))];
    for chain in [REDIRECT_CHAIN, OUTPUT_CHAIN] {
        let s = if current.has_chain(chain) {
            let s = w.begin(NFT_MSG_DELRULE, ack, fam);
            w.put_str(NFTA_RULE_TABLE, TABLE);
            w.put_str(NFTA_RULE_CHAIN, chain);
            s
        } else {
            let s = w.begin(NFT_MSG_NEWCHAIN, ack | NLM_F_EXCL, fam);
            w.put_str(NFTA_CHAIN_TABLE, TABLE);
            w.put_str(NFTA_CHAIN_NAME, chain);
            s
        };
        w.end();
        commands.push((s, format!("declaring chain {chain}")));
    }
    for (chain, spec, r) in want {
        // A rule in a built-in chain is a jump: appended only when absent,
        // into the base chain iptables-nft would create.
        if let Some((hook, prio)) = base_hook(chain) {
            if current.rules(chain).contains(spec) {
                continue;
            }
            if !current.has_chain(chain) {
                let s = w.begin(NFT_MSG_NEWCHAIN, ack | NLM_F_CREATE, fam);
                w.put_str(NFTA_CHAIN_TABLE, TABLE);
                w.put_str(NFTA_CHAIN_NAME, chain);
                let h = w.nest(NFTA_CHAIN_HOOK);
                w.put_u32(NFTA_HOOK_HOOKNUM, hook);
                w.put_u32(NFTA_HOOK_PRIORITY, prio as u32);
                w.nest_end(h);
                w.put_u32(NFTA_CHAIN_POLICY, NF_ACCEPT);
                w.put_str(NFTA_CHAIN_TYPE, "nat");
                w.end();
                commands.push((s, format!("creating base chain {chain}")));
            }
        }
        let s = w.begin(NFT_MSG_NEWRULE, ack | NLM_F_CREATE | NLM_F_APPEND, fam);
        w.put_str(NFTA_RULE_TABLE, TABLE);
        w.put_str(NFTA_RULE_CHAIN, chain);
        w.put_nested(NFTA_RULE_EXPRESSIONS, &r.exprs);
        let c = w.nest(NFTA_RULE_COMPAT);
        w.put_u32(NFTA_RULE_COMPAT_PROTO, r.compat_proto);
        w.put_u32(NFTA_RULE_COMPAT_FLAGS, 0);
        w.nest_end(c);
        w.end();
        commands.push((s, format!("-A {chain} {spec}")));
    }
    w.batch_end();
    (w, commands)
}
