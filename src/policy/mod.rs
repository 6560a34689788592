//! What ichor knows about compatibility (`data`), the checklist it runs over a bump
//! (`checks`), the verdict that collects the results (`verdict`), and the maintainers' view
//! of the data's health (`audit`).

pub mod audit;
pub mod chain;
mod checks;
mod data;
pub mod path;
mod verdict;

pub use checks::{
    etcd_version, evaluate, evaluate_with, extra_kernel_args, installer_images, kube_proxy,
    kubelet_skew, nodes_talos, Context, TrapConfig, TrapNode,
};
pub use data::*;
pub use verdict::{CheckItem, Counts, Outcome, Status, Verdict};
