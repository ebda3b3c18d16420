//! `linkerd-cni-installer`: the DaemonSet container. Placeholder until the
//! installer issue lands; it only reports its version.

fn main() {
    println!("linkerd-cni-installer {}", env!("CARGO_PKG_VERSION"));
}
