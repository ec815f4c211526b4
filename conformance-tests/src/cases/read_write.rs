//! Read-write locks: any number of readers, or one writer (the key's
//! exclusive lock). The cases read `capabilities()`: a backend without
//! read-write locks must refuse them with `Unsupported` and its reason,
//! and the other cases skip it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use lock_core::{Error, GuardOptions, Mode, Offer, Wait};

use super::in_mode;
use super::{LONG_TTL, SLACK, within};
use crate::Fixture;

fn offers_read_write(fx: &Fixture) -> bool {
    fx.locker.capabilities().offer(&Mode::Shared).is_offered()
}

/// A backend offers read-write locks, or refuses them before any call,
/// with `Unsupported` and the reason its capabilities give.
pub async fn read_write_is_offered_or_refused_with_a_reason(fx: &Fixture) {
    let key = fx.key("rw-offer");
    let asked = fx.locker.read_write(&key, GuardOptions::new(LONG_TTL));
    match fx.locker.capabilities().offer(&Mode::Shared) {
        Offer::Offered { .. } => {
            let read = asked
                .expect("an offered mode")
                .read()
                .await
                .expect("a read hold");
            read.release().await.expect("release");
        }
        Offer::Refused { reason } => {
            in_mode::refused_with_the_reason(asked, reason, "read-write locks");
            let direct = fx
                .locker
                .acquire_in(&key, Mode::Shared, LONG_TTL, Wait::NONE)
                .await;
            assert!(
                matches!(direct, Err(Error::Unsupported { .. })),
                "{direct:?}"
            );
        }
        other => panic!("unknown offer {other:?}"),
    }
}

/// Readers from two clients hold at once; a writer is refused while they
/// do, and readers while it does. Every grant has its own token, and the
/// writer's is above every reader's.
pub async fn readers_share_and_a_writer_excludes_them(fx: &Fixture) {
    if !offers_read_write(fx) {
        return;
    }
    let key = fx.key("rw-share");
    let options = GuardOptions::new(LONG_TTL);
    let here = fx.locker.read_write(&key, options).expect("read-write");
    let there = fx.other.read_write(&key, options).expect("read-write");
    let first = here.read().await.expect("reader 1");
    let second = there.read().await.expect("reader 2");
    assert!(second.fencing_token() > first.fencing_token());
    match fx.locker.inspect(&key).await {
        Ok(held) => {
            assert_eq!(held.len(), 2, "one entry per reader: {held:?}");
            assert!(held.iter().all(|h| h.mode == Mode::Shared), "{held:?}");
        }
        Err(e) => assert!(e.is_unsupported(), "{e}"),
    }
    let writer = there.write().await;
    assert!(
        matches!(writer, Err(Error::Contended { .. })),
        "a writer while readers hold: {writer:?}"
    );
    let last_read = second.fencing_token();
    first.release().await.expect("release");
    second.release().await.expect("release");
    let written = here.write().await.expect("the writer, once readers left");
    assert!(
        written.fencing_token() > last_read,
        "a writer's token above every reader's"
    );
    let reader = there.read().await;
    assert!(
        matches!(reader, Err(Error::Contended { .. })),
        "a reader while a writer holds: {reader:?}"
    );
    let plain = fx.other.try_acquire(&key, LONG_TTL).await;
    assert!(
        matches!(plain, Err(Error::Contended { .. })),
        "a plain lock is the writer's: {plain:?}"
    );
    let write_token = written.fencing_token();
    written.release().await.expect("release");
    let after = there.read().await.expect("a reader after the writer");
    assert!(after.fencing_token() > write_token);
    after.release().await.expect("release");
}

/// A writer that waits for readers blocks new readers (so a stream of
/// readers cannot starve it), and gets in once the readers leave.
pub async fn a_waiting_writer_blocks_new_readers(fx: &Fixture) {
    if !offers_read_write(fx) {
        return;
    }
    let key = fx.key("rw-writer-waits");
    let options = GuardOptions::new(LONG_TTL);
    let readers = fx.locker.read_write(&key, options).expect("read-write");
    let reading = readers.read().await.expect("a reader");
    let writer = {
        let writers = fx
            .other
            .read_write(&key, options.wait(SLACK * 2))
            .expect("read-write");
        tokio::spawn(async move { writers.write().await })
    };
    // Readers get in until the writer's wait is known; then they are refused.
    let refused = within(
        SLACK,
        "a new reader is refused behind the waiting writer",
        async {
            loop {
                match readers.read().await {
                    Ok(read) => read.release().await.expect("release"),
                    Err(Error::Contended { .. }) => return,
                    Err(e) => panic!("a reader: {e}"),
                }
                tokio::task::yield_now().await;
            }
        },
    );
    refused.await;
    assert!(!writer.is_finished(), "the writer got in beside a reader");
    let last_read = reading.fencing_token();
    reading.release().await.expect("release");
    let written = within(
        SLACK * 2,
        "the writer gets in once the readers leave",
        writer,
    )
    .await
    .expect("task")
    .expect("the writer");
    assert!(written.fencing_token() > last_read);
    written.release().await.expect("release");
}

/// An expired reader frees the key: a writer gets in after its TTL, and
/// the reader can no longer extend.
pub async fn an_expired_reader_frees_the_key(fx: &Fixture) {
    if !offers_read_write(fx) {
        return;
    }
    in_mode::an_expired_hold_frees_the_key(fx, "rw-expiry", Mode::Shared, Mode::Exclusive).await;
}

/// Read holds, permits and exclusive grants do not mix: a semaphore on a
/// read-held key, and a reader on a semaphore's key, are mode conflicts.
pub async fn readers_and_semaphores_do_not_mix(fx: &Fixture) {
    let caps = fx.locker.capabilities();
    if !offers_read_write(fx) || !caps.offer(&Mode::semaphore(2)).is_offered() {
        return;
    }
    let key = fx.key("rw-semaphore");
    let read = fx
        .locker
        .acquire_in(&key, Mode::Shared, LONG_TTL, Wait::NONE)
        .await
        .expect("a reader");
    let permit = fx
        .other
        .acquire_in(&key, Mode::semaphore(2), LONG_TTL, Wait::NONE)
        .await;
    assert!(
        matches!(permit, Err(Error::ModeConflict { .. })),
        "{permit:?}"
    );
    fx.locker.release(read).await.expect("release");
    let permit = fx
        .other
        .acquire_in(&key, Mode::semaphore(2), LONG_TTL, Wait::NONE)
        .await
        .expect("a permit on the free key");
    let read = fx
        .locker
        .acquire_in(&key, Mode::Shared, LONG_TTL, Wait::NONE)
        .await;
    match read {
        Err(e @ Error::ModeConflict { .. }) => {
            assert!(e.to_string().contains("semaphore"), "{e}");
        }
        other => panic!("a reader on a semaphore's key: {other:?}"),
    }
    fx.other.release(permit).await.expect("release");
}

/// No writer overlaps anyone: 16 readers and 8 writers from two clients,
/// each holding twice, counted while they hold.
pub async fn no_writer_overlaps_anyone_under_contention(fx: &Fixture) {
    if !offers_read_write(fx) {
        return;
    }
    let key = fx.key("rw-crowd");
    let readers_in = Arc::new(AtomicUsize::new(0));
    let writers_in = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..24)
        .map(|i| {
            let locker = if i % 2 == 0 { &fx.locker } else { &fx.other };
            let lock = locker
                .read_write(&key, GuardOptions::new(LONG_TTL).wait(SLACK * 2))
                .expect("read-write");
            let writes = i % 3 == 0;
            let (readers_in, writers_in, overlaps) =
                (readers_in.clone(), writers_in.clone(), overlaps.clone());
            tokio::spawn(async move {
                for _ in 0..2 {
                    if writes {
                        let hold = lock.write().await.expect("the writer");
                        if writers_in.fetch_add(1, Ordering::SeqCst) > 0
                            || readers_in.load(Ordering::SeqCst) > 0
                        {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        tokio::task::yield_now().await;
                        writers_in.fetch_sub(1, Ordering::SeqCst);
                        hold.release().await.expect("release");
                    } else {
                        let hold = lock.read().await.expect("a reader");
                        readers_in.fetch_add(1, Ordering::SeqCst);
                        if writers_in.load(Ordering::SeqCst) > 0 {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        tokio::task::yield_now().await;
                        readers_in.fetch_sub(1, Ordering::SeqCst);
                        hold.release().await.expect("release");
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        within(SLACK * 4, "every reader and writer gets in", task)
            .await
            .expect("task");
    }
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "a writer overlapped another holder"
    );
}

/// A read attempt dropped on its way gives its hold back at once, not
/// after its (hour-long) TTL: a writer gets in soon after.
pub async fn dropped_read_attempt_gives_its_hold_back(fx: &Fixture) {
    if !offers_read_write(fx) {
        return;
    }
    in_mode::dropped_attempts_give_their_hold_back(fx, "rw-dropped", Mode::Shared, Mode::Exclusive)
        .await;
}
