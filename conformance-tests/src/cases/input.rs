//! Bad input and the capabilities a backend declares.

use lock_core::Wait;
use std::time::Duration;

use lock_core::raw::validate::{MAX_KEY_BYTES, MAX_TTL};
use lock_core::{Error, FencingGuarantee, GuardOptions, SafetyModel};

use super::LONG_TTL;
use crate::Fixture;

fn expect_invalid<T: std::fmt::Debug>(
    result: lock_core::Result<T>,
    field: &str,
    mentions: &str,
    what: &str,
) {
    match result {
        Err(Error::InvalidInput { field: f, problem }) => {
            assert_eq!(f, field, "{what}: wrong field in {problem:?}");
            assert!(
                problem.contains(mentions),
                "{what}: {problem:?} does not mention {mentions:?}"
            );
        }
        other => panic!("{what}: expected invalid {field}, got {other:?}"),
    }
}

/// Empty, oversized and unstorable keys, zero, too short, inexact or absurd
/// TTLs, and a guard that would renew only after its lease lapsed, give a
/// typed error naming the field and the limit, through every entry point,
/// and leave nothing held. A wait of `Duration::MAX` is no error.
pub async fn invalid_input_is_refused_and_leaves_nothing_held(fx: &Fixture) {
    let l = &fx.locker;
    let limits = l.capabilities().limits;
    let max_key = limits.max_key_bytes.min(MAX_KEY_BYTES);

    expect_invalid(
        l.try_acquire("", LONG_TTL).await,
        "key",
        "empty",
        "empty key",
    );
    let long = "k".repeat(max_key + 1);
    expect_invalid(
        l.try_acquire(&long, LONG_TTL).await,
        "key",
        &max_key.to_string(),
        "oversized key",
    );
    expect_invalid(
        l.acquire(&long, LONG_TTL, Wait::at_most(Duration::from_secs(1)))
            .await,
        "key",
        "bytes",
        "oversized key, waiting",
    );
    expect_invalid(
        l.try_acquire("nul\0key", LONG_TTL).await,
        "key",
        "control character",
        "key with NUL",
    );
    // Characters that print as nothing, or as something else: a key holding
    // one could spoof an operator's terminal or hide from a search.
    for (c, class) in [
        ('\u{202E}', "format"),
        ('\u{200B}', "format"),
        ('\u{FEFF}', "format"),
        ('\u{2028}', "separator"),
        ('\u{00A0}', "separator"),
        ('\u{FFFF}', "unassigned"),
        ('\u{FFFD}', "replacement"),
        ('\u{E000}', "private-use"),
        ('\u{034F}', "invisible"),
        ('\u{3164}', "invisible"),
        ('\u{FE0F}', "invisible"),
    ] {
        let spoof = format!("{}{c}x", fx.key("unprintable"));
        expect_invalid(
            l.try_acquire(&spoof, LONG_TTL).await,
            "key",
            class,
            &format!("key with U+{:04X}", c as u32),
        );
    }
    // `café` written with a combining accent prints as the one written with
    // `é`: two names for one resource would be two locks.
    expect_invalid(
        l.try_acquire(&format!("{}cafe\u{301}", fx.key("nfd")), LONG_TTL)
            .await,
        "key",
        "NFC",
        "key not in normalization form C",
    );
    expect_invalid(
        l.guard("", GuardOptions::new(LONG_TTL)).await,
        "key",
        "empty",
        "empty key, guard",
    );

    let key = fx.key("invalid-ttl");
    expect_invalid(
        l.try_acquire(&key, Duration::ZERO).await,
        "ttl",
        "zero",
        "zero TTL",
    );
    let absurd = Duration::from_secs(100 * 365 * 24 * 3600);
    let max = limits.max_ttl.min(MAX_TTL);
    expect_invalid(
        l.try_acquire(&key, absurd).await,
        "ttl",
        &format!("{max:?}"),
        "absurd TTL",
    );
    expect_invalid(
        l.acquire(&key, absurd, Wait::at_most(Duration::from_secs(1)))
            .await,
        "ttl",
        "at most",
        "absurd TTL, waiting",
    );
    if limits.min_ttl > Duration::from_millis(1) {
        let below = limits.min_ttl / 2;
        expect_invalid(
            l.try_acquire(&key, below).await,
            "ttl",
            &format!("{:?}", limits.min_ttl),
            "TTL below the minimum",
        );
    }
    if limits.ttl_granularity > Duration::from_millis(1) {
        let inexact = limits.min_ttl.max(limits.ttl_granularity) + limits.ttl_granularity / 2;
        expect_invalid(
            l.try_acquire(&key, inexact).await,
            "ttl",
            "multiples",
            "TTL the backend cannot honour exactly",
        );
    }

    expect_invalid(
        l.guard(&key, GuardOptions::new(LONG_TTL).renew_every(LONG_TTL))
            .await,
        "renew_every",
        "validity",
        "a guard renewing only after its lease lapsed",
    );

    let mut lease = l
        .try_acquire(&key, LONG_TTL)
        .await
        .expect("the refused attempts left no grant");
    expect_invalid(
        l.extend(&mut lease, Duration::ZERO).await,
        "ttl",
        "zero",
        "extend with a zero TTL",
    );
    expect_invalid(
        l.extend(&mut lease, absurd).await,
        "ttl",
        "at most",
        "extend with an absurd TTL",
    );
    l.release(lease)
        .await
        .expect("the refused extends did not disturb the grant");

    // A wait too long for the clock to count means "as long as it takes".
    let lease = l
        .acquire(&key, LONG_TTL, Wait::at_most(Duration::MAX))
        .await
        .expect("a free lock, waiting without end");
    l.release(lease).await.expect("release");
}

/// The declared capabilities hang together.
pub async fn capabilities_are_consistent(fx: &Fixture) {
    let caps = fx.locker.capabilities();
    assert!(!caps.backend.is_empty());
    assert_eq!(caps.limits.backend, caps.backend);
    assert!(caps.limits.min_ttl > Duration::ZERO && caps.limits.min_ttl <= caps.limits.max_ttl);
    assert!(caps.limits.ttl_granularity > Duration::ZERO && caps.limits.max_key_bytes > 0);
    if caps.fencing.guarantee == FencingGuarantee::Strict {
        assert!(
            !caps.fencing.rests_on.is_empty(),
            "a strict fencing claim must name what it rests on"
        );
    }
    if matches!(
        caps.safety,
        SafetyModel::InProcess | SafetyModel::SingleNode | SafetyModel::AcidTransaction
    ) {
        assert_eq!(
            caps.tolerated_server_failures, 0,
            "{} cannot survive losing its one server",
            caps.safety
        );
    }
    // The suite itself needs these TTLs; a backend that refuses them is unusable in practice.
    fx.locker
        .try_acquire(&fx.key("caps"), LONG_TTL)
        .await
        .map(|_| ())
        .or_else(|e| match e {
            Error::Contended { .. } => Ok(()),
            e => Err(e),
        })
        .expect("a 30 s TTL is accepted");
}
