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
