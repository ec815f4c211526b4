//! `lockctl hold`: take a lock and keep it, renewed, until told to let go,
//! as `etcdctl lock NAME` does; for an operator who must keep everyone
//! else out while they work by hand.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use lockkit::{GuardOptions, Locker};
use nix::sys::signal::Signal;
use tokio::signal::unix::{Signal as Stream, SignalKind, signal};

use crate::exit;
use crate::printable;

/// The signals that end the hold: the lock is then released.
const LET_GO: [SignalKind; 3] = [
    SignalKind::interrupt(),
    SignalKind::terminate(),
    SignalKind::hangup(),
];

/// Holds `key` until SIGINT, SIGTERM or SIGHUP, then releases it. Prints
/// `KEY<TAB>held<TAB>fencing_token=N` once held.
pub async fn hold(locker: &Locker, key: &str, ttl: Duration, wait: Duration) -> ExitCode {
    let mut streams: Vec<Stream> = Vec::new();
    for kind in LET_GO {
        match signal(kind) {
            Ok(s) => streams.push(s),
            Err(e) => {
                eprintln!("lockctl: cannot handle signal {}: {e}", kind.as_raw_value());
                return ExitCode::from(exit::UNAVAILABLE);
            }
        }
    }
    // Stopped by Ctrl-Z, lockctl would stop renewing and the lock would
    // lapse while the operator believes it held: Ctrl-Z is caught, and the
    // hold goes on.
    if let Err(e) = signal(SignalKind::from_raw(Signal::SIGTSTP as i32)) {
        eprintln!("lockctl: cannot handle {}: {e}", Signal::SIGTSTP);
        return ExitCode::from(exit::UNAVAILABLE);
    }
    let [int, term, hup] = &mut streams[..] else {
        unreachable!("three signals registered above")
    };

    let options = GuardOptions::new(ttl).wait(wait);
    let guard = tokio::select! {
        got = locker.guard(key, options) => match got {
            Ok(guard) => guard,
            Err(e) => return exit::fail(&e),
        },
        // Told to stop while still waiting: nothing is held.
        _ = int.recv() => return ExitCode::from(128 + Signal::SIGINT as u8),
        _ = term.recv() => return ExitCode::from(128 + Signal::SIGTERM as u8),
        _ = hup.recv() => return ExitCode::from(128 + Signal::SIGHUP as u8),
    };
    let mut stdout = std::io::stdout();
    // A reader of a pipe waits for this line: it is flushed at once. If no
    // one reads it any more, the hold goes on; the signals end it.
    let _ = writeln!(
        stdout,
        "{}\theld\tfencing_token={}",
        printable::key(key),
        guard.fencing_token().get()
    );
    let _ = stdout.flush();

    tokio::select! {
        reason = guard.lost() => {
            eprintln!(
                "lockctl: lock `{}` lost while held ({})",
                printable::key(key),
                printable::text(&reason.to_string())
            );
            return ExitCode::from(exit::LOST);
        }
        _ = int.recv() => {}
        _ = term.recv() => {}
        _ = hup.recv() => {}
    }
    match guard.release().await {
        Ok(()) => {
            // The reader may be gone by now; the release is what counts.
            let _ = writeln!(stdout, "{}\treleased", printable::key(key));
            ExitCode::SUCCESS
        }
        Err(e) => exit::fail(&e),
    }
}
