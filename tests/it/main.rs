//! Integration tests: one binary, one module per area.

mod cli;
mod controller;
mod deploy;
mod etcd_identity;
mod forge_github;
mod gate;
mod github_real;
mod health;
mod kube_transport;
mod lease_fence;
mod listener;
mod live;
mod notes;
mod policies;
mod props;
mod rbac;
mod rehearse;
mod render;
mod renovate;
mod resume_rules;
mod rollout;
mod safety;
mod says;
mod sim_github;
mod sim_hardening;
mod sim_kube;
mod sim_props;
mod sim_talos;
mod sim_twin;
mod sim_wire;
mod talos_client;
mod talos_truth;
mod tools;
mod transport;
mod traps;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The homelab fixture as a real git repository, built once per test run. It lives under
/// cargo's per-target temporary directory and is rebuilt in place each run, so no run
/// leaves a directory behind (a `TempDir` in a `static` is never dropped).
pub fn homelab() -> &'static Path {
    static REPO: OnceLock<PathBuf> = OnceLock::new();
    REPO.get_or_init(|| {
        let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("homelab-fixture");
        if path.exists() {
            std::fs::remove_dir_all(&path).expect("remove the previous fixture");
        }
        ichor::sim::fixture::Fixture::homelab()
            .build(&path)
            .expect("build the homelab fixture");
        path
    })
}

/// Run the ichor binary.
pub fn ichor(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ichor"))
        .args(args)
        // Cluster access comes only from the flags a test passes.
        .env_remove("KUBECONFIG")
        .env_remove("TALOSCONFIG")
        .output()
        .expect("run ichor")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
