//! The twin's state directory: where it lives by default. The rules for it (and for
//! `ichor run`'s `stateDir`) are [`crate::state`]'s.

use std::ffi::OsString;
use std::path::PathBuf;

pub use crate::state::{prepare_dir, write_private, StateError};

/// The per-user default: `$XDG_STATE_HOME/ichor/sim/<cluster>`, else
/// `$HOME/.local/state/ichor/sim/<cluster>`. `env` reads a variable (`std::env::var_os`
/// outside tests). Relative values are ignored, as the XDG base directory spec says.
pub fn default_dir(
    cluster: &str,
    env: impl Fn(&str) -> Option<OsString>,
) -> Result<PathBuf, StateError> {
    let safe = !cluster.is_empty()
        && cluster.len() <= 253
        && !cluster.starts_with('.')
        && cluster
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if !safe {
        return Err(StateError::ClusterName(cluster.to_string()));
    }
    let absolute = |name: &str| env(name).map(PathBuf::from).filter(|p| p.is_absolute());
    let base = match (absolute("XDG_STATE_HOME"), absolute("HOME")) {
        (Some(state), _) => state,
        (None, Some(home)) => home.join(".local").join("state"),
        (None, None) => return Err(StateError::NoHome),
    };
    Ok(base.join("ichor").join("sim").join(cluster))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_lives_outside_the_working_tree() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        assert_eq!(
            default_dir("homelab", env(&[("XDG_STATE_HOME", "/s"), ("HOME", "/h")])).ok(),
            Some(PathBuf::from("/s/ichor/sim/homelab"))
        );
        assert_eq!(
            default_dir("homelab", env(&[("XDG_STATE_HOME", "rel"), ("HOME", "/h")])).ok(),
            Some(PathBuf::from("/h/.local/state/ichor/sim/homelab"))
        );
        assert!(matches!(
            default_dir("homelab", env(&[])),
            Err(StateError::NoHome)
        ));
        for bad in ["", "..", "../x", "a/b", ".hidden"] {
            assert!(matches!(
                default_dir(bad, env(&[("HOME", "/h")])),
                Err(StateError::ClusterName(_))
            ));
        }
    }
}
