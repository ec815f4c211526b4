//! `lockkit::blocking` from synchronous code, on the memory backend and on
//! every shared server this build reaches.

#![cfg(feature = "blocking")]

use std::time::Duration;

use lockkit::{Error, GuardOptions};

/// (name, url) of memory and of each configured server.
fn backends() -> Vec<(&'static str, String)> {
    let mut found = vec![("memory", "memory://".to_owned())];
    for (name, var) in [
        ("redis", "LOCKKIT_REDIS_URL"),
        ("redlock", "LOCKKIT_REDLOCK_URL"),
        ("etcd", "LOCKKIT_ETCD_URL"),
        ("postgres", "LOCKKIT_POSTGRES_URL"),
    ] {
        if !lockkit::available_schemes().contains(&name) {
            continue;
        }
        match std::env::var(var) {
            Ok(url) => found.push((name, url)),
            Err(_) if std::env::var("LOCKKIT_REQUIRE_SERVERS").is_ok_and(|v| v == "1") => {
                panic!("{var} is not set, and LOCKKIT_REQUIRE_SERVERS=1")
            }
            Err(_) => {}
        }
    }
    found
}

fn key(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("blocking-test/{}-{nanos:x}/{name}", std::process::id())
}

#[test]
fn with_lock_runs_the_work_under_the_lock_and_frees_it() {
    for (backend, url) in backends() {
        let locker = lockkit::blocking::connect(&url).expect("connect");
        let key = key("with-lock");
        let other = locker.clone();
        let seen = locker
            .with_lock(&key, GuardOptions::new(Duration::from_secs(30)), |token| {
                let busy = other.guard(&key, GuardOptions::new(Duration::from_secs(30)));
                (token, busy.map(|_| ()).unwrap_err().is_contended())
            })
            .expect("with_lock");
        assert!(
            seen.1,
            "{backend}: a contender got the lock during the work"
        );
        let next = locker
            .guard(&key, GuardOptions::new(Duration::from_secs(30)))
            .expect("free after with_lock");
        assert!(next.fencing_token() > seen.0, "{backend}");
        next.release().expect("release");
    }
}

/// The guard is renewed while the caller's thread does something else: a
/// contender is still refused three TTLs on.
#[test]
fn a_guard_stays_held_while_the_thread_works() {
    for (backend, url) in backends() {
        let locker = lockkit::blocking::connect(&url).expect("connect");
        let ttl = Duration::from_secs(if backend == "etcd" { 2 } else { 1 });
        let key = key("renewed");
        let guard = locker.guard(&key, GuardOptions::new(ttl)).expect("guard");
        // The work: this thread busy for three TTLs, not awaiting anything.
        std::thread::sleep(ttl * 3);
        assert!(guard.is_held(), "{backend}: {:?}", guard.lost_reason());
        let contender = locker.guard(&key, GuardOptions::new(ttl));
        assert!(
            contender.is_err_and(|e| e.is_contended()),
            "{backend}: the lock lapsed while the thread worked"
        );
        drop(guard);
        // Dropped, it is released in the background: the next one gets it
        // long before the TTL of 30 s below could free it.
        let next = locker
            .guard(
                &key,
                GuardOptions::new(Duration::from_secs(30)).wait(Duration::from_secs(10)),
            )
            .expect("free after the guard was dropped");
        next.release().expect("release");
    }
}

#[test]
fn inside_an_async_runtime_it_refuses_instead_of_stalling_or_panicking() {
    let locker = lockkit::blocking::connect("memory://").expect("connect");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let err = locker
            .guard("k", GuardOptions::new(Duration::from_secs(30)))
            .unwrap_err();
        assert!(
            matches!(&err, Error::InvalidInput { .. }) && err.to_string().contains("async API"),
            "{err}"
        );
        // Dropped here, inside the runtime: no panic.
        drop(locker);
    });
}

/// A semaphore's permits from synchronous code, where the backend offers
/// semaphores; a clear refusal where it does not.
#[test]
fn permits_of_a_semaphore_from_synchronous_code() {
    use lockkit::Mode;
    for (backend, url) in backends() {
        let locker = lockkit::blocking::connect(&url).expect("connect");
        let key = key("permits");
        let options = GuardOptions::new(Duration::from_secs(30));
        let mode = Mode::semaphore(2);
        if !locker.capabilities().offer(&mode).is_offered() {
            let refused = locker.guard_in(&key, mode, options).unwrap_err();
            assert!(refused.is_unsupported(), "{backend}: {refused}");
            continue;
        }
        let first = locker.guard_in(&key, mode, options).expect("permit 1");
        let second = locker.guard_in(&key, mode, options).expect("permit 2");
        let third = locker
            .guard_in(&key, mode, options)
            .map(|_| ())
            .unwrap_err();
        assert!(third.is_contended(), "{backend}: {third}");
        assert!(second.fencing_token() > first.fencing_token(), "{backend}");
        first.release().expect("release");
        second.release().expect("release");
    }
}
