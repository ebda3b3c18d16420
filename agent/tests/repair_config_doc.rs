//! Every flag and environment variable of the repair controller is in
//! `docs/configuration.md`, and every one listed there exists: clap's
//! command, built as the binary builds it, enumerates them.

use std::collections::BTreeSet;

use clap::CommandFactory;
use linkerd_cni_agent::repair::args::Args;
use testkit::docs;

const SECTION: &str = "Repair controller flags";

#[test]
fn every_flag_and_variable_is_documented_and_every_documented_one_exists() {
    let mut cmd = Args::command();
    // Adds the generated --help and --version, which the binary has too.
    cmd.build();
    let mut flags = BTreeSet::new();
    let mut vars = BTreeSet::new();
    for arg in cmd.get_arguments() {
        if let Some(long) = arg.get_long() {
            flags.insert(format!("--{long}"));
        }
        if let Some(env) = arg.get_env() {
            vars.insert(env.to_string_lossy().into_owned());
        }
    }
    assert!(
        flags.len() >= 10 && vars.len() >= 8,
        "clap lists too few arguments: {flags:?} {vars:?}"
    );
    let text = docs::configuration(env!("CARGO_MANIFEST_DIR"));
    let lines = docs::section(&text, SECTION);
    let mut failures = String::new();
    let doc_flags = docs::names_in_column(&lines, 0);
    if let Some(msg) = docs::compare("repair controller flags", &flags, &doc_flags, SECTION) {
        failures.push_str(&msg);
    }
    let doc_vars = docs::names_in_column(&lines, 1);
    if let Some(msg) = docs::compare(
        "repair controller variables (second column)",
        &vars,
        &doc_vars,
        SECTION,
    ) {
        failures.push_str(&msg);
    }
    assert!(failures.is_empty(), "{failures}");
}

/// `--help` says where each flag is explained, in a section that exists.
#[test]
fn help_points_at_the_configuration_reference() {
    let help = Args::command().render_long_help().to_string();
    assert!(
        help.contains("docs/configuration.md") && help.contains(&format!("\"{SECTION}\"")),
        "{help}"
    );
    let text = docs::configuration(env!("CARGO_MANIFEST_DIR"));
    assert!(text.contains(&format!("\n## {SECTION}\n")));
}
