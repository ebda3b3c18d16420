//! Text-level editing of config files, so that a repair changes nothing but
//! what it must: the primary's formatting, key order, numbers and everything
//! outside the `plugins` array stay byte-identical.
//!
//! Every function here works on text that serde_json has already accepted,
//! and every result is re-parsed and compared with the intended value by the
//! caller ([`super::plan`]), which falls back to plain serialization if the
//! two ever disagree. Where each value lies in the text is serde_json's own
//! answer (its raw text, borrowed from the input), so the positions are
//! those of the parse that accepted the file; anything unexpected gives
//! `None`.

use std::{fmt, io};

use serde::Serialize;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::ser::{Formatter, Serializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// Byte spans of the top-level `plugins` array of a conflist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PluginsArray {
    /// Index of the `[`.
    pub open: usize,
    /// Index of the `]`.
    pub close: usize,
    /// `start..end` of each element.
    pub elems: Vec<(usize, usize)>,
}

/// The members of a JSON object as written: each key (unescaped) with its
/// value's text, which borrows from the input, in order and with repeats.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> Visitor<'de> for Visit {
            type Value = Members<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// Where `part`, a slice of `text`, starts in it.
fn offset(text: &str, part: &RawValue) -> usize {
    (part.get().as_ptr() as usize).saturating_sub(text.as_ptr() as usize)
}

/// Finds the `plugins` array of the top-level object. `None` when the text
/// is not shaped as expected, including a repeated `plugins` key (whose
/// meaning differs between parsers).
pub(crate) fn find_plugins(text: &str) -> Option<PluginsArray> {
    let Members(members) = serde_json::from_str(text).ok()?;
    let mut plugins = members.iter().filter(|(k, _)| k == "plugins");
    let (_, raw) = plugins.next()?;
    if plugins.next().is_some() {
        return None;
    }
    let elems: Vec<&RawValue> = serde_json::from_str(raw.get()).ok()?;
    let open = offset(text, raw);
    Some(PluginsArray {
        open,
        close: open + raw.get().len() - 1,
        elems: elems
            .iter()
            .map(|e| (offset(text, e), offset(text, e) + e.get().len()))
            .collect(),
    })
}

/// JSON's whitespace.
fn is_ws(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

/// How a file is laid out, so that what we add looks like what is there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Style {
    /// One member per line (`None`: everything on one line).
    pub pretty: Option<Pretty>,
    /// Between a key and its value: `":"` or `": "`.
    pub colon: &'static str,
    /// Between members on one line (compact style): `","` or `", "`.
    pub comma: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pretty {
    /// One level of nesting.
    pub indent: String,
    pub newline: &'static str,
}

impl Style {
    pub(crate) fn detect(text: &str) -> Style {
        // The first member of the top-level object shows the spacing.
        let mut colon = ": ";
        let mut comma = ", ";
        let members = serde_json::from_str::<Members<'_>>(text).map(|m| m.0);
        if let Some((_, first)) = members.as_deref().unwrap_or_default().first() {
            let start = offset(text, first);
            if text.as_bytes().get(start.wrapping_sub(1)) == Some(&b':') {
                colon = ":";
            }
            let after = text
                .get(start + first.get().len()..)
                .unwrap_or_default()
                .trim_start_matches(is_ws);
            if after
                .strip_prefix(',')
                .is_some_and(|r| !r.starts_with(is_ws))
            {
                comma = ",";
            }
        }
        let body = text.trim();
        let pretty = body.find('\n').map(|first_nl| {
            let newline = if body.contains("\r\n") { "\r\n" } else { "\n" };
            // The first line holding something, after the opening brace's
            // line: a member of the top-level object, one indent deep.
            let indent = body
                .get(first_nl + 1..)
                .unwrap_or_default()
                .split('\n')
                .map(|l| l.trim_end_matches('\r'))
                .find(|l| !l.trim().is_empty())
                .map(|l| l[..l.len() - l.trim_start().len()].to_string())
                .unwrap_or_else(|| "  ".to_string());
            Pretty { indent, newline }
        });
        Style {
            pretty,
            colon,
            comma,
        }
    }

    /// `v` serialized in this style, each line after the first prefixed with
    /// `base` (the indentation of the line it starts on).
    pub(crate) fn value(&self, v: &Value, base: &str) -> String {
        let mut out = Vec::new();
        let fmt = Layout {
            style: self,
            base: base.as_bytes(),
            depth: 0,
            has_value: false,
        };
        let mut ser = Serializer::with_formatter(&mut out, fmt);
        // Serializing a Value into a Vec cannot fail.
        if v.serialize(&mut ser).is_err() {
            return v.to_string();
        }
        String::from_utf8(out).unwrap_or_else(|_| v.to_string())
    }

    /// Separator between array elements when there is no example to copy.
    fn separator(&self, lead: &str) -> String {
        match &self.pretty {
            None => self.comma.to_string(),
            Some(_) if lead.contains('\n') => format!(",{lead}"),
            Some(_) => ", ".to_string(),
        }
    }
}

/// A serde_json formatter for [`Style`]: `PrettyFormatter`'s layout with the
/// file's indent, line ending and spacing, nested under `base`.
struct Layout<'a> {
    style: &'a Style,
    base: &'a [u8],
    depth: usize,
    has_value: bool,
}

impl Layout<'_> {
    fn line<W: ?Sized + io::Write>(&self, w: &mut W) -> io::Result<()> {
        if let Some(p) = &self.style.pretty {
            w.write_all(p.newline.as_bytes())?;
            w.write_all(self.base)?;
            for _ in 0..self.depth {
                w.write_all(p.indent.as_bytes())?;
            }
        }
        Ok(())
    }

    fn sep<W: ?Sized + io::Write>(&self, w: &mut W, first: bool) -> io::Result<()> {
        if !first {
            let sep = if self.style.pretty.is_some() {
                ","
            } else {
                self.style.comma
            };
            w.write_all(sep.as_bytes())?;
        }
        self.line(w)
    }

    fn close<W: ?Sized + io::Write>(&mut self, w: &mut W, c: &[u8]) -> io::Result<()> {
        self.depth = self.depth.saturating_sub(1);
        if self.has_value {
            self.line(w)?;
        }
        self.has_value = true;
        w.write_all(c)
    }
}

impl Formatter for Layout<'_> {
    fn begin_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        w.write_all(b"[")
    }

    fn end_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.close(w, b"]")
    }

    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.sep(w, first)
    }

    fn end_array_value<W: ?Sized + io::Write>(&mut self, _w: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        w.write_all(b"{")
    }

    fn end_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.close(w, b"}")
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.sep(w, first)
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(self.style.colon.as_bytes())
    }

    fn end_object_value<W: ?Sized + io::Write>(&mut self, _w: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

/// The whitespace that starts the line `pos` is on.
fn line_indent(text: &str, pos: usize) -> &str {
    let head = text.get(..pos).unwrap_or_default();
    let line_start = head.rfind('\n').map_or(0, |i| i + 1);
    let line = head.get(line_start..).unwrap_or_default();
    &line[..line.len() - line.trim_start().len()]
}

/// An element to add at the end of a `plugins` array.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Append<'a> {
    /// Serialized in the file's style.
    Value(&'a Value),
    /// An existing element of the array, moved verbatim.
    Element(usize),
}

/// `text` with its `plugins` array holding the elements `keep` (indices into
/// `arr.elems`, in order) followed by `append`, everything else untouched.
pub(crate) fn splice_plugins(
    text: &str,
    arr: &PluginsArray,
    keep: &[usize],
    append: Option<Append<'_>>,
) -> Option<String> {
    let seg = |a: usize, b: usize| text.get(a..b);
    let n = arr.elems.len();
    let first = arr.elems.first().copied();
    let last = arr.elems.last().copied();
    // The layout between '[' and the first element, between elements, and
    // between the last element and ']'.
    let lead = match first {
        Some((s, _)) => seg(arr.open + 1, s)?,
        None => seg(arr.open + 1, arr.close)?,
    };
    let tail = match last {
        Some((_, e)) => seg(e, arr.close)?,
        None => "",
    };
    let style = Style::detect(text);
    let default_sep = style.separator(lead);
    let sep_before = |k: usize| -> Option<&str> {
        let (_, prev_end) = *arr.elems.get(k.checked_sub(1)?)?;
        let (start, _) = *arr.elems.get(k)?;
        seg(prev_end, start)
    };
    // The separator used before the last element: what we append after.
    let append_sep = if n >= 2 {
        sep_before(n - 1)?.to_string()
    } else {
        default_sep.clone()
    };

    let mut out = String::with_capacity(text.len() + 256);
    out.push_str(seg(0, arr.open + 1)?);
    let mut items: Vec<(String, &str)> = Vec::new();
    for (pos, &k) in keep.iter().enumerate() {
        let (s, e) = *arr.elems.get(k)?;
        let sep = if pos == 0 {
            ""
        } else {
            sep_before(k).unwrap_or(&append_sep)
        };
        items.push((sep.to_string(), seg(s, e)?));
    }
    let new_elem;
    if let Some(append) = append {
        let base = match (keep.last(), first) {
            (Some(&k), _) => line_indent(text, arr.elems.get(k)?.0),
            (None, Some((s, _))) => line_indent(text, s),
            (None, None) => line_indent(text, arr.open),
        };
        new_elem = match append {
            Append::Value(v) => style.value(v, base),
            Append::Element(i) => {
                let (s, e) = *arr.elems.get(i)?;
                seg(s, e)?.to_string()
            }
        };
        let sep = if items.is_empty() { "" } else { &append_sep };
        items.push((sep.to_string(), &new_elem));
    }
    if items.is_empty() {
        // An empty list: keep only what was around the elements.
        out.push_str(if lead.trim().is_empty() { "" } else { lead });
    } else {
        out.push_str(lead);
        for (sep, item) in &items {
            out.push_str(sep);
            out.push_str(item);
        }
        out.push_str(tail);
    }
    out.push_str(seg(arr.close, text.len())?);
    Some(out)
}

/// A single-plugin config turned into a list: `name` and `cniVersion` of the
/// original at the top, the original object verbatim as the first plugin,
/// then `entry`. Layout, line endings and trailing text follow the original.
pub(crate) fn wrap_single(text: &str, top: &Map<String, Value>, entry: &Value) -> Option<String> {
    let start = text.find('{')?;
    let end = text.rfind('}')? + 1;
    let orig = text.get(start..end)?;
    let trailing = text.get(end..)?;
    let style = Style::detect(text);
    let key = |k: &str| Value::String(k.to_string()).to_string();
    let mut out = String::with_capacity(text.len() * 2 + 256);
    match &style.pretty {
        None => {
            let (colon, comma) = (style.colon, style.comma);
            out.push('{');
            for (k, v) in top {
                out.push_str(&format!("{}{colon}{}{comma}", key(k), style.value(v, "")));
            }
            out.push_str(&format!(
                "{}{colon}[{orig}{comma}{}]}}",
                key("plugins"),
                style.value(entry, "")
            ));
        }
        Some(Pretty { indent, newline }) => {
            let colon = style.colon;
            let inner = format!("{indent}{indent}");
            out.push('{');
            for (k, v) in top {
                out.push_str(&format!(
                    "{newline}{indent}{}{colon}{},",
                    key(k),
                    style.value(v, indent)
                ));
            }
            // JSON strings hold no raw newline: every '\n' is layout.
            let orig = orig.replace('\n', &format!("\n{inner}"));
            out.push_str(&format!(
                "{newline}{indent}{}{colon}[{newline}{inner}{orig},{newline}{inner}{}{newline}{indent}]{newline}}}",
                key("plugins"),
                style.value(entry, &inner)
            ));
        }
    }
    out.push_str(trailing);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_the_plugins_array_among_tricky_strings() {
        let text =
            r#"{"name":"a]}\"[{","plugins" : [ {"type":"x","s":"]},{"} ,{"type":"y"} ] ,"z":[1]}"#;
        let arr = find_plugins(text).unwrap();
        let elems: Vec<&str> = arr.elems.iter().map(|&(s, e)| &text[s..e]).collect();
        assert_eq!(elems, [r#"{"type":"x","s":"]},{"}"#, r#"{"type":"y"}"#]);
        assert_eq!(&text[arr.open..=arr.open], "[");
        assert_eq!(&text[arr.close..=arr.close], "]");
    }

    #[test]
    fn no_plugins_or_repeated_plugins_is_none() {
        assert_eq!(find_plugins(r#"{"name":"x"}"#), None);
        assert_eq!(find_plugins(r#"{"plugins":[],"plugins":[]}"#), None);
        assert_eq!(find_plugins(r#"{"plugins":{}}"#), None);
        assert_eq!(find_plugins(r#"[1]"#), None);
        assert_eq!(find_plugins(r#"{"plugins":[1,2"#), None);
    }

    #[test]
    fn escaped_key_is_recognised() {
        let arr = find_plugins(r#"{"plu\u0067ins":[{"type":"a"}]}"#).unwrap();
        assert_eq!(arr.elems.len(), 1);
    }

    #[test]
    fn style_detection() {
        let s = Style::detect(r#"{"a":1,"b":2}"#);
        assert_eq!((s.pretty, s.colon, s.comma), (None, ":", ","));
        let s = Style::detect(r#"{"a": 1, "b": 2}"#);
        assert_eq!((s.pretty, s.colon, s.comma), (None, ": ", ", "));
        let s = Style::detect("{\n    \"a\": 1\n}\n");
        assert_eq!(
            s.pretty,
            Some(Pretty {
                indent: "    ".into(),
                newline: "\n"
            })
        );
        let s = Style::detect("{\r\n\t\"a\":1\r\n}");
        assert_eq!(
            s.pretty,
            Some(Pretty {
                indent: "\t".into(),
                newline: "\r\n"
            })
        );
        assert_eq!(s.colon, ":");
    }

    #[test]
    fn pretty_value_is_indented_from_its_line() {
        let s = Style::detect("{\n  \"x\": 1\n}");
        assert_eq!(
            s.value(&json!({"type":"l","a":[1],"e":[],"o":{}}), "    "),
            "{\n      \"type\": \"l\",\n      \"a\": [\n        1\n      ],\n      \"e\": [],\n      \"o\": {}\n    }"
        );
        let s = Style::detect("{\"x\": 1, \"y\": 2}");
        assert_eq!(
            s.value(&json!({"a":[1,2],"b":{"c":3}}), "  "),
            r#"{"a": [1, 2], "b": {"c": 3}}"#
        );
    }
}
