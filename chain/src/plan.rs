//! What a config file's content means for the chain (its [`ChainState`]) and
//! what its repaired content is. Pure functions of bytes: no file system.

use serde_json::{Map, Value};

use super::names::Kind;
use super::text::{self, Append, Style};
use super::{ChainState, PLUGIN_TYPE};

/// A config file's content, as far as the chain is concerned.
#[derive(Debug, Clone)]
pub(crate) struct Analysis {
    pub state: ChainState,
    /// `type` of each plugin of the chain, in order (`?` when missing).
    pub plugins: Vec<String>,
}

/// Whether `v` is one of our entries.
pub(crate) fn is_ours(v: &Value) -> bool {
    v.get("type").and_then(Value::as_str) == Some(PLUGIN_TYPE)
}

/// Whether `bytes` hold `needle` at all: a cheap filter before parsing, as
/// most files never mention us.
pub(crate) fn mentions(bytes: &[u8], needle: &str) -> bool {
    bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// Whether a parsed config holds one of our entries: a list in its
/// plugins, a single-plugin file as itself.
pub(crate) fn holds_ours(kind: Kind, top: &Map<String, Value>) -> bool {
    match kind {
        Kind::List => top
            .get("plugins")
            .and_then(Value::as_array)
            .is_some_and(|p| p.iter().any(is_ours)),
        Kind::Single => top.get("type").and_then(Value::as_str) == Some(PLUGIN_TYPE),
    }
}

/// Keys a runtime overwrites in every plugin of a list before invoking it,
/// so their value in an entry has no effect and is not compared: an entry
/// rebuilt from the plugin's stdin cannot know them.
pub(crate) const RUNTIME_SET: [&str; 2] = ["name", "cniVersion"];

/// The keys whose values differ between an entry and the desired one, in
/// the desired entry's order then the entry's.
pub(crate) fn differing_keys(have: &Map<String, Value>, want: &Map<String, Value>) -> Vec<String> {
    let mut keys = Vec::new();
    for (k, v) in want {
        if !RUNTIME_SET.contains(&k.as_str()) && have.get(k) != Some(v) {
            keys.push(k.clone());
        }
    }
    for k in have.keys() {
        if !RUNTIME_SET.contains(&k.as_str()) && !want.contains_key(k) {
            keys.push(k.clone());
        }
    }
    keys
}

fn type_of(v: &Value) -> String {
    v.get("type")
        .and_then(Value::as_str)
        .unwrap_or("?")
        .to_string()
}

/// Parses and checks what the runtime needs to load the file. `Err` carries
/// the reason it cannot be used.
pub(crate) fn parse(kind: Kind, bytes: &[u8]) -> Result<Map<String, Value>, String> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("not valid JSON: {e}"))?;
    let Value::Object(top) = v else {
        return Err("not a JSON object".into());
    };
    match kind {
        Kind::List => {
            match top.get("name") {
                Some(Value::String(_)) => {}
                Some(_) => return Err("\"name\" is not a string".into()),
                None => return Err("no \"name\"".into()),
            }
            let Some(plugins) = top.get("plugins") else {
                return Err("no \"plugins\" list".into());
            };
            let Value::Array(plugins) = plugins else {
                return Err("\"plugins\" is not a list".into());
            };
            if plugins.is_empty() {
                return Err("\"plugins\" is empty".into());
            }
            if let Some(i) = plugins.iter().position(|p| !p.is_object()) {
                return Err(format!("plugin {} is not a JSON object", i + 1));
            }
        }
        Kind::Single => {
            match top.get("type") {
                Some(Value::String(t)) if !t.is_empty() => {}
                _ if top.contains_key("plugins") => {
                    return Err(
                        "a plugin list in a single-plugin file (.conf/.json); runtimes only read lists from .conflist files"
                            .into(),
                    );
                }
                _ => return Err("no \"type\"".into()),
            }
            match top.get("name") {
                Some(Value::String(_)) => {}
                _ => return Err("no network \"name\"".into()),
            }
        }
    }
    Ok(top)
}

/// The chain state of one config file's content.
pub(crate) fn analyze(kind: Kind, bytes: &[u8], desired: &Map<String, Value>) -> Analysis {
    let top = match parse(kind, bytes) {
        Ok(top) => top,
        Err(reason) => {
            return Analysis {
                state: ChainState::Invalid { reason },
                plugins: vec![],
            };
        }
    };
    if kind == Kind::Single {
        let v = Value::Object(top);
        let state = if is_ours(&v) {
            ChainState::NoPrimaryPlugin
        } else {
            ChainState::SingleConf
        };
        return Analysis {
            state,
            plugins: vec![type_of(&v)],
        };
    }
    let plugins: &[Value] = top
        .get("plugins")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let len = plugins.len();
    let positions: Vec<usize> = (0..len)
        .filter(|&i| plugins.get(i).is_some_and(is_ours))
        .collect();
    let state = if positions.len() == len {
        ChainState::NoPrimaryPlugin
    } else {
        match positions.as_slice() {
            [] => ChainState::Missing,
            [p] if *p + 1 != len => ChainState::NotLast { position: *p, len },
            [p] => {
                let keys = plugins
                    .get(*p)
                    .and_then(Value::as_object)
                    .map(|have| differing_keys(have, desired))
                    .unwrap_or_default();
                if keys.is_empty() {
                    ChainState::Healthy
                } else {
                    ChainState::Stale { position: *p, keys }
                }
            }
            _ => ChainState::Duplicated { positions, len },
        }
    };
    Analysis {
        state,
        plugins: plugins.iter().map(type_of).collect(),
    }
}

/// The repaired content of a file, or `None` when it needs no repair or
/// cannot be repaired (see its [`analyze`] state).
///
/// A list keeps every byte outside the linkerd entries; a single-plugin file
/// becomes the content of the `.conflist` that replaces it.
pub(crate) fn repaired(kind: Kind, bytes: &[u8], desired: &Map<String, Value>) -> Option<Vec<u8>> {
    if !analyze(kind, bytes, desired).state.is_repairable() {
        return None;
    }
    let top = parse(kind, bytes).ok()?;
    let entry = Value::Object(desired.clone());
    let text = std::str::from_utf8(bytes).ok();
    match kind {
        Kind::List => {
            let plugins = top.get("plugins")?.as_array()?;
            // An entry that already is the desired one moves verbatim (the
            // last such, if several): no reformatting, no key dropped.
            let reuse = plugins.iter().rposition(|p| {
                is_ours(p)
                    && p.as_object()
                        .is_some_and(|p| differing_keys(p, desired).is_empty())
            });
            let last = match reuse {
                Some(i) => (Append::Element(i), plugins.get(i)?.clone()),
                None => (Append::Value(&entry), entry.clone()),
            };
            Some(edit_list(text, &top, plugins, Some(last)))
        }
        Kind::Single => {
            let mut head = Map::new();
            for k in ["name", "cniVersion"] {
                if let Some(v) = top.get(k) {
                    head.insert(k.to_string(), v.clone());
                }
            }
            let mut want = head.clone();
            want.insert(
                "plugins".into(),
                Value::Array(vec![Value::Object(top), entry.clone()]),
            );
            let wrapped = text.and_then(|t| text::wrap_single(t, &head, &entry));
            Some(checked(wrapped, &want, text))
        }
    }
}

/// Content with every linkerd entry removed, or `None` when the file holds
/// none, is not a valid list, or would be left with no plugin at all (a
/// list that held only linkerd is not ours to delete).
pub(crate) fn without_entries(bytes: &[u8]) -> Option<Vec<u8>> {
    let top = parse(Kind::List, bytes).ok()?;
    let plugins = top.get("plugins")?.as_array()?;
    let ours = plugins.iter().filter(|p| is_ours(p)).count();
    if ours == 0 || ours == plugins.len() {
        return None;
    }
    Some(edit_list(
        std::str::from_utf8(bytes).ok(),
        &top,
        plugins,
        None,
    ))
}

/// The list `top` (as `text`) with its plugins other than ours, then
/// `last` when given (how to write it in the text, and its value): the
/// text edited in place wherever [`checked`] finds the edit right.
fn edit_list(
    text: Option<&str>,
    top: &Map<String, Value>,
    plugins: &[Value],
    last: Option<(Append<'_>, Value)>,
) -> Vec<u8> {
    let keep: Vec<usize> = (0..plugins.len())
        .filter(|&i| plugins.get(i).is_some_and(|p| !is_ours(p)))
        .collect();
    let mut list: Vec<Value> = keep
        .iter()
        .filter_map(|&i| plugins.get(i).cloned())
        .collect();
    let (append, value) = last.unzip();
    list.extend(value);
    let mut want = top.clone();
    want.insert("plugins".into(), Value::Array(list));
    let spliced = text.and_then(|t| {
        let arr = text::find_plugins(t)?;
        (arr.elems.len() == plugins.len()).then_some(())?;
        text::splice_plugins(t, &arr, &keep, append)
    });
    checked(spliced, &want, text)
}

/// The edited text if it parses to exactly `want` (same keys in the same
/// order, same numbers); otherwise `want` serialized in the original's
/// style. The edit is the rule; the fallback guards against a text-edit bug
/// ever reaching a node.
fn checked(edited: Option<String>, want: &Map<String, Value>, orig: Option<&str>) -> Vec<u8> {
    if let Some(e) = edited
        && let Ok(Value::Object(got)) = serde_json::from_str::<Value>(&e)
        && same_order(&got, want)
    {
        return e.into_bytes();
    }
    log::info!("a config could not be edited in place; writing it re-serialized in its layout");
    #[cfg(test)]
    FALLBACKS.with(|n| n.set(n.get() + 1));
    let style = Style::detect(orig.unwrap_or("{\n  \"\": 0\n}"));
    let mut s = style.value(&Value::Object(want.clone()), "");
    if orig.is_none_or(|o| o.ends_with('\n')) {
        s.push('\n');
    }
    s.into_bytes()
}

#[cfg(test)]
thread_local! {
    /// How often [`checked`] fell back to serialization, on this thread.
    pub(crate) static FALLBACKS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Map equality that also requires the same key order, at every depth.
fn same_order(a: &Map<String, Value>, b: &Map<String, Value>) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b.iter())
            .all(|((ka, va), (kb, vb))| ka == kb && same_value(va, vb))
}

fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => same_order(x, y),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_value(p, q))
        }
        _ => a == b,
    }
}
