//! Exit codes (DESIGN §10), in one place.

/// The tick ran, skipped or halted cleanly; a check found no errors.
pub const OK: i32 = 0;
/// A yes/no command answered "no" (`can-continue`, `can-edit`, `drift --check`), or
/// `approve` was refused.
pub const NO: i32 = 1;
/// Usage error: bad flags, an invalid loop name.
pub const USAGE: i32 = 2;
/// Invalid configuration; diagnostics were printed.
pub const CONFIG: i32 = 3;
/// State or I/O error; nothing was overwritten.
pub const STATE: i32 = 4;
/// Interrupted by SIGINT/SIGTERM; the tick advanced nothing.
pub const INTERRUPTED: i32 = 130;
