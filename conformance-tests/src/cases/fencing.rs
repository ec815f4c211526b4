//! Fencing tokens across releases, expiries and vanished holders.

use lock_core::Wait;

use super::{LONG_TTL, expiry_wait, short};
use crate::Fixture;

const GRANTS: usize = 100;

/// 100 successive grants on one key, alternating between two independent
/// clients: most released, some left to expire, some dropped without a
/// word (a crashed holder), some removed behind their holder's back (an
/// operator). Every token is strictly greater than the one before.
pub async fn fencing_tokens_strictly_increase(fx: &Fixture) {
    let key = fx.key("fencing");
    let ttl = short(fx);
    let mut previous = None;
    // Leases left to expire stay alive, unrenewed, like a paused holder's.
    let mut expired = Vec::new();
    for i in 0..GRANTS {
        let locker = if i % 2 == 0 { &fx.locker } else { &fx.other };
        let lease = locker
            .acquire(&key, ttl, Wait::at_most(expiry_wait(ttl)))
            .await
            .unwrap_or_else(|e| panic!("grant #{i}: {e}"));
        let token = lease.fencing_token();
        if let Some(prev) = previous {
            assert!(
                token > prev,
                "grant #{i}: token {token} is not greater than the previous {prev}"
            );
        }
        previous = Some(token);
        match i % 25 {
            // Left to expire: the next acquire waits out the TTL.
            7 => expired.push(lease),
            // The holder vanishes: its lease is dropped, never released.
            13 => drop(lease),
            // An operator removes the grant; its holder never learns.
            19 => {
                fx.remove_grant(&lease).await;
                expired.push(lease);
            }
            _ => locker
                .release(lease)
                .await
                .unwrap_or_else(|e| panic!("release #{i}: {e}")),
        }
    }
    // A long grant at the end still continues the sequence.
    let last = fx
        .locker
        .acquire(&key, LONG_TTL, Wait::at_most(expiry_wait(ttl)))
        .await
        .expect("final grant");
    assert!(Some(last.fencing_token()) > previous);
    fx.locker.release(last).await.expect("release");
    drop(expired);
}
