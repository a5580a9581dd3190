//! Shaping: a request that does not fit a shaped limit now waits for its turn, up to a
//! `max_wait`, instead of being refused (user-facing docs on [`Shape`]).
//!
//! - [`shape`]: the options ([`Shape`]), the delay a request reports ([`ShapedDelay`]), and a
//!   limit's shaping compiled against its quota (the store decides it at a widened burst);
//! - [`schedules`]: the places waiting requests hold per schedule (limit and key);
//! - [`waiting`]: the layer's bound on waiting requests, and a waiting request's reservation.

mod schedules;
mod shape;
mod waiting;

pub(crate) use schedules::Deciding;
pub(crate) use shape::{compile, CompiledShape};
pub use shape::{Shape, ShapedDelay, DEFAULT_MAX_WAITING};
pub(crate) use waiting::{reserve, Reservation, Waiting};
