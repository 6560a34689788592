//! A private state directory: `ichor run`'s `stateDir` (its mirror of the repository) and
//! the twin's (the kubeconfig, talosconfig and GitHub token it writes, each holding a key or
//! a bearer token, and the GitHub emulator's private clone).
//!
//! Rules, so that nobody else can read the secrets or make ichor write them elsewhere:
//! - A directory ichor creates is mode 0700 whatever the umask (parents included).
//! - An existing state directory must be a real directory (not a symbolic link) owned by
//!   the current user and not writable by everyone (nor sticky, as `/tmp` is); ichor then
//!   tightens it to 0700 (a group-writable one too: umask 002 makes those). Anything else is
//!   refused with the reason: a shared directory may already hold files or links planted by
//!   someone else, and must not be taken over.
//! - A secret is written to a new file (created exclusively, mode 0600) in the same
//!   directory and renamed over the old one, so an existing 0644 file does not keep its
//!   mode and a reader never sees half a file. A symbolic link at the secret's path is
//!   refused and its target left alone.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{0}: is a symbolic link; ichor keeps its state here and does not follow links (pass the real path)")]
    Symlink(PathBuf),
    #[error("{0}: exists and is not a directory")]
    NotADirectory(PathBuf),
    #[error("{path}: is owned by uid {owner}, not by the current user (uid {me}); pick a state directory of your own")]
    NotOwned { path: PathBuf, owner: u32, me: u32 },
    #[error("{path}: is a shared directory (mode {mode:04o}: writable by everyone, or sticky as /tmp is); ichor will not keep its state there — use a private directory, e.g. a new one inside it")]
    Writable { path: PathBuf, mode: u32 },
    #[error("{path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("no default state directory: neither XDG_STATE_HOME nor HOME is set to an absolute path; pass --state-dir DIR")]
    NoHome,
    #[error("cluster name {0:?} cannot name a state directory (expected letters, digits, `-`, `_` or `.`); pass --state-dir DIR")]
    ClusterName(String),
}

fn io(path: &Path, what: &'static str) -> impl FnOnce(std::io::Error) -> StateError {
    let path = path.to_path_buf();
    move |source| StateError::Io { path, what, source }
}

#[cfg(unix)]
fn current_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Creates `dir` (and missing parents) with mode 0700, or checks and tightens an existing
/// one (see the module rules).
pub fn prepare_dir(dir: &Path) -> Result<(), StateError> {
    match std::fs::symlink_metadata(dir) {
        Ok(meta) => check_existing(dir, &meta),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => create_private(dir),
        Err(e) => Err(io(dir, "cannot inspect")(e)),
    }
}

fn check_existing(dir: &Path, meta: &std::fs::Metadata) -> Result<(), StateError> {
    if meta.file_type().is_symlink() {
        return Err(StateError::Symlink(dir.to_path_buf()));
    }
    if !meta.is_dir() {
        return Err(StateError::NotADirectory(dir.to_path_buf()));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let me = current_uid();
        if meta.uid() != me {
            return Err(StateError::NotOwned {
                path: dir.to_path_buf(),
                owner: meta.uid(),
                me,
            });
        }
        let mode = meta.mode() & 0o7777;
        // World-writable (or sticky, as /tmp is) means shared with everyone: never take it
        // over. Group-writable is what umask 002 gives one's own directories: tighten it.
        if mode & 0o1002 != 0 {
            return Err(StateError::Writable {
                path: dir.to_path_buf(),
                mode,
            });
        }
        if mode != 0o700 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(io(dir, "cannot set mode 0700"))?;
        }
    }
    Ok(())
}

fn create_private(dir: &Path) -> Result<(), StateError> {
    // Missing parents first (each 0700 too), so no directory of ours is ever wider.
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        if std::fs::symlink_metadata(parent).is_err() {
            create_private(parent)?;
        }
    }
    let mut builder = std::fs::DirBuilder::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    match builder.create(dir) {
        Ok(()) => {}
        // Someone (another process) made it meanwhile: judge it like any existing one.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let meta = std::fs::symlink_metadata(dir).map_err(io(dir, "cannot inspect"))?;
            return check_existing(dir, &meta);
        }
        Err(e) => return Err(io(dir, "cannot create")(e)),
    }
    #[cfg(unix)]
    {
        // The umask may have removed bits ichor needs (e.g. 0277); set exactly 0700.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io(dir, "cannot set mode 0700"))?;
    }
    Ok(())
}

/// Writes a file readable by its owner only (mode 0600): a new file in the same directory,
/// renamed over `path`. Refuses a symbolic link at `path` or as its directory.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), StateError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| StateError::NotADirectory(path.to_path_buf()))?;
    let dir_meta = std::fs::symlink_metadata(dir).map_err(io(dir, "cannot inspect"))?;
    if dir_meta.file_type().is_symlink() {
        return Err(StateError::Symlink(dir.to_path_buf()));
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => return Err(StateError::Symlink(path.to_path_buf())),
        Ok(m) if m.is_dir() => {
            return Err(StateError::Io {
                path: path.to_path_buf(),
                what: "cannot replace",
                source: std::io::Error::other("it is a directory"),
            })
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(path, "cannot inspect")(e)),
    }
    let mut tmp_name = OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}.tmp", hex::encode(rand::random::<[u8; 6]>())));
    let tmp = dir.join(tmp_name);
    let written = write_new(&tmp, bytes).and_then(|()| {
        std::fs::rename(&tmp, path).map_err(|source| StateError::Io {
            path: path.to_path_buf(),
            what: "cannot move the new file into place",
            source,
        })
    });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Reads a file ichor wrote with [`write_private`]: `None` when it does not exist. A symbolic
/// link, or a file over `max` bytes, is refused (never followed, never loaded).
pub fn read_private(path: &Path, max: u64) -> Result<Option<Vec<u8>>, StateError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Err(StateError::Symlink(path.to_path_buf())),
        Ok(m) if !m.is_file() => Err(StateError::Io {
            path: path.to_path_buf(),
            what: "cannot read",
            source: std::io::Error::other("not a regular file"),
        }),
        Ok(m) if m.len() > max => Err(StateError::Io {
            path: path.to_path_buf(),
            what: "cannot read",
            source: std::io::Error::other(format!("{} bytes; ichor wrote at most {max}", m.len())),
        }),
        Ok(_) => std::fs::read(path)
            .map(Some)
            .map_err(io(path, "cannot read")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(path, "cannot inspect")(e)),
    }
}

/// Creates `path`, which must not exist, with mode 0600, and writes `bytes` to disk.
fn write_new(path: &Path, bytes: &[u8]) -> Result<(), StateError> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(path).map_err(io(path, "cannot create"))?;
    #[cfg(unix)]
    {
        // Exactly 0600 whatever the umask took away, so the owner can rewrite it later.
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(io(path, "cannot set mode 0600"))?;
    }
    f.write_all(bytes).map_err(io(path, "cannot write"))?;
    f.sync_all().map_err(io(path, "cannot write"))
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p)
            .map(|m| m.permissions().mode() & 0o7777)
            .unwrap_or(0)
    }

    #[test]
    fn an_existing_world_readable_secret_ends_0600() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, "old")?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
        write_private(&path, b"token")?;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(std::fs::read_to_string(&path)?, "token");
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(dir.path())?.count(), 1);
        Ok(())
    }

    #[test]
    fn a_symlink_at_the_secret_path_is_refused_and_its_target_untouched(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "precious")?;
        let link = dir.path().join("talosconfig");
        std::os::unix::fs::symlink(&target, &link)?;
        let e = write_private(&link, b"key")
            .err()
            .ok_or("a symlink was written through")?;
        assert!(matches!(e, StateError::Symlink(_)), "{e}");
        assert_eq!(std::fs::read_to_string(&target)?, "precious");
        // A symlinked directory is refused too.
        let real = dir.path().join("real");
        std::fs::create_dir(&real)?;
        let linked = dir.path().join("linked");
        std::os::unix::fs::symlink(&real, &linked)?;
        assert!(matches!(
            write_private(&linked.join("kubeconfig"), b"x"),
            Err(StateError::Symlink(_))
        ));
        assert!(matches!(prepare_dir(&linked), Err(StateError::Symlink(_))));
        assert_eq!(std::fs::read_dir(&real)?.count(), 0);
        Ok(())
    }

    #[test]
    fn directories_are_0700_and_writable_existing_ones_refused(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let state = dir.path().join("a/b/state");
        prepare_dir(&state)?;
        assert_eq!(mode(&state), 0o700);
        assert_eq!(mode(&dir.path().join("a")), 0o700);
        // An existing one of ours is tightened, group-writable (umask 002) too.
        for m in [0o755, 0o775] {
            std::fs::set_permissions(&state, std::fs::Permissions::from_mode(m))?;
            prepare_dir(&state)?;
            assert_eq!(mode(&state), 0o700);
        }
        // A world-writable or sticky one (a shared directory) is refused and left alone.
        for m in [0o777, 0o1777, 0o1700] {
            std::fs::set_permissions(&state, std::fs::Permissions::from_mode(m))?;
            assert!(matches!(
                prepare_dir(&state),
                Err(StateError::Writable { .. })
            ));
            assert_eq!(mode(&state), m);
        }
        Ok(())
    }
}
