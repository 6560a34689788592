//! The twin: a simulated Talos cluster served over the real Talos gRPC API and Kubernetes
//! REST API, plus a GitHub REST emulator. Used by `ichor sim`, `ichor demo`, the tests and
//! the benches. Nothing outside `sim` and the CLI imports it.

pub mod faults;
pub mod fixture;
pub mod github;
pub mod kube;
pub mod net;
pub mod pki;
pub mod state;
pub mod talos;
pub mod twin;
pub mod yaml;
