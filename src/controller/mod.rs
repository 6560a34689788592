//! `ichor run`: the long-running controller.

pub mod config;
