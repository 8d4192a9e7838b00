//! Exit codes (DESIGN §10), in one place.

/// The tick ran, skipped or halted cleanly; a check found no errors.
pub(crate) const OK: i32 = 0;
/// A yes/no command answered "no" (`can-continue`, `can-edit`, `drift --check`), or
/// `approve` was refused.
pub(crate) const NO: i32 = 1;
/// Usage error: bad flags, an invalid loop name.
pub(crate) const USAGE: i32 = 2;
/// Invalid configuration; diagnostics were printed.
pub(crate) const CONFIG: i32 = 3;
/// State or I/O error; nothing was overwritten.
pub(crate) const STATE: i32 = 4;
/// Interrupted by SIGINT/SIGTERM; the tick advanced nothing.
pub(crate) const INTERRUPTED: i32 = 130;
