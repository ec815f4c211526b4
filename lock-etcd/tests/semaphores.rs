//! What is special about semaphores on etcd (on the shared cluster): permits
//! share the lock's queue with the exclusive lock, so a caller in another
//! mode, even one that would wait, is refused at once and leaves nothing
//! in the queue; a full semaphore reports its first holder's time left;
//! and permit waiters are let in in the order they queued.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use conformance_tests::{server_url, unique_key};
use lock_core::{Error, Locker, Mode, Offer, Wait, WaitingOrder};
use lock_etcd::EtcdBackend;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(30);
const WAIT: Wait = Wait::at_most(Duration::from_secs(20));

async fn connect() -> Option<(EtcdBackend, Locker)> {
    let url = server_url("LOCKKIT_ETCD_URL")?;
    let backend = EtcdBackend::connect(&url).await.expect("connect");
    Some((backend.clone(), Locker::new(backend)))
}

#[tokio::test]
async fn each_permit_is_an_entry_of_the_queue() {
    let Some((backend, locker)) = connect().await else {
        return;
    };
    let key = unique_key("etcd-permits");
    let two = Mode::semaphore(2);
    let first = locker
        .acquire_in(&key, two, TTL, Wait::NONE)
        .await
        .expect("permit 1");
    let second = locker
        .acquire_in(&key, two, TTL, Wait::NONE)
        .await
        .expect("permit 2");
    assert_eq!(backend.queue_len(&key).await.expect("queue"), 2);
    // The holder etcd reports is the first permit's, by create revision.
    let head = backend.holder(&key).await.expect("holder").expect("held");
    assert_eq!(head.fencing_token, first.fencing_token());
    match locker.acquire_in(&key, two, TTL, Wait::NONE).await {
        Err(Error::Contended { remaining, .. }) => {
            let left = remaining.expect("the first permit's time left");
            assert!(left <= TTL, "{left:?}");
        }
        other => panic!("a third permit of 2: {other:?}"),
    }
    // The refused attempt wrote nothing that stays.
    assert_eq!(backend.queue_len(&key).await.expect("queue"), 2);
    locker.release(first).await.expect("release");
    locker.release(second).await.expect("release");
    assert_eq!(backend.queue_len(&key).await.expect("queue"), 0);
}

#[tokio::test]
async fn a_waiter_in_another_mode_is_refused_at_once_and_leaves_no_entry() {
    let Some((backend, locker)) = connect().await else {
        return;
    };
    let key = unique_key("etcd-permit-modes");
    let permit = locker
        .acquire_in(&key, Mode::semaphore(3), TTL, Wait::NONE)
        .await
        .expect("a permit");
    // An exclusive waiter would otherwise queue behind the permits.
    let exclusive = locker.acquire(&key, TTL, WAIT).await;
    match exclusive {
        Err(Error::ModeConflict { held, asked, .. }) => {
            assert_eq!(held, Some(Mode::semaphore(3)));
            assert_eq!(asked, Mode::Exclusive);
        }
        other => panic!("an exclusive waiter on a semaphore: {other:?}"),
    }
    let other_number = locker.acquire_in(&key, Mode::semaphore(4), TTL, WAIT).await;
    assert!(
        matches!(
            other_number,
            Err(Error::ModeConflict {
                held: Some(Mode::Semaphore { permits: 3 }),
                ..
            })
        ),
        "{other_number:?}"
    );
    locker.release(permit).await.expect("release");
    assert_eq!(backend.queue_len(&key).await.expect("queue"), 0);

    let plain = locker.try_acquire(&key, TTL).await.expect("free again");
    let on_plain = locker.acquire_in(&key, Mode::semaphore(3), TTL, WAIT).await;
    assert!(
        matches!(
            on_plain,
            Err(Error::ModeConflict {
                held: Some(Mode::Exclusive),
                ..
            })
        ),
        "{on_plain:?}"
    );
    assert_eq!(backend.queue_len(&key).await.expect("queue"), 1);
    locker.release(plain).await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn permit_waiters_are_let_in_in_the_order_they_queued() {
    let Some((backend, locker)) = connect().await else {
        return;
    };
    assert!(
        matches!(
            locker.capabilities().offer(&Mode::semaphore(2)),
            Offer::Offered {
                waiting_order: WaitingOrder::Fifo { .. }
            }
        ),
        "etcd says its permit waiters are served in order"
    );
    const WAITERS: usize = 6;
    let key = unique_key("etcd-permit-line");
    let two = Mode::semaphore(2);
    // One permit stays held throughout, so the other is handed along the
    // line one waiter at a time.
    let kept = locker
        .acquire_in(&key, two, TTL, Wait::NONE)
        .await
        .expect("permit 1");
    let passed = locker
        .acquire_in(&key, two, TTL, Wait::NONE)
        .await
        .expect("permit 2");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let (locker, k, order) = (locker.clone(), key.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let permit = locker
                .acquire_in(&k, two, TTL, WAIT)
                .await
                .expect("a permit");
            order.lock().unwrap().push(i);
            locker.release(permit).await.expect("release");
        }));
        // The next waiter starts only once this one is in line.
        let deadline = Instant::now() + Duration::from_secs(20);
        while backend.queue_len(&key).await.expect("queue") < i + 3 {
            assert!(Instant::now() < deadline, "waiter {i} never queued");
            tokio::task::yield_now().await;
        }
    }
    locker.release(passed).await.expect("release");
    for waiter in waiters {
        waiter.await.expect("waiter");
    }
    assert_eq!(*order.lock().unwrap(), (0..WAITERS).collect::<Vec<_>>());
    locker.release(kept).await.expect("release");
}
