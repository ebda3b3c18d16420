//! The reference tables of `docs/configuration.md`, read by the tests that
//! keep them in step with the code: each crate that owns settings compares
//! the names its code reads with the names its section of the document
//! lists, both ways.
//!
//! A name counts when it stands in backticks in the given column of a
//! Markdown table row under the section's heading (its sub-sections
//! included, up to the next heading of the same or a higher level). Header
//! and separator rows do not count.

use std::collections::BTreeSet;
use std::path::Path;

/// `docs/configuration.md`, relative to the workspace root.
pub const CONFIGURATION: &str = "docs/configuration.md";

/// The text of `docs/configuration.md`, found from the calling crate's
/// manifest dir (pass `env!("CARGO_MANIFEST_DIR")`): the crates are
/// direct children of the workspace root. The caller's own directory, not
/// testkit's, so that the document read is the one beside the code tested.
pub fn configuration(crate_dir: &str) -> String {
    let crate_dir = Path::new(crate_dir);
    let root = crate_dir
        .parent()
        .unwrap_or_else(|| panic!("{} has no parent directory", crate_dir.display()));
    let path = root.join(CONFIGURATION);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The lines of the section whose heading text is `heading` (without the
/// `#`s), sub-sections included. Panics when there is no such heading: a
/// renamed section must fail the test, not make it vacuous.
pub fn section<'a>(doc: &'a str, heading: &str) -> Vec<&'a str> {
    let mut lines = doc.lines();
    let level = loop {
        let Some(line) = lines.next() else {
            panic!("{CONFIGURATION} has no heading {heading:?}");
        };
        if let Some((level, text)) = heading_of(line)
            && text == heading
        {
            break level;
        }
    };
    lines
        .take_while(|l| heading_of(l).is_none_or(|(lv, _)| lv > level))
        .collect()
}

/// The names in backticks in `column` (0 = first) of the table rows of
/// `lines`. A cell may hold several names (`` `A`, `B` ``); each counts.
pub fn names_in_column(lines: &[&str], column: usize) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut in_table = false;
    for line in lines {
        let row = line.trim();
        if !row.starts_with('|') {
            in_table = false;
            continue;
        }
        if !in_table {
            // The header row: column titles, not names.
            in_table = true;
            continue;
        }
        let cells: Vec<&str> = row.trim_matches('|').split('|').collect();
        if cells
            .iter()
            .all(|c| c.trim().chars().all(|ch| "-: ".contains(ch)))
        {
            continue;
        }
        if let Some(cell) = cells.get(column) {
            names.extend(backticked(cell));
        }
    }
    names
}

/// The texts between pairs of backticks in `s`.
pub fn backticked(s: &str) -> Vec<String> {
    s.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .filter(|n| !n.is_empty())
        .collect()
}

/// What differs between the names the code has and those the document
/// lists, said so that whoever reads the failure knows what to add where;
/// `None` when they agree.
pub fn compare(
    what: &str,
    code: &BTreeSet<String>,
    doc: &BTreeSet<String>,
    section: &str,
) -> Option<String> {
    let undocumented: Vec<&String> = code.difference(doc).collect();
    let stale: Vec<&String> = doc.difference(code).collect();
    if undocumented.is_empty() && stale.is_empty() {
        return None;
    }
    let mut msg = String::new();
    if !undocumented.is_empty() {
        msg.push_str(&format!(
            "{what} in the code but not in {CONFIGURATION}, section {section:?}: {undocumented:?}; \
             add a row for each (name in backticks in the table's first column).\n"
        ));
    }
    if !stale.is_empty() {
        msg.push_str(&format!(
            "{what} in {CONFIGURATION}, section {section:?}, that the code does not have: \
             {stale:?}; remove or rename those rows.\n"
        ));
    }
    Some(msg)
}

/// `(level, text)` of a Markdown ATX heading.
fn heading_of(line: &str) -> Option<(usize, &str)> {
    let level = line.bytes().take_while(|&b| b == b'#').count();
    if level == 0 || level > 6 {
        return None;
    }
    line[level..]
        .strip_prefix(' ')
        .map(|text| (level, text.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "\
# Title

## Alpha

| name | default |
|---|---|
| `A_ONE` | `x` |
| `A_TWO`, `A_THREE` | none |

### Alpha detail

| key | meaning |
| --- | --- |
| `a.nested` | y |

## Beta

| `B_HEADER` | `b` |
|---|---|
| `B_ONE` | `z` |
";

    #[test]
    fn names_of_a_section_and_its_subsections_only() {
        let alpha = section(DOC, "Alpha");
        let names = names_in_column(&alpha, 0);
        let want: BTreeSet<String> = ["A_ONE", "A_TWO", "A_THREE", "a.nested"]
            .map(String::from)
            .into();
        assert_eq!(names, want);
        let beta = section(DOC, "Beta");
        assert_eq!(names_in_column(&beta, 0), ["B_ONE".to_string()].into());
        assert_eq!(names_in_column(&beta, 1), ["z".to_string()].into());
    }

    #[test]
    #[should_panic(expected = "no heading")]
    fn a_missing_section_fails() {
        section(DOC, "Gamma");
    }

    #[test]
    fn differences_both_ways() {
        let code: BTreeSet<String> = ["X", "Y"].map(String::from).into();
        let doc: BTreeSet<String> = ["Y", "Z"].map(String::from).into();
        let msg = compare("variables", &code, &doc, "S").unwrap();
        assert!(msg.contains("[\"X\"]") && msg.contains("[\"Z\"]"), "{msg}");
        assert_eq!(compare("variables", &code, &code, "S"), None);
    }
}
