//! Semaphores: at most N holders, each with a permit of its own. The cases
//! read `capabilities()`: a backend without semaphores must refuse them
//! with `Unsupported` and its reason, and the other cases skip it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use lock_core::{Error, GuardOptions, MAX_PERMITS, Mode, Offer, Wait};

use super::in_mode;
use super::{LONG_TTL, SLACK, within};
use crate::Fixture;

fn offers_semaphores(fx: &Fixture) -> bool {
    fx.locker
        .capabilities()
        .offer(&Mode::semaphore(2))
        .is_offered()
}

/// A backend offers semaphores, or refuses them, before any call, with
/// `Unsupported` and the reason its capabilities give.
pub async fn semaphores_are_offered_or_refused_with_a_reason(fx: &Fixture) {
    let key = fx.key("semaphore-offer");
    let caps = fx.locker.capabilities();
    let asked = fx.locker.semaphore(&key, 2, GuardOptions::new(LONG_TTL));
    match caps.offer(&Mode::semaphore(2)) {
        Offer::Offered { .. } => {
            let permit = asked
                .expect("an offered mode")
                .guard()
                .await
                .expect("a permit");
            permit.release().await.expect("release");
        }
        Offer::Refused { reason } => {
            in_mode::refused_with_the_reason(asked, reason, "semaphores");
        }
        other => panic!("unknown offer {other:?}"),
    }
}

/// N holders at once, from two clients; the N+1st is refused as contended
/// (with the time until the first permit expires, where the backend tells)
/// and gets in once one permit is released. Tokens increase across them.
pub async fn semaphore_admits_n_holders_and_then_the_next(fx: &Fixture) {
    if !offers_semaphores(fx) {
        return;
    }
    let key = fx.key("semaphore-n");
    let options = GuardOptions::new(LONG_TTL);
    let here = fx.locker.semaphore(&key, 3, options).expect("semaphore");
    let there = fx.other.semaphore(&key, 3, options).expect("semaphore");
    let first = here.guard().await.expect("permit 1");
    let second = there.guard().await.expect("permit 2");
    let third = here.guard().await.expect("permit 3");
    assert!(first.fencing_token() < second.fencing_token());
    assert!(second.fencing_token() < third.fencing_token());
    // Where the backend lists locks, each holder is listed with the number.
    match fx.locker.inspect(&key).await {
        Ok(held) => {
            assert_eq!(held.len(), 3, "one entry per permit holder: {held:?}");
            assert!(
                held.iter().all(|h| h.mode == Mode::semaphore(3)),
                "{held:?}"
            );
        }
        Err(e) => assert!(e.is_unsupported(), "{e}"),
    }
    match there.guard().await {
        Err(Error::Contended { remaining, .. }) => {
            if fx.locker.capabilities().reports_remaining_ttl {
                let left = remaining.expect("the first permit's remaining TTL");
                assert!(left <= LONG_TTL, "remaining {left:?} beyond the TTL");
            }
        }
        other => panic!("a fourth holder of 3 permits: {other:?}"),
    }
    let waiting = {
        let there = fx
            .other
            .semaphore(&key, 3, options.wait(SLACK))
            .expect("semaphore");
        tokio::spawn(async move { there.guard().await })
    };
    second.release().await.expect("release");
    let fourth = within(SLACK, "the waiter gets the freed permit", waiting)
        .await
        .expect("task")
        .expect("the fourth permit");
    assert!(fourth.fencing_token() > third.fencing_token());
    for permit in [first, third, fourth] {
        permit.release().await.expect("release");
    }
}

/// An expired holder's permit comes back: its lease can no longer be
/// extended, and a waiter gets in after its TTL.
pub async fn an_expired_permit_comes_back(fx: &Fixture) {
    if !offers_semaphores(fx) {
        return;
    }
    let mode = Mode::semaphore(1);
    in_mode::an_expired_hold_frees_the_key(fx, "semaphore-expiry", mode, mode).await;
}

/// The number of permits is part of the key's identity while it is held:
/// another number, or an exclusive lock, is refused naming both modes;
/// a semaphore on an exclusively held key too. Once free, the key takes
/// any, and fencing tokens keep increasing across the modes.
pub async fn disagreeing_modes_are_refused(fx: &Fixture) {
    if !offers_semaphores(fx) {
        return;
    }
    let key = fx.key("semaphore-conflict");
    let held = fx
        .locker
        .acquire_in(&key, Mode::semaphore(3), LONG_TTL, Wait::NONE)
        .await
        .expect("a permit");
    let five = fx
        .other
        .acquire_in(&key, Mode::semaphore(5), LONG_TTL, Wait::NONE)
        .await
        .expect_err("5 permits on a key held as 3");
    assert!(five.is_mode_conflict(), "not a mode conflict: {five}");
    let text = five.to_string();
    assert!(
        text.contains('3') && text.contains('5'),
        "both numbers named: {text}"
    );
    let exclusive = fx.other.try_acquire(&key, LONG_TTL).await;
    assert!(
        matches!(exclusive, Err(Error::ModeConflict { .. })),
        "an exclusive lock on a semaphore's key: {exclusive:?}"
    );
    let permit_token = held.fencing_token();
    fx.locker.release(held).await.expect("release");
    let plain = fx
        .other
        .try_acquire(&key, LONG_TTL)
        .await
        .expect("free again");
    assert!(
        plain.fencing_token() > permit_token,
        "an exclusive grant's token after a permit's"
    );
    let plain_token = plain.fencing_token();
    let on_plain = fx
        .locker
        .acquire_in(&key, Mode::semaphore(2), LONG_TTL, Wait::NONE)
        .await;
    assert!(
        matches!(on_plain, Err(Error::ModeConflict { .. })),
        "a semaphore on an exclusively held key: {on_plain:?}"
    );
    fx.other.release(plain).await.expect("release");
    let five = fx
        .other
        .acquire_in(&key, Mode::semaphore(5), LONG_TTL, Wait::NONE)
        .await
        .expect("a free key takes a new number of permits");
    assert!(
        five.fencing_token() > plain_token,
        "a permit's token after an exclusive grant's"
    );
    fx.other.release(five).await.expect("release");
}

/// Zero or too many permits are refused naming `permits` and the limit,
/// before anything is held.
pub async fn semaphore_input_is_validated(fx: &Fixture) {
    if !offers_semaphores(fx) {
        return;
    }
    let key = fx.key("semaphore-input");
    for permits in [0, MAX_PERMITS + 1, u32::MAX] {
        match fx
            .locker
            .semaphore(&key, permits, GuardOptions::new(LONG_TTL))
        {
            Err(Error::InvalidInput {
                field: "permits",
                problem,
            }) => {
                assert!(
                    problem.contains(&permits.to_string()) || permits == 0,
                    "{problem}"
                );
            }
            other => panic!("{permits} permits: {other:?}"),
        }
        let direct = fx
            .locker
            .acquire_in(&key, Mode::semaphore(permits), LONG_TTL, Wait::NONE)
            .await;
        assert!(
            matches!(direct, Err(Error::InvalidInput { .. })),
            "{direct:?}"
        );
    }
    let free = fx
        .other
        .try_acquire(&key, LONG_TTL)
        .await
        .expect("nothing held");
    fx.other.release(free).await.expect("release");
}

/// Never more than N holders at once, under 32 contenders that each take
/// a permit twice, counted by a shared counter while they hold it.
pub async fn never_more_than_n_holders_under_contention(fx: &Fixture) {
    if !offers_semaphores(fx) {
        return;
    }
    const PERMITS: u32 = 3;
    let key = fx.key("semaphore-crowd");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let locker = if i % 2 == 0 { &fx.locker } else { &fx.other };
            let semaphore = locker
                .semaphore(&key, PERMITS, GuardOptions::new(LONG_TTL).wait(SLACK * 2))
                .expect("semaphore");
            let (inside, most) = (inside.clone(), most.clone());
            tokio::spawn(async move {
                for _ in 0..2 {
                    let permit = semaphore.guard().await.expect("a permit");
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    permit.release().await.expect("release");
                }
            })
        })
        .collect();
    for task in tasks {
        within(SLACK * 4, "every contender gets its permits", task)
            .await
            .expect("task");
    }
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= PERMITS as usize,
        "{most} holders of {PERMITS} permits at once"
    );
    assert!(most >= 2, "the permits were never shared ({most} at most)");
}

/// An attempt for a permit dropped on its way gives the permit back at
/// once, not after its (hour-long) TTL.
pub async fn dropped_permit_attempt_gives_its_permit_back(fx: &Fixture) {
    if !offers_semaphores(fx) {
        return;
    }
    let mode = Mode::semaphore(1);
    in_mode::dropped_attempts_give_their_hold_back(fx, "semaphore-dropped", mode, mode).await;
}
