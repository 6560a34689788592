//! Secrets (tokens, keys, the webhook secret): read from a file or the environment, held
//! in a type that never prints its value, so a `{:?}` in a log line or an error cannot leak
//! one. Files are read without following a link out of their own folder: Kubernetes mounts
//! a Secret as links into a hidden sibling folder (`..data/`), which stays allowed, while a
//! link to `/etc/shadow` or another tenant's mount is refused.

use std::fmt;
use std::path::{Path, PathBuf};

/// The largest secret ichor reads (a PEM private key is a few KiB).
pub const MAX_SECRET_BYTES: u64 = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("cannot read the secret file {path}: {message}")]
    Read { path: PathBuf, message: String },
    #[error("the secret file {path} resolves to {target}, outside its own folder; ichor follows a link only within the folder (as Kubernetes mounts Secrets)")]
    LinkOutside { path: PathBuf, target: PathBuf },
    #[error("the secret file {path} is {size} bytes; ichor reads secrets of at most {MAX_SECRET_BYTES} bytes")]
    TooLarge { path: PathBuf, size: u64 },
    #[error("the secret file {path} is empty")]
    EmptyFile { path: PathBuf },
    #[error("the environment variable {name} is not set or empty")]
    MissingEnv { name: String },
}

/// A secret value. `Debug` and `Display` print `[redacted]`; [`Secret::expose`] is the
/// one way to the bytes, so every use is easy to find.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The file's content without its trailing newline.
    pub fn from_file(path: &Path) -> Result<Secret, SecretError> {
        let read = |message: String| SecretError::Read {
            path: path.to_path_buf(),
            message,
        };
        let target = std::fs::canonicalize(path).map_err(|e| read(e.to_string()))?;
        let folder = path
            .parent()
            .map(|p| {
                if p.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    p
                }
            })
            .and_then(|p| std::fs::canonicalize(p).ok())
            .ok_or_else(|| read("its folder cannot be resolved".to_string()))?;
        if !target.starts_with(&folder) {
            return Err(SecretError::LinkOutside {
                path: path.to_path_buf(),
                target,
            });
        }
        let meta = std::fs::metadata(&target).map_err(|e| read(e.to_string()))?;
        if !meta.is_file() {
            return Err(read("not a regular file".to_string()));
        }
        if meta.len() > MAX_SECRET_BYTES {
            return Err(SecretError::TooLarge {
                path: path.to_path_buf(),
                size: meta.len(),
            });
        }
        let text = std::fs::read_to_string(&target).map_err(|e| read(e.to_string()))?;
        let value = text.trim_end_matches(['\n', '\r']);
        if value.trim().is_empty() {
            return Err(SecretError::EmptyFile {
                path: path.to_path_buf(),
            });
        }
        Ok(Secret(value.to_string()))
    }

    pub fn from_env(name: &str) -> Result<Secret, SecretError> {
        match std::env::var(name) {
            Ok(v) if !v.trim().is_empty() => Ok(Secret(v)),
            _ => Err(SecretError::MissingEnv {
                name: name.to_string(),
            }),
        }
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_prints_its_value() {
        let s = Secret::new("ghp_verysecret");
        assert!(!format!("{s:?} {s}").contains("verysecret"));
        assert_eq!(s.expose(), "ghp_verysecret");
    }

    #[test]
    fn reads_a_file_and_a_link_within_its_folder_but_not_outside() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("..data");
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("token"), "abc\n").unwrap();
        let mount = dir.path().join("token");
        std::os::unix::fs::symlink("..data/token", &mount).unwrap();
        assert_eq!(Secret::from_file(&mount).unwrap().expose(), "abc");

        let other = tempfile::tempdir().unwrap();
        std::fs::write(other.path().join("shadow"), "root:x").unwrap();
        let link = dir.path().join("evil");
        std::os::unix::fs::symlink(other.path().join("shadow"), &link).unwrap();
        assert!(matches!(
            Secret::from_file(&link),
            Err(SecretError::LinkOutside { .. })
        ));

        std::fs::write(dir.path().join("empty"), "\n").unwrap();
        assert!(matches!(
            Secret::from_file(&dir.path().join("empty")),
            Err(SecretError::EmptyFile { .. })
        ));
    }
}
