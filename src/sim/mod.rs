//! The twin: a simulated Talos cluster served over the real Talos gRPC API and Kubernetes
//! REST API, plus a GitHub REST emulator. Used by `ichor sim`, `ichor demo`, the tests and
//! the benches. Nothing outside `sim` and the CLI imports it.

pub mod kube;
