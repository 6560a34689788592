//! Talking to a remote repository with git2: credentials for its https and ssh transports
//! and fetching what changed into a local mirror.

use std::path::PathBuf;

use crate::secret::Secret;

/// How ichor authenticates to a remote.
#[derive(Clone, Debug)]
pub enum Credentials {
    /// A public remote, a local path or `file://`.
    None,
    /// https with a token as the password (GitHub: user `x-access-token`).
    Token { user: String, token: Secret },
    /// ssh with a private key file (user usually `git`).
    SshKey {
        user: String,
        private_key: PathBuf,
        passphrase: Option<Secret>,
    },
}
// STUB below (replaced by the transport branch)
use super::GitError;
#[derive(Clone, Debug)] pub struct Remote { pub url: String, pub credentials: Credentials, pub known_hosts: Option<PathBuf> }
pub struct RefMove { pub name: String, pub old: Option<git2::Oid>, pub new: Option<git2::Oid> }
pub struct Mirror { }
impl Mirror {
    pub fn open(_dir: &std::path::Path) -> Result<Mirror, GitError> { Ok(Mirror {}) }
    pub fn fetch(&self, _remote: &Remote, _refspecs: &[&str]) -> Result<Vec<RefMove>, GitError> { Ok(vec![]) }
    pub fn fetch_all(&self, _remote: &Remote) -> Result<Vec<RefMove>, GitError> { Ok(vec![]) }
}
pub fn callbacks(_remote: &Remote) -> git2::RemoteCallbacks<'static> { git2::RemoteCallbacks::new() }
