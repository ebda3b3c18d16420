//! `linkerd-cni-agent`: see the library's docs.

fn main() -> std::process::ExitCode {
    linkerd_cni_agent::main()
}
