//! Plans, overrides and reloads (through the memory store and the layer), and policies described
//! as data: TOML and JSON files, and the watcher that reloads them.

mod memory_plans;
mod plans_layer;
mod policy_toml;
mod policy_watch;
