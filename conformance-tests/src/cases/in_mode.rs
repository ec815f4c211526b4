//! What the semaphore and read-write cases check alike, for a hold in a
//! mode other than the exclusive one: a refusal names its reason, an
//! expired hold frees the key, a dropped attempt gives its hold back.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lock_core::{Error, Mode, Result, Wait};
use tokio::time::Instant;

use super::{LONG_TTL, SLACK, expiry_wait, short, within};
use crate::Fixture;

/// `asked` is the refusal of a mode the backend does not offer:
/// `Unsupported`, naming `reason`, the one its capabilities give.
pub(super) fn refused_with_the_reason<T: Debug>(asked: Result<T>, reason: &str, mode: &str) {
    assert!(!reason.is_empty(), "a refusal gives its reason");
    match asked {
        Err(
            e @ Error::Unsupported {
                reason: Some(_), ..
            },
        ) => {
            assert!(
                e.to_string().contains(reason),
                "the error names the reason: {e}"
            );
        }
        other => panic!("a backend without {mode} must refuse them: {other:?}"),
    }
}

/// A hold in `mode` with a short TTL lapses: the other client gets the key
/// in `next` after the TTL, with a greater token, and the lapsed hold can
/// no longer be extended or released.
pub(super) async fn an_expired_hold_frees_the_key(
    fx: &Fixture,
    name: &str,
    mode: Mode,
    next: Mode,
) {
    let key = fx.key(name);
    let ttl = short(fx);
    let mut lapsing = fx
        .locker
        .acquire_in(&key, mode, ttl, Wait::NONE)
        .await
        .expect("a hold");
    assert_eq!(lapsing.mode(), mode);
    let after = within(
        expiry_wait(ttl),
        "the expired hold frees the key",
        fx.other
            .acquire_in(&key, next, LONG_TTL, Wait::at_most(expiry_wait(ttl))),
    )
    .await
    .expect("the key after the expired hold");
    assert!(after.fencing_token() > lapsing.fencing_token());
    let extended = fx.locker.extend(&mut lapsing, LONG_TTL).await;
    assert!(
        matches!(extended, Err(Error::Lost { .. })),
        "an expired hold was extended: {extended:?}"
    );
    assert!(fx.locker.release(lapsing).await.is_err());
    fx.other
        .release(after)
        .await
        .expect("the live hold is untouched");
}

/// An attempt in `mode` dropped on its way, at 12 points of its course,
/// gives its hold back at once, not after its (hour-long) TTL: the other
/// client gets the key in `next` soon after.
pub(super) async fn dropped_attempts_give_their_hold_back(
    fx: &Fixture,
    name: &str,
    mode: Mode,
    next: Mode,
) {
    let ttl = fx.short_ttl(Duration::from_secs(3600));
    let key = fx.key(&format!("{name}-probe"));
    let started = Instant::now();
    let probe = fx
        .locker
        .acquire_in(&key, mode, ttl, Wait::NONE)
        .await
        .expect("probe");
    let takes = started.elapsed();
    fx.locker.release(probe).await.expect("release");
    for round in 0..12u32 {
        let key = fx.key(&format!("{name}-{round}"));
        let begun = Arc::new(AtomicBool::new(false));
        let attempt = {
            let (locker, key, begun) = (fx.locker.clone(), key.clone(), begun.clone());
            tokio::spawn(async move {
                begun.store(true, Ordering::SeqCst);
                locker.acquire_in(&key, mode, ttl, Wait::NONE).await
            })
        };
        // A busy wait, since a timer's granularity is 1 ms.
        let drop_at = Instant::now() + takes / 10 * round;
        while Instant::now() < drop_at {
            tokio::task::yield_now().await;
        }
        attempt.abort();
        if let Ok(Ok(lease)) = attempt.await {
            fx.locker.release(lease).await.expect("release");
        }
        let after = within(
            SLACK,
            "the key is free long before the dropped attempt's TTL",
            fx.other
                .acquire_in(&key, next, LONG_TTL, Wait::at_most(SLACK)),
        )
        .await
        .unwrap_or_else(|e| panic!("round {round}: {e}"));
        fx.other.release(after).await.expect("release");
    }
}
