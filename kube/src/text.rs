//! Text from the API server made safe to log and to return as a CNI
//! error: whoever answers at the server address (the API server, an
//! admission webhook whose message it relays, a proxy in the way) chooses
//! it, and a line break or a terminal escape in it would forge log lines
//! or rewrite what an operator's terminal shows.

/// `s` on one line, at most `max_chars` characters of it: control
/// characters (line breaks, ESC, C1 codes), Unicode's bidirectional
/// overrides and backslashes escaped as Rust writes them (`\n`, `\u{1b}`,
/// `\\`), and `...` where it was cut.
pub fn printable(s: &str, max_chars: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max_chars * 2));
    let mut chars = s.chars();
    for c in chars.by_ref().take(max_chars) {
        if c == '\\' || c.is_control() || is_bidi_control(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if chars.next().is_some() {
        out.push_str("...");
    }
    out
}

/// The characters that reorder how text around them is shown (embeddings,
/// overrides, isolates and marks): not control characters to
/// [`char::is_control`], but they can make a line read other than it is.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_no_escapes_bounded() {
        let forged =
            "denied\n2026-01-01T00:00:00.000Z WARN  linkerd-cni[1]: \u{1b}[2Kall good\r\u{9b}x";
        let p = printable(forged, 500);
        assert!(!p.chars().any(|c| c.is_control()), "{p}");
        assert_eq!(
            p,
            "denied\\n2026-01-01T00:00:00.000Z WARN  linkerd-cni[1]: \\u{1b}[2Kall good\\r\\u{9b}x"
        );
        assert_eq!(printable("a\\nb", 10), "a\\\\nb");
        assert_eq!(printable("x\u{202e}y", 10), "x\\u{202e}y");
        // Readable text stays as it is, quotes and non-ASCII letters too.
        let plain = r#"pods "web-0" is forbidden: User "system:node:nœud" cannot get"#;
        assert_eq!(printable(plain, 500), plain);
        assert_eq!(printable("abcdef", 3), "abc...");
        assert_eq!(printable("abc", 3), "abc");
        assert_eq!(printable("", 3), "");
    }
}
