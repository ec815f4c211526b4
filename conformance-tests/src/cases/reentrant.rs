//! Reentrant holds: a holder identity takes a key it holds again at once,
//! the holds count, and the last release frees the key. Counted in
//! lock-core, so every backend runs these.

use lock_core::{Error, GuardOptions, Wait};

use super::{LONG_TTL, SLACK, short, within};
use crate::Fixture;

fn options() -> GuardOptions {
    GuardOptions::new(LONG_TTL)
}

/// Nested holds count and share the first hold's fencing token; another
/// identity and another locker are excluded until the last hold is
/// released, and then the key is free.
pub async fn reentrant_holds_count_and_the_last_release_frees(fx: &Fixture) {
    let key = fx.key("reentrant-count");
    let me = fx.locker.new_holder();
    let outer = me.guard(&key, options()).await.expect("first hold");
    // No wait: a second hold by the same identity is granted at once.
    let inner = me
        .clone()
        .guard(&key, options())
        .await
        .expect("second hold");
    let innermost = me.guard(&key, options()).await.expect("third hold");
    assert_eq!(me.holds(&key), 3, "three holds counted");
    assert_eq!(inner.fencing_token(), outer.fencing_token());
    assert_eq!(innermost.fencing_token(), outer.fencing_token());
    let stranger = fx.locker.new_holder().guard(&key, options()).await;
    assert!(
        matches!(stranger, Err(Error::Contended { .. })),
        "another identity took a held key: {stranger:?}"
    );
    inner.release().await.expect("an inner release");
    drop(innermost);
    assert_eq!(me.holds(&key), 1);
    let busy = fx.other.try_acquire(&key, LONG_TTL).await;
    assert!(
        matches!(busy, Err(Error::Contended { .. })),
        "the key was freed before its last hold was released: {busy:?}"
    );
    let first_token = outer.fencing_token();
    outer.release().await.expect("the last release");
    assert_eq!(me.holds(&key), 0);
    let next = within(
        SLACK,
        "the key is free after the last release",
        fx.other.acquire(&key, LONG_TTL, Wait::at_most(SLACK)),
    )
    .await
    .expect("acquire after the last release");
    assert!(next.fencing_token() > first_token);
    fx.other.release(next).await.expect("release");
}

/// When the grant is removed behind the holder's back, every hold's
/// `lost()` fires; the identity then takes the key afresh, with a new,
/// higher fencing token.
pub async fn a_lost_grant_reaches_every_hold(fx: &Fixture) {
    let key = fx.key("reentrant-lost");
    let me = fx.locker.new_holder();
    let renewing = GuardOptions::new(LONG_TTL).renew_every(short(fx));
    let outer = me.guard(&key, renewing).await.expect("first hold");
    let inner = me.guard(&key, renewing).await.expect("second hold");
    let (outer_lost, inner_lost) = (outer.lost(), inner.lost());
    fx.sabotage.remove_grant(&key).await;
    within(SLACK, "the first hold's lost() fires", outer_lost).await;
    within(SLACK, "the second hold's lost() fires", inner_lost).await;
    assert!(!inner.is_held() && !outer.is_held());
    let again = within(
        SLACK,
        "the identity takes the key afresh",
        me.guard(&key, options().wait(SLACK)),
    )
    .await
    .expect("a fresh hold");
    assert!(
        again.fencing_token() > outer.fencing_token(),
        "a fresh grant's token must be above the lost one's"
    );
    assert!(
        inner.release().await.is_err(),
        "releasing a hold of a lost grant is reported"
    );
    drop(outer);
    again.release().await.expect("release");
}

/// A named identity is one per locker (and process): asked twice, the
/// name counts holds on one grant; the same name in another locker (as in
/// another process) is another holder, and is excluded.
pub async fn a_holder_name_is_one_identity_in_one_process(fx: &Fixture) {
    let key = fx.key("reentrant-named");
    // Unique to the run, as keys are.
    let name = fx.key("worker");
    let first = fx.locker.holder(&name);
    let held = first.guard(&key, options()).await.expect("first hold");
    let again = fx
        .locker
        .holder(&name)
        .guard(&key, options())
        .await
        .expect("the same name holds again");
    assert_eq!(again.fencing_token(), held.fencing_token());
    let elsewhere = fx.other.holder(&name).guard(&key, options()).await;
    assert!(
        matches!(elsewhere, Err(Error::Contended { .. })),
        "the same name in another process must be another holder: {elsewhere:?}"
    );
    // Dropped holds free the key too, the last one in the background.
    drop(held);
    drop(again);
    let next = within(
        SLACK,
        "dropped holds free the key",
        fx.other.acquire(&key, LONG_TTL, Wait::at_most(SLACK)),
    )
    .await
    .expect("acquire after the holds were dropped");
    fx.other.release(next).await.expect("release");
}
