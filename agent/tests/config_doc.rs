//! Every environment variable the installer reads is in
//! `docs/configuration.md`, and every variable listed there is read.
//!
//! The installer is a binary crate, so its names are taken from its source:
//! `Config::from_env` reads each variable through `var("NAME")`, and
//! `config::VARIABLES` lists them for the UTF-8 check at start. Both must
//! agree with each other and with the document.

use std::collections::BTreeSet;

use testkit::docs;

const SECTION: &str = "Installer environment variables";
const CONFIG_RS: &str = include_str!("../src/config.rs");

/// The string literals `var("NAME")` reads in config.rs.
fn read_by_from_env() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for piece in CONFIG_RS.split("var(\"").skip(1) {
        // The argument runs to the closing quote; only a literal that is
        // the whole argument (`var("X")`) is a variable read.
        if let Some((name, rest)) = piece.split_once('"')
            && rest.starts_with(')')
            && !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        {
            names.insert(name.to_string());
        }
    }
    names
}

/// The names of the `VARIABLES` array in config.rs.
fn variables_array() -> BTreeSet<String> {
    let start = CONFIG_RS
        .find("pub const VARIABLES")
        .expect("config.rs declares VARIABLES");
    let body = &CONFIG_RS[start..];
    let open = body.find("= [").expect("VARIABLES is an array") + 3;
    let close = body[open..].find("];").expect("VARIABLES ends with ];") + open;
    body[open..close]
        .split(',')
        .map(|s| s.trim().trim_matches('"').to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

#[test]
fn every_installer_variable_is_documented_and_every_documented_one_is_read() {
    let read = read_by_from_env();
    // Guards against a parser that silently finds nothing.
    assert!(
        read.len() >= 20,
        "found only {} var(\"...\") reads in agent/src/config.rs: {read:?}",
        read.len()
    );
    assert_eq!(
        read,
        variables_array(),
        "config::VARIABLES must list exactly the variables Config::from_env reads"
    );
    let text = docs::configuration(env!("CARGO_MANIFEST_DIR"));
    let documented = docs::names_in_column(&docs::section(&text, SECTION), 0);
    if let Some(msg) = docs::compare("installer variables", &read, &documented, SECTION) {
        panic!("{msg}");
    }
}

/// Each binary's `--help` lists its subcommands and its settings: every
/// installer variable of the document by name, and where they are
/// explained, in a section that exists; `linkerd-cni-sh` says it has none.
#[test]
fn help_lists_the_settings_and_points_at_the_reference() {
    let text = docs::configuration(env!("CARGO_MANIFEST_DIR"));
    assert!(text.contains(&format!("\n## {SECTION}\n")));
    let documented = docs::names_in_column(&docs::section(&text, SECTION), 0);

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_linkerd-cni-agent"))
        .arg("--help")
        .env_clear()
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for cmd in ["check", "status", "uninstall", "version"] {
        assert!(
            help.contains(&format!("linkerd-cni-installer {cmd}")),
            "{help}"
        );
    }
    assert!(
        help.contains("docs/configuration.md") && help.contains(&format!("\"{SECTION}\"")),
        "{help}"
    );
    let words: BTreeSet<&str> = help.split_whitespace().collect();
    let missing: Vec<&String> = documented
        .iter()
        .filter(|v| !words.contains(v.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "--help does not list {missing:?}:\n{help}"
    );

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_linkerd-cni-sh"))
        .arg("--help")
        .env_clear()
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("-c SCRIPT")
            && help.contains("SETTINGS")
            && help.contains("docs/configuration.md"),
        "{help}"
    );
}
