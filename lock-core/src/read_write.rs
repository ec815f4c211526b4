//! `ReadWrite`: a key that any number of readers hold at once, or one
//! writer, as the [`Semaphore`](crate::Semaphore) handle is for permits.

use std::future::Future;

use crate::{Error, FencingToken, GuardOptions, LockGuard, Locker, Mode, Result, validate};

/// A read-write lock over a [`Locker`]: cheap to clone, safe to share.
///
/// A read hold is [`Mode::Shared`]; the write hold is the key's exclusive
/// lock ([`Mode::Exclusive`]), so a writer here and a plain lock on the same
/// key exclude each other. A writer that waits for readers to leave makes
/// new readers wait behind it, so a stream of readers cannot starve it.
/// Every hold, read or write, has its own fencing token from the key's
/// counter: a writer's is greater than every earlier reader's and writer's.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lock_core::Result<()> {
/// use std::time::Duration;
/// use lock_core::{GuardOptions, Locker, MemoryBackend};
///
/// let locker = Locker::new(MemoryBackend::new());
/// let config = locker.read_write("config", GuardOptions::new(Duration::from_secs(30)))?;
///
/// let first = config.read().await?;
/// let second = config.read().await?; // readers share the key
/// assert!(config.write().await.unwrap_err().is_contended()); // no writer meanwhile
/// let last_read = second.fencing_token();
/// first.release().await?;
/// second.release().await?;
///
/// let written = config.with_write(|token| async move { token }).await?;
/// assert!(written > last_read);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ReadWrite {
    locker: Locker,
    key: String,
    options: GuardOptions,
}

impl Locker {
    /// The read-write lock named `key`, each hold taken with `options`
    /// (TTL, wait, renewal). The key is checked here, once: an invalid one
    /// is refused with [`Error::InvalidInput`], and a backend without
    /// read-write locks with [`Error::Unsupported`] and its reason, before
    /// any call is made.
    pub fn read_write(&self, key: &str, options: GuardOptions) -> Result<ReadWrite> {
        self.key(key)?;
        validate::mode(Mode::Shared, self.capabilities())?;
        Ok(ReadWrite {
            locker: self.clone(),
            key: key.to_owned(),
            options,
        })
    }
}

impl ReadWrite {
    /// The lock's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The options every hold is taken with.
    pub fn options(&self) -> GuardOptions {
        self.options
    }

    /// Takes a read hold (waiting as the options say) and keeps it renewed
    /// until the guard is released or dropped; see [`LockGuard`]. A key held
    /// by a writer, or with a writer waiting, answers [`Error::Contended`]
    /// (or [`Error::TimedOut`] after a wait).
    pub async fn read(&self) -> Result<LockGuard> {
        self.locker
            .guard_in(&self.key, Mode::Shared, self.options)
            .await
    }

    /// Takes the write hold: the key's exclusive lock, once every reader
    /// has left. While it waits, new readers wait behind it.
    pub async fn write(&self) -> Result<LockGuard> {
        self.locker
            .guard_in(&self.key, Mode::Exclusive, self.options)
            .await
    }

    /// Runs `work` holding a read hold; see [`Locker::with_lock`].
    pub async fn with_read<F, Fut, T>(&self, work: F) -> Result<T>
    where
        F: FnOnce(FencingToken) -> Fut,
        Fut: Future<Output = T>,
    {
        self.locker
            .with_guard(&self.key, Mode::Shared, self.options, work)
            .await
    }

    /// Runs `work` holding the write hold; see [`Locker::with_lock`].
    pub async fn with_write<F, Fut, T>(&self, work: F) -> Result<T>
    where
        F: FnOnce(FencingToken) -> Fut,
        Fut: Future<Output = T>,
    {
        self.locker
            .with_guard(&self.key, Mode::Exclusive, self.options, work)
            .await
    }

    /// Runs fallible `work` holding a read hold; see [`Locker::try_with_lock`].
    pub async fn try_with_read<F, Fut, T, E>(&self, work: F) -> std::result::Result<T, E>
    where
        F: FnOnce(FencingToken) -> Fut,
        Fut: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        self.with_read(work).await?
    }

    /// Runs fallible `work` holding the write hold; see [`Locker::try_with_lock`].
    pub async fn try_with_write<F, Fut, T, E>(&self, work: F) -> std::result::Result<T, E>
    where
        F: FnOnce(FencingToken) -> Fut,
        Fut: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        self.with_write(work).await?
    }
}
