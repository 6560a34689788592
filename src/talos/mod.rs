//! The Talos machine API: ichor's own client (mutual TLS from a talosconfig, node routing,
//! failover, deadlines on ichor's clock, typed errors), the machine-config edit the
//! Kubernetes stages use, and the generated protocol code (our protos in `proto/`).

pub mod archive;
pub mod client;
pub mod codec;
pub mod config;
pub mod machine_config;
pub mod proto;

pub use client::{CallOptions, InstallerFailure, TalosClient, TalosError, UpgradeApi};
pub use config::TalosContext;
