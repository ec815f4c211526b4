//! One grant's life: contention, release, extend, expiry, forgery.

use lock_core::Wait;
use std::time::Duration;

use lock_core::{Error, GuardOptions, Lease, Locker, OwnerToken};
use tokio::time::Instant;

use super::{LONG_TTL, expiry_wait, short, within};
use crate::Fixture;

fn assert_lost(result: lock_core::Result<()>, what: &str) {
    match result {
        Err(Error::Lost { .. }) => {}
        other => panic!("{what}: expected a lost error, got {other:?}"),
    }
}

async fn assert_contended(fx: &Fixture, key: &str, what: &str) {
    match fx.locker.try_acquire(key, LONG_TTL).await {
        Err(Error::Contended { .. }) => {}
        other => panic!("{what}: expected contended, got {other:?}"),
    }
}

/// `locker` finds `key` held and, where the backend reports the remaining
/// TTL, by a grant with more than `at_least` left on the server: the server
/// took an extend.
async fn assert_held_for_more_than(locker: &Locker, key: &str, at_least: Duration, what: &str) {
    let reports = locker.capabilities().reports_remaining_ttl;
    match locker.try_acquire(key, LONG_TTL).await {
        Err(Error::Contended {
            remaining: Some(left),
            ..
        }) => assert!(
            left > at_least,
            "{what}: the server kept the first TTL: {left:?} left"
        ),
        Err(Error::Contended {
            remaining: None, ..
        }) => assert!(
            !reports,
            "{what}: the backend claims to report the remaining TTL, and did not"
        ),
        other => panic!("{what}: expected contended, got {other:?}"),
    }
}

/// `try_acquire` on a held key says "contended" at once, with the holder's
/// remaining TTL when the backend claims to report it.
pub async fn try_acquire_on_held_key_is_contended(fx: &Fixture) {
    let key = fx.key("contended");
    let lease = fx
        .locker
        .try_acquire(&key, LONG_TTL)
        .await
        .expect("first grant");
    let started = Instant::now();
    match fx.locker.try_acquire(&key, LONG_TTL).await {
        Err(Error::Contended {
            remaining,
            key: reported,
        }) => {
            assert_eq!(reported, key);
            if fx.locker.capabilities().reports_remaining_ttl {
                let remaining = remaining.expect("the backend claims to report the remaining TTL");
                assert!(
                    remaining > Duration::ZERO && remaining <= LONG_TTL,
                    "remaining TTL {remaining:?}"
                );
            }
        }
        other => panic!("expected contended, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "try_acquire waited on contention"
    );
    fx.locker.release(lease).await.expect("release");
}

/// A held key does not block a different key.
pub async fn keys_are_independent(fx: &Fixture) {
    let a = fx
        .locker
        .try_acquire(&fx.key("independent-a"), LONG_TTL)
        .await
        .expect("grant a");
    let b = fx
        .locker
        .try_acquire(&fx.key("independent-b"), LONG_TTL)
        .await
        .expect("grant b while a is held");
    fx.locker.release(a).await.expect("release a");
    fx.locker.release(b).await.expect("release b");
}

/// After a release the key can be taken again at once, with a higher token.
pub async fn release_then_reacquire(fx: &Fixture) {
    let key = fx.key("reacquire");
    let first = fx
        .locker
        .try_acquire(&key, LONG_TTL)
        .await
        .expect("first grant");
    let first_token = first.fencing_token();
    fx.locker.release(first).await.expect("release");
    let second = fx
        .locker
        .try_acquire(&key, LONG_TTL)
        .await
        .expect("grant right after release");
    assert!(second.fencing_token() > first_token);
    fx.locker.release(second).await.expect("release");
}

/// Releasing a lease whose grant lapsed reports it, and does not delete the
/// grant of the holder that came next.
pub async fn release_of_a_lost_lease_is_reported_and_harmless(fx: &Fixture) {
    let key = fx.key("release-lost");
    let ttl = short(fx);
    let stale = fx.locker.try_acquire(&key, ttl).await.expect("first grant");
    let next = fx
        .locker
        .acquire(&key, LONG_TTL, Wait::at_most(expiry_wait(ttl)))
        .await
        .expect("grant after expiry");
    assert_lost(
        fx.locker.release(stale).await,
        "release of an expired lease",
    );
    assert_contended(fx, &key, "the next holder's grant survives a stale release").await;
    fx.locker
        .release(next)
        .await
        .expect("the next holder releases");
}

/// A lease with the right key but a wrong owner token can do nothing.
pub async fn forged_lease_can_neither_extend_nor_release(fx: &Fixture) {
    let key = fx.key("forged");
    let real = fx.locker.try_acquire(&key, LONG_TTL).await.expect("grant");
    let forge = || {
        Lease::from_parts(
            real.key().clone(),
            OwnerToken::random(),
            real.fencing_token(),
            real.ttl(),
            real.deadline(),
        )
    };
    let mut forged = forge();
    assert_lost(
        fx.locker.extend(&mut forged, LONG_TTL).await,
        "extend with a forged lease",
    );
    assert_lost(
        fx.locker.release(forge()).await,
        "release with a forged lease",
    );
    assert_contended(fx, &key, "the real holder keeps the lock").await;
    fx.locker
        .release(real)
        .await
        .expect("the real holder releases");
}

/// A lease rebuilt from its parts (key, owner token, fencing token), as a
/// tool keeps it across processes, works in another client as in the one
/// that acquired it, where grants outlive their connection: it extends the
/// grant on the server and releases it. Where they do not (PostgreSQL), the
/// grant lives in the first client's connection: the rebuilt lease cannot
/// end it, and the holder keeps the lock.
pub async fn rebuilt_lease_works_in_another_client(fx: &Fixture) {
    let key = fx.key("rebuilt");
    let held = fx.locker.try_acquire(&key, LONG_TTL).await.expect("grant");
    let rebuilt = || {
        Lease::from_parts(
            held.key().clone(),
            held.owner().clone(),
            held.fencing_token(),
            held.ttl(),
            held.deadline(),
        )
    };
    if !fx.other.capabilities().lock_outlives_connection {
        let refused = fx.other.release(rebuilt()).await;
        assert!(
            refused.is_err(),
            "another client released a grant that lives in the holder's connection"
        );
        assert_contended(fx, &key, "the holder keeps its lock").await;
        fx.locker.release(held).await.expect("the holder releases");
        return;
    }
    let mut lease = rebuilt();
    fx.other
        .extend(&mut lease, LONG_TTL * 2)
        .await
        .expect("extend with the rebuilt lease, from another client");
    assert_held_for_more_than(
        &fx.locker,
        &key,
        LONG_TTL,
        "after the rebuilt lease's extend",
    )
    .await;
    fx.other
        .release(lease)
        .await
        .expect("release with the rebuilt lease, from another client");
    let again = fx
        .locker
        .try_acquire(&key, LONG_TTL)
        .await
        .expect("free once the rebuilt lease released it");
    assert_lost(
        fx.locker.release(held).await,
        "the original lease, once the rebuilt one released its grant",
    );
    fx.locker.release(again).await.expect("release");
}

/// Extending moves the deadline forward, by the new TTL, on the client and
/// on the server: another client still finds the lock held well past the
/// first TTL.
pub async fn extend_moves_the_deadline(fx: &Fixture) {
    let key = fx.key("extend");
    let ttl = fx.short_ttl(Duration::from_secs(2));
    let mut lease = fx.locker.try_acquire(&key, ttl).await.expect("grant");
    let before = lease.deadline();
    let longer = ttl * 4;
    fx.locker.extend(&mut lease, longer).await.expect("extend");
    assert!(lease.deadline() > before, "deadline did not move");
    assert!(
        lease.remaining() > ttl,
        "deadline does not reflect the longer TTL: {:?} left",
        lease.remaining()
    );
    assert_eq!(lease.ttl(), longer);
    assert_held_for_more_than(&fx.other, &key, ttl, "after extend").await;
    // Time must pass here: the first TTL runs out on the server, or not.
    tokio::time::sleep(ttl * 2).await;
    match fx.other.try_acquire(&key, LONG_TTL).await {
        Err(Error::Contended { .. }) => {}
        other => panic!("twice the first TTL after extend: expected contended, got {other:?}"),
    }
    fx.locker.release(lease).await.expect("release");
}

/// Once a grant expired and another holder came and went, the backend's
/// extend reports the old lease lost and re-creates nothing.
pub async fn extend_after_expiry_is_lost_and_does_not_resurrect(fx: &Fixture) {
    let key = fx.key("extend-expired");
    let ttl = short(fx);
    let mut stale = fx.locker.try_acquire(&key, ttl).await.expect("grant");
    let next = fx
        .locker
        .acquire(&key, LONG_TTL, Wait::at_most(expiry_wait(ttl)))
        .await
        .expect("grant after expiry");
    fx.locker.release(next).await.expect("release");
    // The Locker refuses without asking once the deadline passed; ask the backend itself too.
    assert_lost(
        fx.locker.extend(&mut stale, ttl).await,
        "Locker::extend after the deadline",
    );
    match fx.locker.backend().extend(&stale, ttl).await {
        Err(Error::Lost { .. }) => {}
        other => panic!("backend extend of an expired grant: expected lost, got {other:?}"),
    }
    let fresh = fx
        .locker
        .try_acquire(&key, ttl)
        .await
        .expect("the key is free: nothing was resurrected");
    fx.locker.release(fresh).await.expect("release");
}

/// A grant removed behind the holder's back cannot be extended, and stays free.
pub async fn extend_after_removal_is_lost(fx: &Fixture) {
    let key = fx.key("extend-removed");
    let mut lease = fx.locker.try_acquire(&key, LONG_TTL).await.expect("grant");
    fx.remove_grant(&lease).await;
    assert_lost(
        fx.locker.extend(&mut lease, LONG_TTL).await,
        "extend after removal",
    );
    let next = within(
        super::SLACK,
        "the removed grant is free",
        fx.locker
            .acquire(&key, LONG_TTL, Wait::at_most(super::SLACK)),
    )
    .await
    .expect("grant after removal");
    fx.locker.release(next).await.expect("release");
}

/// A grant nobody renews lapses after its TTL, and not before the holder's deadline.
pub async fn grant_expires_after_its_ttl(fx: &Fixture) {
    let key = fx.key("expires");
    let ttl = short(fx);
    let first = fx.locker.try_acquire(&key, ttl).await.expect("grant");
    let second = fx
        .locker
        .acquire(&key, LONG_TTL, Wait::at_most(expiry_wait(ttl)))
        .await
        .expect("grant after expiry");
    let granted_at = Instant::now();
    assert!(
        granted_at >= first.deadline(),
        "a second holder got the lock {:?} before the first holder's deadline",
        first.deadline() - granted_at
    );
    fx.locker.release(second).await.expect("release");
    drop(first);
}

/// Closing what the backend keeps idle (connections, leases) leaves a held
/// lock held and extendable, and the next grants work as before.
pub async fn closing_idle_resources_keeps_held_locks(fx: &Fixture) {
    let (held_key, released_key) = (fx.key("close-idle-held"), fx.key("close-idle-released"));
    let mut held = fx
        .locker
        .try_acquire(&held_key, LONG_TTL)
        .await
        .expect("grant the held key");
    let released = fx
        .locker
        .try_acquire(&released_key, LONG_TTL)
        .await
        .expect("grant the released key");
    fx.locker.release(released).await.expect("release");

    fx.locker.close_idle().await;
    assert_contended(fx, &held_key, "still held after closing idle resources").await;
    fx.locker
        .extend(&mut held, LONG_TTL)
        .await
        .expect("extend after closing idle resources");
    let again = fx
        .locker
        .try_acquire(&released_key, LONG_TTL)
        .await
        .expect("a grant after closing idle resources");
    fx.locker.release(again).await.expect("release");
    fx.locker.release(held).await.expect("release the held key");
}

/// With no wait, every entry point reads "busy" the same way: `acquire`,
/// `guard` and `with_lock` on a held key answer [`Error::Contended`], as
/// `try_acquire` does, so skip-if-busy code can test `is_contended()`.
pub async fn busy_reads_as_contended_at_every_entry_point(fx: &Fixture) {
    let key = fx.key("busy");
    let lease = fx
        .locker
        .try_acquire(&key, LONG_TTL)
        .await
        .expect("first grant");
    let acquire = fx
        .other
        .acquire(&key, LONG_TTL, Wait::at_most(Duration::ZERO))
        .await;
    assert!(
        matches!(acquire, Err(Error::Contended { .. })),
        "acquire with no wait: {acquire:?}"
    );
    let guard = fx.other.guard(&key, GuardOptions::new(LONG_TTL)).await;
    assert!(
        matches!(guard, Err(Error::Contended { .. })),
        "guard with no wait: {guard:?}"
    );
    let ran = fx
        .other
        .with_lock(&key, GuardOptions::new(LONG_TTL), |_| async {})
        .await;
    assert!(
        matches!(ran, Err(Error::Contended { .. })),
        "with_lock with no wait: {ran:?}"
    );
    fx.locker.release(lease).await.expect("release");
}
