//! What is special about read-write locks on etcd (on the shared cluster):
//! readers and writers are served strictly in the order they queued, a
//! waiting reader follows the writers ahead of it as they leave, and a
//! reader on a semaphore's key is refused at once, leaving no entry.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use conformance_tests::{server_url, unique_key};
use lock_core::{Error, Locker, Mode, Wait};
use lock_etcd::EtcdBackend;
use tokio::sync::{mpsc, oneshot};
use tokio::time::timeout;

const TTL: Duration = Duration::from_secs(30);
const WAIT: Wait = Wait::at_most(Duration::from_secs(60));

async fn connect() -> Option<(EtcdBackend, Locker)> {
    let url = server_url("LOCKKIT_ETCD_URL")?;
    let backend = EtcdBackend::connect(&url).await.expect("connect");
    Some((backend.clone(), Locker::new(backend)))
}

/// The first contender that `grants` reports, within a generous time.
async fn next_grant(grants: &mut mpsc::UnboundedReceiver<&'static str>) -> &'static str {
    timeout(Duration::from_secs(30), grants.recv())
        .await
        .expect("a waiter is granted")
        .expect("the waiters report")
}

/// A reader that comes after a waiting writer waits behind it, even while
/// readers hold, and a writer that comes after waiting readers waits for
/// them: grants follow the order of arrival across both kinds, and the
/// readers between two writers share the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readers_and_writers_are_served_in_the_order_they_queued() {
    let Some((backend, locker)) = connect().await else {
        return;
    };
    let key = unique_key("etcd-rw-order");
    let first = locker
        .acquire_in(&key, Mode::Shared, TTL, Wait::NONE)
        .await
        .expect("the first reader");
    let (granted, mut grants) = mpsc::unbounded_channel();
    let mut releases = HashMap::new();
    let arrivals = [
        ("writer 1", Mode::Exclusive),
        ("reader 2", Mode::Shared),
        ("reader 3", Mode::Shared),
        ("writer 2", Mode::Exclusive),
        ("reader 4", Mode::Shared),
    ];
    let mut tasks = Vec::new();
    for (queued, (name, mode)) in arrivals.into_iter().enumerate() {
        let (release, released) = oneshot::channel::<()>();
        releases.insert(name, release);
        let (locker, k, granted) = (locker.clone(), key.clone(), granted.clone());
        tasks.push(tokio::spawn(async move {
            let lease = locker
                .acquire_in(&k, mode, TTL, WAIT)
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            granted.send(name).expect("report");
            released.await.expect("told to release");
            locker.release(lease).await.expect("release");
        }));
        // The next one arrives only once this one is in the queue.
        common::wait_for_queue_len(&backend, &key, queued + 2).await;
    }
    // Only the first reader holds: the others wait behind writer 1.
    let held = locker.inspect(&key).await.expect("inspect");
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(held[0].mode, Mode::Shared);
    assert_eq!(held[0].fencing_token, Some(first.fencing_token()));
    let late = locker.acquire_in(&key, Mode::Shared, TTL, Wait::NONE).await;
    assert!(matches!(late, Err(Error::Contended { .. })), "{late:?}");
    assert!(
        grants.try_recv().is_err(),
        "granted beside the first reader"
    );

    locker
        .release(first)
        .await
        .expect("release the first reader");
    assert_eq!(next_grant(&mut grants).await, "writer 1");
    releases.remove("writer 1").unwrap().send(()).unwrap();
    // Readers 2 and 3 hold together: each is granted before either leaves.
    let mut sharing = [next_grant(&mut grants).await, next_grant(&mut grants).await];
    sharing.sort();
    assert_eq!(sharing, ["reader 2", "reader 3"]);
    releases.remove("reader 2").unwrap().send(()).unwrap();
    releases.remove("reader 3").unwrap().send(()).unwrap();
    assert_eq!(next_grant(&mut grants).await, "writer 2");
    releases.remove("writer 2").unwrap().send(()).unwrap();
    assert_eq!(next_grant(&mut grants).await, "reader 4");
    releases.remove("reader 4").unwrap().send(()).unwrap();
    for task in tasks {
        task.await.expect("a contender panicked");
    }
    assert_eq!(backend.queue_len(&key).await.expect("queue"), 0);
}

/// A waiting reader watches the last writer ahead of it. When that writer
/// gives up, the reader looks again and watches the writer further ahead,
/// and is granted as soon as that one releases (not at its next lease
/// renewal, a third of the TTL later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_reader_follows_the_writers_ahead_of_it() {
    let Some((backend, locker)) = connect().await else {
        return;
    };
    let key = unique_key("etcd-rw-follow");
    let (written, lease) =
        common::a_waiter_follows_the_queue(&backend, &locker, &key, Mode::Shared, TTL).await;
    assert!(lease.fencing_token() > written);
    locker.release(lease).await.expect("release");
}

/// A reader that would wait on a semaphore's key is refused at once,
/// naming both modes, and leaves nothing in the queue.
#[tokio::test]
async fn a_waiting_reader_on_a_semaphore_is_refused_and_leaves_no_entry() {
    let Some((backend, locker)) = connect().await else {
        return;
    };
    let key = unique_key("etcd-rw-permits");
    let permit = locker
        .acquire_in(&key, Mode::semaphore(2), TTL, Wait::NONE)
        .await
        .expect("a permit");
    match locker.acquire_in(&key, Mode::Shared, TTL, WAIT).await {
        Err(Error::ModeConflict { held, asked, .. }) => {
            assert_eq!(held, Some(Mode::semaphore(2)));
            assert_eq!(asked, Mode::Shared);
        }
        other => panic!("a reader on a semaphore: {other:?}"),
    }
    assert_eq!(backend.queue_len(&key).await.expect("queue"), 1);
    locker.release(permit).await.expect("release");
}

/// An operator's forced release of a read-held key takes every reader's
/// hold, not only the first one's: the key is free at once.
#[tokio::test]
async fn a_forced_release_frees_a_key_that_readers_hold() {
    let Some((_backend, locker)) = connect().await else {
        return;
    };
    let key = unique_key("etcd-rw-force");
    let mut readers = Vec::new();
    for _ in 0..3 {
        let read = locker
            .acquire_in(&key, Mode::Shared, TTL, Wait::NONE)
            .await
            .expect("a reader");
        readers.push(read);
    }
    assert!(locker.force_release(&key).await.expect("force release"));
    let writer = locker
        .try_acquire(&key, TTL)
        .await
        .expect("the key is free");
    for mut read in readers {
        let extended = locker.extend(&mut read, TTL).await;
        assert!(matches!(extended, Err(Error::Lost { .. })), "{extended:?}");
    }
    locker.release(writer).await.expect("release");
    assert!(!locker.force_release(&key).await.expect("force release"));
}
