//! Every environment variable the installer reads is in
//! `docs/configuration.md`, and every variable listed there is read: clap's
//! command, built as the binary builds it, enumerates them.

use std::collections::BTreeSet;

use testkit::docs;

const SECTION: &str = "Installer environment variables";

/// The variables of the installer's settings.
fn read_by_the_installer() -> BTreeSet<String> {
    linkerd_cni_agent::cli::command()
        .get_arguments()
        .filter_map(|a| a.get_env())
        .map(|v| v.to_string_lossy().into_owned())
        .collect()
}

#[test]
fn every_installer_variable_is_documented_and_every_documented_one_is_read() {
    let read = read_by_the_installer();
    // Guards against a command that silently lists nothing.
    assert!(
        read.len() >= 20,
        "clap lists only {} installer variables: {read:?}",
        read.len()
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
    // Whole names: clap writes them inside `[env: NAME]`.
    let words: BTreeSet<&str> = help
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .collect();
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
