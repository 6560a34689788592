//! ichor: gate and roll out Talos Linux and Kubernetes upgrades from Git.
//!
//! # Overview
//!
//! A change walks one way through these layers (docs/architecture.md has the walk of one
//! change and the table of rooms):
//!
//! 1. **The core** holds no I/O. [`releaseset`] parses the two documents of a cluster folder
//!    (`release-set.yaml`, `cluster.yaml`) with file:line errors and diffs two revisions into
//!    a `Bump`; [`policy`] judges a bump against the compatibility data (`policies/`) into a
//!    `Verdict` (the checklist); [`plan`] derives the staged rollout, its worker batches and
//!    its estimate; [`health`] holds the user's health checks and judges what was read.
//! 2. **The adapters** are thin, each named after what it talks to: [`git`] (git2: revisions,
//!    fetches, notes, a watched repository), [`forge`] (where verdicts and progress go:
//!    GitHub, git notes; webhooks), [`talos`] (the Talos machine API over gRPC and mTLS),
//!    [`kube`] (the Kubernetes API through kube-rs: inventory, drain, Lease, record),
//!    [`prometheus`] and [`outbound`] (ichor's own HTTP calls).
//! 3. **The engine** composes them: [`gate`] joins a bump with the policies and live facts
//!    into a verdict; [`rollout`] runs the staged plan, every step re-derived from observed
//!    state (`observe → Done | Act | Settling | Failed`, one file per stage).
//! 4. **The loop**, [`controller`]: `ichor run`. Sources (webhooks, polls, a watched
//!    repository) become events; each event goes to the gate or the rollout; reporters
//!    post the results back.
//! 5. **The twin**, [`sim`]: a simulated Talos cluster behind the real Talos and Kubernetes
//!    APIs, and a GitHub emulator, for `ichor demo`, `ichor sim`, the tests and the benches.
//!    Nothing above imports it. [`rehearse`] runs the real engine against it under faults
//!    drawn from a seed, judging the safety rules from the twin's own state.
//! 6. **Shared helpers**: [`clock`] (the one clock: simulated in the twin, so nothing sleeps
//!    on wall time), [`escape`] (every format PR content is printed into), [`secret`]
//!    (values that never print), [`state`] (the private state directory).
//!
//! # Where to start reading
//!
//! - [`gate::review`]: one change judged, from two revisions to a verdict and a plan.
//! - [`rollout::Rollout::run`]: the stages of a merged change, step by step.
//! - [`controller::handle`]: what `ichor run` does with one event.
//! - [`sim::twin::Twin`]: the twin, as `ichor sim` starts it.
//! - `src/main.rs` and `src/cli/`: the commands, each a thin caller of the above.

// The core: pure data and functions.
pub mod health;
pub mod plan;
pub mod policy;
pub mod releaseset;

// The adapters: one per system ichor talks to.
pub mod forge;
pub mod git;
pub mod kube;
pub mod outbound;
pub mod prometheus;
pub mod talos;

// The engine.
pub mod gate;
pub mod rollout;

// The loop.
pub mod controller;

// The twin, and the rehearsal that runs the engine against it.
pub mod rehearse;
pub mod sim;

// Shared helpers.
pub mod clock;
pub mod escape;
pub mod secret;
pub mod state;
