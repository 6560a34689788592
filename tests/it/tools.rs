//! The real tools some tests run, found where `scripts/test` puts them, or refused with the
//! step that installs them.
//!
//! One rule for every such test (README.md, "Tests"): it is marked
//! `#[ignore = "needs <tool>: scripts/test installs it"]`, so plain `cargo test` reports it as
//! ignored, never as passed; README's test command, `scripts/test`, installs what is missing
//! and runs it with `--include-ignored`. Run without its tool, it fails naming the install
//! step. No test passes by skipping.

use std::path::{Path, PathBuf};

/// A program a test runs: where to look, and how to get it.
pub struct Tool {
    name: &'static str,
    /// An environment variable naming the program's path, which wins over `PATH`.
    env: Option<&'static str>,
    /// Directories searched after `PATH` (sshd lives in /usr/sbin, off a user's PATH).
    also_in: &'static [&'static str],
    /// How to install it by hand, besides `scripts/test`.
    install: &'static str,
}

/// kubectl 1.32 or newer (the twin's tests read its current output formats).
pub const KUBECTL: Tool = Tool {
    name: "kubectl",
    env: Some("ICHOR_KUBECTL"),
    also_in: &[],
    install: "scripts/install-kubectl prints a directory holding kubectl 1.33 to put on PATH",
};

pub const PROMETHEUS: Tool = Tool {
    name: "prometheus",
    env: Some("ICHOR_PROMETHEUS"),
    also_in: &[],
    install: "apt-get install prometheus",
};

/// Alertmanager, as Debian packages it (its binary is `prometheus-alertmanager`).
pub const ALERTMANAGER: Tool = Tool {
    name: "prometheus-alertmanager",
    env: Some("ICHOR_ALERTMANAGER"),
    also_in: &[],
    install: "apt-get install prometheus-alertmanager",
};

pub const SSHD: Tool = Tool {
    name: "sshd",
    env: None,
    also_in: &["/usr/sbin"],
    install: "apt-get install openssh-server",
};

pub const SSH_KEYGEN: Tool = Tool {
    name: "ssh-keygen",
    env: None,
    also_in: &[],
    install: "apt-get install openssh-client",
};

pub const OPENSSL: Tool = Tool {
    name: "openssl",
    env: None,
    also_in: &[],
    install: "apt-get install openssl",
};

/// mermaid-cli 11 (`mmdc`), which `scripts/install-mermaid` installs from npm.
pub const MMDC: Tool = Tool {
    name: "mmdc",
    env: Some("ICHOR_MMDC"),
    also_in: &[],
    install: "scripts/install-mermaid prints its path",
};

pub const CHROMIUM: Tool = Tool {
    name: "chromium",
    env: Some("ICHOR_CHROMIUM"),
    also_in: &[],
    install: "apt-get install chromium",
};

/// Renovate 44 on Node 24, which `scripts/install-renovate` installs from npm.
pub const RENOVATE: Tool = Tool {
    name: "renovate",
    env: Some("ICHOR_RENOVATE"),
    also_in: &[],
    install: "scripts/install-renovate prints its path",
};

impl Tool {
    /// The program's path; a missing program fails the test with how to get it.
    pub fn path(&self) -> PathBuf {
        self.find().unwrap_or_else(|| {
            panic!(
                "{} is not installed, and this test runs it. README's test command, \
                 scripts/test, installs what the tests need; by hand: {}{}",
                self.name,
                self.install,
                self.env
                    .map(|v| format!(" (or set {v} to its path)"))
                    .unwrap_or_default()
            )
        })
    }

    fn find(&self) -> Option<PathBuf> {
        if let Some(var) = self.env {
            if let Some(p) = std::env::var_os(var).filter(|v| !v.is_empty()) {
                let p = PathBuf::from(p);
                assert!(p.is_file(), "{var}={} is not a file", p.display());
                return Some(p);
            }
        }
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path)
            .chain(self.also_in.iter().map(PathBuf::from))
            .map(|dir| dir.join(self.name))
            .find(|p| is_executable(p))
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
