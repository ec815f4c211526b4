//! What a backend's test file supplies: a locker, a sabotage, a key prefix.

use std::time::Duration;

use async_trait::async_trait;
use lock_core::{Lease, Locker};

/// Removes a grant behind its holder's back, the way an operator or a fault
/// would: `DEL` for Redis, deleting the queue entry or revoking the lease
/// for etcd, `pg_terminate_backend` for PostgreSQL, a scripted fault for
/// the memory backend.
#[async_trait]
pub trait Sabotage: Send + Sync {
    /// Makes the backend forget `lease`'s grant. The holder is not told.
    async fn remove_grant(&self, lease_key: &str);
}

/// The usual sabotage: the operator's force release
/// ([`Locker::force_release`]), through a locker of its own so that a case's
/// connection budget never blocks it. Each backend implements it its own
/// way (`DEL`, deleting the etcd entry, `pg_terminate_backend`, a scripted
/// fault).
pub struct ForceRelease(pub Locker);

#[async_trait]
impl Sabotage for ForceRelease {
    async fn remove_grant(&self, lease_key: &str) {
        let removed = self
            .0
            .force_release(lease_key)
            .await
            .expect("force release");
        assert!(removed, "no grant on {lease_key} to remove");
    }
}

/// One backend under test.
pub struct Fixture {
    /// The locker over the backend.
    pub locker: Locker,
    /// A second, independent client of the same servers (its own
    /// connections; for the memory backend, a second handle on the same
    /// lock space): what one client grants, the other must see.
    pub other: Locker,
    /// How to remove a grant behind its holder's back.
    pub sabotage: Box<dyn Sabotage>,
    prefix: String,
    /// The backend's URL, for a waiter in a process of its own.
    url: Option<String>,
    waiter_binary: Option<String>,
}

impl Fixture {
    /// A fixture whose keys all start with a fresh random prefix, so runs
    /// and cases never collide on a shared server.
    pub fn new(locker: Locker, other: Locker, sabotage: impl Sabotage + 'static) -> Self {
        let random = getrandom::u64().expect("the operating system's random source is unavailable");
        Fixture {
            locker,
            other,
            sabotage: Box::new(sabotage),
            prefix: format!("conformance-{random:016x}/"),
            url: None,
            waiter_binary: None,
        }
    }

    /// The URL the lockers connect to: cases that need a waiter in a
    /// process of its own (one they kill) run only with it.
    pub fn with_url(mut self, url: &str) -> Self {
        self.url = Some(url.to_owned());
        self
    }

    /// Where the `conformance-waiter` binary is (set by the suite's macro).
    pub fn with_waiter_binary(mut self, path: &str) -> Self {
        self.waiter_binary = Some(path.to_owned());
        self
    }

    /// The command that starts a waiter for `key` in a process of its own,
    /// when the fixture has a URL.
    pub(crate) fn waiter_process(&self, key: &str) -> Option<std::process::Command> {
        let (url, binary) = (self.url.as_ref()?, self.waiter_binary.as_ref()?);
        let mut command = std::process::Command::new(binary);
        command.arg(url).arg(key);
        Some(command)
    }

    /// A key unique to this run.
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// A TTL the backend accepts that is short enough to wait out in a test:
    /// `wanted`, raised to the backend's minimum and rounded up to its granularity.
    pub fn short_ttl(&self, wanted: Duration) -> Duration {
        let limits = &self.locker.capabilities().limits;
        let ttl = wanted.max(limits.min_ttl);
        let grain = limits.ttl_granularity.as_nanos().max(1);
        let rounded = ttl.as_nanos().div_ceil(grain) * grain;
        Duration::from_nanos(rounded as u64)
    }

    /// Removes the grant of `lease` behind its back.
    pub async fn remove_grant(&self, lease: &Lease) {
        self.sabotage.remove_grant(lease.key().as_str()).await;
    }
}

/// `name` followed by a random suffix: a key (or key prefix) no other run
/// or test on a shared server uses.
pub fn unique_key(name: &str) -> String {
    let random = getrandom::u64().expect("the operating system's random source is unavailable");
    format!("{name}-{random:016x}")
}

/// The URL of a test server from the environment variable `var` (written by
/// `scripts/servers.sh`). When it is unset: a panic if
/// `LOCKKIT_REQUIRE_SERVERS=1` (a missing server fails CI), otherwise `None`
/// and a note on stderr (the case is skipped).
pub fn server_url(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("LOCKKIT_REQUIRE_SERVERS").as_deref() == Ok("1") => {
            panic!(
                "{var} is not set but LOCKKIT_REQUIRE_SERVERS=1: start the servers with `scripts/servers.sh up`"
            )
        }
        _ => {
            eprintln!(
                "skipped: {var} is not set (run `scripts/servers.sh up` and source its urls.env)"
            );
            None
        }
    }
}
