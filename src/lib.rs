//! ichor: gate and roll out Talos Linux and Kubernetes upgrades from Git.
//!
//! The walk of one change: `releaseset` (documents, bump) → `policy` (compatibility data,
//! verdict) → `plan` (staged rollout). `git` reads documents at any revision. `sim` is the
//! twin: a simulated cluster and forge served over the real protocols.

pub mod clock;
pub mod controller;
pub mod escape;
pub mod forge;
pub mod gate;
pub mod git;
pub mod health;
pub mod kube;
pub mod outbound;
pub mod plan;
pub mod policy;
pub mod prometheus;
pub mod releaseset;
pub mod rollout;
pub mod secret;
pub mod sim;
pub mod state;
pub mod talos;
