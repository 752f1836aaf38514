//! Who may reserve, and how fast (pure, host-tested): the admission
//! frontier ([`frontier`]: places admitted at a rate, capped by the
//! inventory), the controller of that rate ([`control`]: the origin's
//! health, pauses, freezes) and abandoned turns ([`turns`]).
//!
//! Invariant of the part: the origin's load is bounded by the frontier's
//! rate, and no decision here depends on anything but its inputs.

pub mod control;
pub mod frontier;
pub mod turns;
