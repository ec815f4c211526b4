//! The operator's tools: the view of held locks and the force release.
//! Both are optional in the contract; a backend that offers one must keep
//! its promises.

use lock_core::{Error, HeldLock, Lease};

use super::LONG_TTL;
use crate::Fixture;

/// `inspect` lists exactly the locks held under a prefix, sorted by key,
/// each with no more than its TTL left and, when it shows a token, its
/// holder's. `force_release` frees a held key at once (`true`), answers
/// `false` for a free one, and leaves the other keys held.
pub async fn operator_view_and_force_release_keep_their_promises(fx: &Fixture) {
    let prefix = fx.key("operator/");
    let key = |name: &str| format!("{prefix}{name}");
    // Taken out of key order, so that a view in grant or hash order fails;
    // `E` sorts first byte by byte, last in a case-blind collation.
    let mut others = Vec::new();
    for name in ["E", "d"] {
        let lease = fx
            .locker
            .try_acquire(&key(name), LONG_TTL)
            .await
            .expect("grant");
        others.push(lease);
    }
    let b = fx
        .locker
        .try_acquire(&key("b"), LONG_TTL)
        .await
        .expect("grant b");
    let a = fx
        .locker
        .try_acquire(&key("a"), LONG_TTL)
        .await
        .expect("grant a");
    let released = fx
        .locker
        .try_acquire(&key("c"), LONG_TTL)
        .await
        .expect("grant c");
    fx.locker.release(released).await.expect("release c");
    let outside = fx.key("operator-outside");
    let outside = fx
        .locker
        .try_acquire(&outside, LONG_TTL)
        .await
        .expect("grant outside");

    match fx.other.inspect(&prefix).await {
        Ok(held) => check_view(&held, &[&others[0], &a, &b, &others[1]]),
        Err(e) if e.is_unsupported() => {}
        Err(e) => panic!("inspect: {e}"),
    }

    match fx.other.force_release(a.key().as_str()).await {
        Ok(true) => {
            // Free at once, for anyone; the other keys stay held.
            let taken = fx
                .other
                .try_acquire(a.key().as_str(), LONG_TTL)
                .await
                .expect("a force-released key is free at once");
            assert!(
                matches!(fx.other.force_release(&key("never-held")).await, Ok(false)),
                "force release of a key never held must answer false"
            );
            assert!(
                matches!(
                    fx.other.try_acquire(b.key().as_str(), LONG_TTL).await,
                    Err(Error::Contended { .. })
                ),
                "force release of one key freed another"
            );
            fx.other
                .release(taken)
                .await
                .expect("release the retaken key");
            assert!(
                matches!(fx.other.force_release(a.key().as_str()).await, Ok(false)),
                "force release of a freed key must answer false"
            );
            // The first holder hears of its loss when it releases.
            assert!(
                matches!(fx.locker.release(a).await, Err(Error::Lost { .. })),
                "releasing a force-released lease must report it lost"
            );
        }
        Ok(false) => panic!("force release found no grant on a held key"),
        Err(e) if e.is_unsupported() => fx.locker.release(a).await.expect("release a"),
        Err(e) => panic!("force release: {e}"),
    }
    fx.locker.release(b).await.expect("release b");
    for lease in others {
        fx.locker.release(lease).await.expect("release");
    }
    fx.locker.release(outside).await.expect("release outside");
}

/// `held` is the view of exactly `leases`, in key order.
fn check_view(held: &[HeldLock], leases: &[&Lease]) {
    let keys: Vec<&str> = held.iter().map(|h| h.key.as_str()).collect();
    let wanted: Vec<&str> = leases.iter().map(|l| l.key().as_str()).collect();
    assert_eq!(
        keys, wanted,
        "the view must list the held keys under the prefix, sorted"
    );
    for (shown, lease) in held.iter().zip(leases) {
        if let Some(remaining) = shown.remaining {
            assert!(
                remaining <= LONG_TTL,
                "{}: {remaining:?} left of a {LONG_TTL:?} grant",
                shown.key
            );
        }
        if let Some(token) = shown.fencing_token {
            assert_eq!(
                token,
                lease.fencing_token(),
                "{}: not its holder's token",
                shown.key
            );
        }
    }
}
