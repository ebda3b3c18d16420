//! The repair controller: deletes this node's meshed pods that
//! started without linkerd-cni's redirect rules, so that their owners create
//! them again, this time through a working chain.
//!
//! linkerd's injector adds a `linkerd-network-validator` init container to
//! meshed pods in CNI mode; it exits 95 when outbound traffic is not
//! redirected, i.e. when the pod's network was set up without linkerd-cni
//! (the node was not chained yet, or the chain was broken). Such a pod
//! crash-loops forever; deleting it is the repair when a controller (its
//! ReplicaSet, StatefulSet, DaemonSet, Job...) creates it again. A pod
//! without one is left in place and reported: deleting it would lose it.
//! So is a static pod's mirror pod: the kubelet would only create the
//! mirror again, restarting nothing.
//!
//! The crate owns:
//!
//! - [`args`]: the command line, compatible with the upstream controller's
//!   flags and `LINKERD_CNI_REPAIR_CONTROLLER_*` variables;
//! - [`pod`]: which pods need a repair;
//! - [`chain_gate`]: whether this node's chain is healthy, so that no pod is
//!   deleted while its replacement would fail the same way (the only module
//!   that uses linkerd-cni's chain library);
//! - [`backoff`]: per-pod backoff between deletions;
//! - [`controller`]: the watch of this node's pods and the repair loop;
//! - [`metrics`], [`process`] and [`admin`]: Prometheus metrics (the
//!   controller's and the standard `process_*` ones), `/live` and `/ready`;
//! - [`crate::logging`]: plain or JSON logs on stderr, as the installer's.

pub mod admin;
pub mod args;
pub mod backoff;
pub mod chain_gate;
pub mod cli;
pub mod controller;
pub mod lookup;
pub mod metrics;
pub mod pod;
pub mod process;
