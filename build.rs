//! Compiles our Talos/COSI proto subset with protox (pure Rust, so no protoc is needed) and
//! generates the tonic client and server code from the resulting descriptor set. Also says
//! what `ichor --version` prints besides the version: the commit it was built from and the
//! date of the compatibility data it ships.

const PROTOS: &[&str] = &[
    "common/common.proto",
    "machine/machine.proto",
    "machine/image.proto",
    "machine/lifecycle.proto",
    "resource/config/config.proto",
    "cosi/resource.proto",
    "cosi/state.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Small first buffers per call (src/talos/codec.rs).
        .codec_path("crate::talos::codec::SmallCodec")
        .compile_fds(fds)?;
    println!("cargo:rustc-env=ICHOR_COMMIT={}", commit());
    println!("cargo:rustc-env=ICHOR_POLICIES_DATE={}", policies_date()?);
    Ok(())
}

/// `git rev-parse --short=12 HEAD`; `unknown` outside a git checkout (a crate tarball).
fn commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    // Rebuilt when HEAD or the branch it names moves (a worktree has its own HEAD).
    for path in [
        git(&["rev-parse", "--git-path", "HEAD"]),
        git(&["symbolic-ref", "-q", "HEAD"]).and_then(|r| git(&["rev-parse", "--git-path", &r])),
    ]
    .into_iter()
    .flatten()
    // A packed ref has no file of its own; a missing path would rerun this every build.
    .filter(|p| std::path::Path::new(p).exists())
    {
        println!("cargo:rerun-if-changed={path}");
    }
    git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into())
}

/// The newest `verified: "YYYY-MM-DD"` of the shipped policies: how current the
/// compatibility data the verdicts depend on is.
fn policies_date() -> Result<String, Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=policies");
    let mut newest = String::new();
    for entry in std::fs::read_dir("policies")? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        for line in std::fs::read_to_string(&path)?.lines() {
            let Some(rest) = line.trim_start().strip_prefix("verified:") else {
                continue;
            };
            let date = rest.trim().trim_matches('"');
            let well_formed = date.len() == 10
                && date.chars().enumerate().all(|(i, c)| {
                    if i == 4 || i == 7 {
                        c == '-'
                    } else {
                        c.is_ascii_digit()
                    }
                });
            if well_formed && date > newest.as_str() {
                newest = date.to_string();
            }
        }
    }
    if newest.is_empty() {
        return Err("policies/: no `verified:` date found".into());
    }
    Ok(newest)
}
