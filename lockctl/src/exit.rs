//! Exit codes: one per outcome a script may act on, and the error → code map.
//!
//! The codes are from `sysexits.h` where one fits, so they never collide
//! with a shell's own meanings (1 and 2 for generic and usage failures of
//! many tools, 126/127 for "cannot execute"/"not found", 128+N for "killed
//! by signal N"), which `lockctl run` passes through from the command.

use std::process::ExitCode;

use lockkit::Error;

/// The command line is malformed, or asks a backend for an operation it does
/// not offer (`EX_USAGE`).
pub const USAGE: u8 = 64;
/// The backend could not be reached, or answered with an error (`EX_UNAVAILABLE`).
pub const UNAVAILABLE: u8 = 69;
/// The lock was not acquired within `--wait` (`EX_TEMPFAIL`: try again later).
pub const NOT_ACQUIRED: u8 = 75;
/// The lock was lost while the command ran; the command and every process
/// it started were terminated (`EX_NOPERM`: the permission to run was
/// withdrawn).
pub const LOST: u8 = 77;
/// Configuration or input refused: malformed or missing URL or config file,
/// unknown profile, unmet profile requirements, bad key or TTL, credentials
/// refused (`EX_CONFIG`).
pub const CONFIG: u8 = 78;
/// The command was found but could not be started (as `env` and `timeout` do).
pub const CANNOT_EXECUTE: u8 = 126;
/// The command was not found (as `env` and `timeout` do).
pub const NOT_FOUND: u8 = 127;

/// The table shown at the end of `lockctl --help`.
pub const HELP: &str = "\
Exit codes:
  0        success (run: the command exited 0)
  N        run: the command's own exit code; 128+S if it died of signal S
  1        status: the lock is not held; release: there was nothing to release
  64       command line malformed, or the backend lacks the operation (EX_USAGE)
  69       backend unavailable or failing (EX_UNAVAILABLE)
  75       run: lock not acquired within --wait (EX_TEMPFAIL)
  77       run: lock lost while the command ran; it and what it started were terminated (EX_NOPERM)
  78       configuration or input refused: URL, config file, profile, key, TTL, a --permits
           that disagrees with the key's holders (EX_CONFIG)
  126/127  run: the command could not be executed / was not found

Environment:
  LOCK_URL        backend URL when neither --url nor --profile is given
  LOCKKIT_CONFIG  configuration file for --profile when --config is not given";

/// The exit code for a lockkit error.
pub fn code_for(error: &Error) -> u8 {
    match error {
        Error::Contended { .. } | Error::TimedOut { .. } => NOT_ACQUIRED,
        Error::Lost { .. } => LOST,
        Error::InvalidInput { .. } | Error::Auth { .. } | Error::ModeConflict { .. } => CONFIG,
        Error::Unsupported { .. } => USAGE,
        _ => UNAVAILABLE,
    }
}

/// Prints one line on stderr and returns the error's exit code.
pub fn fail(error: &Error) -> ExitCode {
    // A server's message is its own text, and may hold a key of its own.
    eprintln!("lockctl: {}", crate::printable::text(&error.to_string()));
    ExitCode::from(code_for(error))
}
