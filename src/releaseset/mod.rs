//! The release set (what versions a cluster should run), the cluster document (how to reach
//! and roll it), and the bump between two release sets.

mod bump;
mod document;
mod duration;
pub(crate) mod scalar;
mod version;
pub mod yaml;

pub use bump::{Bump, Change, ChangeKind, ComponentId};
pub use document::*;
pub use duration::HumanDuration;
pub use version::{excerpt, MinorVersion, Version, VersionError, MAX_VERSION_NUMBER};

pub use scalar::{deserialize as deserialize_scalar, FromScalar as FromScalarText};
