//! Locks for synchronous code (a CLI, a migration tool, a build script):
//! the same locks as the async API, behind calls that block. Each
//! [`Locker`] runs a small tokio runtime of its own (one worker thread),
//! which keeps guards renewed while the caller's thread does its work, as
//! `reqwest::blocking` does.
//!
//! ```
//! use std::time::Duration;
//! use lockkit::GuardOptions;
//!
//! let locker = lockkit::blocking::connect("memory://")?;
//! let report = locker.with_lock("nightly-report", GuardOptions::new(Duration::from_secs(30)), |token| {
//!     format!("written under token {token}")
//! })?;
//! assert_eq!(report, "written under token 1");
//! # Ok::<(), lockkit::Error>(())
//! ```
//!
//! Call it from synchronous code only: from inside an async runtime, each
//! call returns an [`Error::InvalidInput`] saying to use the async API
//! (blocking there would stall the runtime's thread).

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Runtime;

use crate::{Error, FencingToken, GuardOptions, HeldLock, LockKey, Result};

/// The runtime behind blocking calls; shut down without waiting when the
/// last handle goes, wherever that happens.
struct Engine(Option<Runtime>);

impl Engine {
    fn run<F: Future>(&self, fut: F) -> Result<F::Output> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(Error::invalid(
                "runtime",
                "lockkit::blocking called from inside an async runtime, where blocking stalls \
                 the runtime's thread; use the async API (lockkit::connect) there",
            ));
        }
        let runtime = self.0.as_ref().expect("present until dropped");
        Ok(runtime.block_on(fut))
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            // Dropping a runtime inside another one panics; this never does.
            runtime.shutdown_background();
        }
    }
}

/// Connects to the backend the URL names, as [`crate::connect`] does.
pub fn connect(url: &str) -> Result<Locker> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("lockkit-blocking")
        .enable_all()
        .build()
        .map_err(|e| Error::Backend {
            backend: "blocking",
            message: "cannot start the runtime behind blocking calls".into(),
            source: Some(Box::new(e)),
        })?;
    let engine = Arc::new(Engine(Some(runtime)));
    let inner = engine.run(crate::connect(url))??;
    Ok(Locker { inner, engine })
}

/// A [`crate::Locker`] whose calls block.
#[derive(Clone)]
pub struct Locker {
    inner: crate::Locker,
    engine: Arc<Engine>,
}

impl std::fmt::Debug for Locker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("blocking::Locker")
            .field("inner", &self.inner)
            .finish()
    }
}

impl Locker {
    /// What the backend guarantees.
    pub fn capabilities(&self) -> &crate::Capabilities {
        self.inner.capabilities()
    }

    /// Takes `key` (waiting up to `options.wait`) and keeps it renewed in
    /// the background until the guard is released or dropped.
    pub fn guard(&self, key: &str, options: GuardOptions) -> Result<LockGuard> {
        let inner = self.engine.run(self.inner.guard(key, options))??;
        Ok(LockGuard {
            inner: Some(inner),
            engine: self.engine.clone(),
        })
    }

    /// Takes `key` in `mode` (one permit of a semaphore:
    /// `Mode::semaphore(n)`), as [`crate::Locker::guard_in`] does, and keeps
    /// it renewed in the background until the guard is released or dropped.
    pub fn guard_in(
        &self,
        key: &str,
        mode: crate::Mode,
        options: GuardOptions,
    ) -> Result<LockGuard> {
        let inner = self.engine.run(self.inner.guard_in(key, mode, options))??;
        Ok(LockGuard {
            inner: Some(inner),
            engine: self.engine.clone(),
        })
    }

    /// Runs `work` on this thread while holding `key`, then releases it.
    /// `work` cannot be interrupted: if the lock was lost before it
    /// finished, its output is dropped and [`Error::Lost`] returned, so
    /// that nothing done after the loss is taken as done under the lock.
    pub fn with_lock<T>(
        &self,
        key: &str,
        options: GuardOptions,
        work: impl FnOnce(FencingToken) -> T,
    ) -> Result<T> {
        let guard = self.guard(key, options)?;
        let output = work(guard.fencing_token());
        if let Some(reason) = guard.lost_reason() {
            return Err(Error::lost(key, reason));
        }
        guard.release()?;
        Ok(output)
    }

    /// The locks held under `prefix`, as [`crate::Locker::inspect`].
    pub fn inspect(&self, prefix: &str) -> Result<Vec<HeldLock>> {
        self.engine.run(self.inner.inspect(prefix))?
    }
}

/// A held lock, renewed in the background; dropping it releases it.
#[derive(Debug)]
pub struct LockGuard {
    // `None` only once released.
    inner: Option<crate::LockGuard>,
    engine: Arc<Engine>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Engine")
    }
}

impl LockGuard {
    fn guard(&self) -> &crate::LockGuard {
        self.inner.as_ref().expect("present until released")
    }

    /// The lock's key.
    pub fn key(&self) -> &LockKey {
        self.guard().key()
    }

    /// The grant's fencing token: pass it with every write to the resource.
    pub fn fencing_token(&self) -> FencingToken {
        self.guard().fencing_token()
    }

    /// How long the lock is certainly held from now, unless renewed.
    pub fn remaining(&self) -> Duration {
        self.guard().remaining()
    }

    /// Whether the lock is held, as far as this process can tell.
    pub fn is_held(&self) -> bool {
        self.guard().is_held()
    }

    /// Why the lock was lost, if it was.
    pub fn lost_reason(&self) -> Option<crate::LostReason> {
        self.guard().lost_reason()
    }

    /// Releases the lock now and reports the outcome.
    pub fn release(mut self) -> Result<()> {
        let inner = self.inner.take().expect("present until released");
        self.engine.run(inner.release())?
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        // Dropped inside the runtime's context, so that its background
        // release can be spawned there.
        if let Some(inner) = self.inner.take()
            && let Some(runtime) = &self.engine.0
        {
            let _entered = runtime.enter();
            drop(inner);
        }
    }
}
