//! What ichor knows about compatibility (`data`), the checklist it runs over a bump
//! (`checks`), and the verdict that collects the results (`verdict`).

mod checks;
mod data;
mod verdict;

pub use checks::evaluate;
pub use data::*;
pub use verdict::{CheckItem, Counts, Outcome, Status, Verdict};
