//! Integration tests: one binary, one module per area.

mod cli;
mod props;
mod sim_github;
mod sim_hardening;
mod sim_kube;
mod sim_props;
mod sim_talos;
mod sim_twin;
mod sim_wire;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The homelab fixture as a real git repository, built once per test run.
pub fn homelab() -> &'static Path {
    static REPO: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, path) = REPO.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("homelab");
        ichor::sim::fixture::Fixture::homelab()
            .build(&path)
            .expect("build the homelab fixture");
        (dir, path)
    });
    path
}

/// Run the ichor binary.
pub fn ichor(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ichor"))
        .args(args)
        .output()
        .expect("run ichor")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
