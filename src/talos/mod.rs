//! The Talos machine API. For now only the generated protocol code; ichor's own client
//! (mTLS from a talosconfig) comes later.

pub mod proto;
