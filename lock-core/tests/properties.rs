//! Property tests: arbitrary keys, durations, margins and URLs thrown at
//! every parser of lock-core and at `Locker`'s operations on the memory
//! backend. Whatever comes in, nothing panics, what is refused is refused
//! with a typed error naming the field, and a refused call holds nothing.

use lock_core::Wait;
use std::time::Duration;

use lock_core::raw::validate::{self, MAX_KEY_BYTES, MAX_TTL};
use lock_core::url::{ServerUrl, redact};
use lock_core::{
    Backoff, DriftMargin, Error, GuardOptions, Limits, Locker, LockerOptions, MemoryBackend,
};
use proptest::prelude::*;

/// Durations from every corner: zero, a nanosecond, around the limits,
/// around `u64` seconds, and anything in between.
fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::from_nanos(1)),
        Just(Duration::from_millis(10)),
        Just(MAX_TTL),
        Just(MAX_TTL + Duration::from_nanos(1)),
        Just(Duration::MAX),
        (0u64..=u64::MAX, 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        (0u64..100_000).prop_map(Duration::from_millis),
        (0u64..5_000_000).prop_map(Duration::from_micros),
    ]
}

/// Keys: printable ones, ones with any character at all, long ones.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z/:{}%-]{1,12}",
        any::<String>(),
        ".{0,8}[\\p{Cc}\\p{Cf}\\p{Zl}\\p{Zp}\\p{Zs}\\p{Co}].{0,8}",
        (MAX_KEY_BYTES - 2..MAX_KEY_BYTES + 3).prop_map(|n| "k".repeat(n)),
    ]
}

fn fraction() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(f64::MAX),
        Just(-0.0),
        any::<f64>(),
        0.0..1.0,
    ]
}

fn invalid_field(err: &Error) -> Option<&'static str> {
    match err {
        Error::InvalidInput { field, .. } => Some(field),
        _ => None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn keys_are_taken_or_refused_by_name(key in key()) {
        match validate::key(&key, &Limits::default()) {
            Ok(k) => {
                prop_assert_eq!(k.as_str(), key.as_str());
                prop_assert!(!key.is_empty() && key.len() <= MAX_KEY_BYTES);
                prop_assert!(key.chars().all(|c| validate::unprintable(c).is_none()));
                prop_assert!(unicode_normalization::is_nfc(&key));
            }
            Err(e) => {
                prop_assert_eq!(invalid_field(&e), Some("key"), "{}", e);
                // The message names a character by its code point; it never
                // prints one that could spoof the terminal.
                prop_assert!(e.to_string().chars().all(|c| validate::unprintable(c).is_none()));
            }
        }
    }

    #[test]
    fn ttls_and_margins_never_panic(ttl in duration(), fraction in fraction(), fixed in duration(), extra in duration()) {
        let drift = DriftMargin { fraction, fixed };
        let margin = drift.for_ttl(ttl);
        prop_assert!(drift.validity(ttl, extra) <= ttl);
        let _ = drift.deadline(tokio::time::Instant::now(), ttl, extra);
        if let Err(e) = validate::ttl(ttl, &Limits::default(), margin) {
            prop_assert_eq!(invalid_field(&e), Some("ttl"), "{}", e);
        }
        if let Err(e) = validate::timeout("response_timeout_ms", ttl) {
            prop_assert_eq!(invalid_field(&e), Some("response_timeout_ms"), "{}", e);
        }
    }

    #[test]
    fn backoff_never_panics(initial in duration(), max in duration(), attempt in any::<u32>()) {
        let backoff = Backoff { initial, max };
        prop_assert!(backoff.delay(attempt) <= max.max(Duration::ZERO));
    }

    #[test]
    fn urls_parse_or_are_refused_as_urls(text in any::<String>(), tail in "[a-z0-9:@,/?=&%.\\[\\]-]{0,40}") {
        for input in [text.clone(), format!("redis://{tail}"), format!("redlock://{text}")] {
            let _ = redact(&input);
            if let Err(e) = ServerUrl::parse(&input) {
                prop_assert_eq!(invalid_field(&e), Some("url"), "{}", e);
            }
        }
    }

    /// A password never shows, wherever in the URL a typo puts it.
    #[test]
    fn passwords_never_show(
        password in prop_oneof!["Qz[a-z0-9]{6}", "[1-9][0-9]{5,9}", "0[0-9]{4}"],
        before in "[a-z0-9:,]{0,10}",
        after in "[a-z0-9:@,/?=&.-]{0,20}",
    ) {
        for input in [
            format!("redis://{before}u:{password}{after}"),
            format!("redis://{before}u:{password}@{after}"),
            format!("redlock://{before}:{password}"),
        ] {
            prop_assert!(!redact(&input).contains(&password), "{} shown as {}", input, redact(&input));
            if let Err(e) = ServerUrl::parse(&input) {
                prop_assert!(!e.to_string().contains(&password), "{}: {}", input, e);
            }
            if let Ok(url) = ServerUrl::parse(&input) {
                prop_assert!(!format!("{url} {url:?}").contains(&password), "{}", input);
            }
        }
    }
}

/// One call of the public API, with whatever input.
#[derive(Debug, Clone)]
enum Call {
    TryAcquire(String, Duration),
    Acquire(String, Duration, Duration),
    Guard(String, Duration, Duration, Option<Duration>),
    WithLock(String, Duration, Duration),
    ExtendLast(Duration),
    ReleaseLast,
    ForceRelease(String),
    Inspect(String),
}

fn call() -> impl Strategy<Value = Call> {
    let k = prop_oneof![4 => "[ab]", 1 => key()];
    prop_oneof![
        (k.clone(), duration()).prop_map(|(k, t)| Call::TryAcquire(k, t)),
        (k.clone(), duration(), duration()).prop_map(|(k, t, w)| Call::Acquire(k, t, w)),
        (
            k.clone(),
            duration(),
            duration(),
            proptest::option::of(duration())
        )
            .prop_map(|(k, t, w, r)| Call::Guard(k, t, w, r)),
        (k.clone(), duration(), duration()).prop_map(|(k, t, w)| Call::WithLock(k, t, w)),
        duration().prop_map(Call::ExtendLast),
        Just(Call::ReleaseLast),
        k.clone().prop_map(Call::ForceRelease),
        k.prop_map(Call::Inspect),
    ]
}

/// The kinds an operation on the memory backend may answer with.
fn typed(err: &Error) -> bool {
    err.is_invalid_input() || err.is_contended() || err.is_timed_out() || err.is_lost()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any sequence of calls, on tokio's paused clock so that waits and
    /// TTLs of any length pass at once: no panic, only typed errors, and a
    /// call refused as invalid leaves the held locks as they were.
    #[test]
    fn lockers_operations_never_panic(calls in proptest::collection::vec(call(), 1..12), fraction in fraction()) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let memory = MemoryBackend::new();
            let drift = DriftMargin { fraction, ..DriftMargin::default() };
            let locker = Locker::new(memory.clone())
                .with_options(LockerOptions::default().drift(drift));
            let mut leases = Vec::new();
            let mut guards = Vec::new();
            for call in calls {
                let before: Vec<String> = memory.held().into_iter().map(|(k, _)| k).collect();
                // A wait on a key a guard keeps renewed never ends by itself;
                // a minute of the paused clock is enough to see it behave.
                let outcome = tokio::time::timeout(Duration::from_secs(60), async { match call {
                    Call::TryAcquire(k, t) => locker.try_acquire(&k, t).await.map(|l| leases.push(l)),
                    Call::Acquire(k, t, w) => locker.acquire(&k, t, Wait::at_most(w)).await.map(|l| leases.push(l)),
                    Call::Guard(k, t, w, r) => {
                        let mut options = GuardOptions::new(t).wait(w);
                        if let Some(r) = r {
                            options = options.renew_every(r);
                        }
                        locker.guard(&k, options).await.map(|g| guards.push(g))
                    }
                    Call::WithLock(k, t, w) => locker
                        .with_lock(&k, GuardOptions::new(t).wait(w), |token| async move { token.get() })
                        .await
                        .map(drop),
                    Call::ExtendLast(t) => match leases.last_mut() {
                        Some(lease) => locker.extend(lease, t).await,
                        None => Ok(()),
                    },
                    Call::ReleaseLast => match leases.pop() {
                        Some(lease) => locker.release(lease).await,
                        None => Ok(()),
                    },
                    Call::ForceRelease(k) => locker.force_release(&k).await.map(drop),
                    Call::Inspect(p) => locker.inspect(&p).await.map(drop),
                }})
                .await
                .unwrap_or(Ok(()));
                if let Err(e) = outcome {
                    prop_assert!(typed(&e), "untyped error: {e:?}");
                    if e.is_invalid_input() {
                        let after: Vec<String> = memory.held().into_iter().map(|(k, _)| k).collect();
                        prop_assert_eq!(&before, &after, "a refused call changed what is held: {}", e);
                    }
                }
            }
            Ok(())
        })?;
    }
}
