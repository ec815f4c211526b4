//! The batching task on a socket of its own (see [`crate::socket`]): it
//! writes its calls and reads their replies itself.
//!
//! The server answers the calls of one connection in the order they were
//! written, so the batches on the wire are a queue and each reply belongs
//! to the oldest. A caller that gave up waiting (its response timeout, or
//! its own bound where the batcher leaves the wait to its callers) does
//! not take its batch off that queue: the reply still comes, in its turn,
//! and what the caller asks next (giving back an acquire it never learned
//! the answer of, say) is written after it, so the server runs it after.
//! A broken connection fails the batches on it; the next batch connects
//! again (after a failed dial, not before a pause: see [`super::line`]). A
//! connection the server closes while no call is on the wire is opened
//! again at once. A connection whose oldest call has gone unanswered for
//! the response timeout takes no new calls (see [`send_batches`]).

use std::collections::VecDeque;
use std::time::Duration;

use futures_util::FutureExt;
use redis::{ErrorKind, RedisError, ServerErrorKind};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};

use super::line::Line;
use super::{Handout, IN_FLIGHT_ON_OWN_SOCKET, Queue, Request};
use crate::scripts::TokenRule;

/// With this many calls on the wire, the server has work to go on with, so
/// the next call leaves only once [`FULL_ENOUGH`] operations are waiting,
/// or once answers have brought the calls on the wire below this. Each
/// call costs the server about 20,000 instructions beside its operations,
/// and the client a `send` (on loopback, most of the client's CPU per
/// call); on a machine whose CPUs the client and the server share, that
/// is throughput. At 64 callers on two CPUs, the client's and the server's
/// CPU per acquire+release pair fell from about 10.4 µs to 8.6 µs
/// together, and pairs per second rose by about a sixth; at 1, 4, 16 and
/// 256 callers nothing moved beyond the noise (the `pairs` example).
///
/// Only for callers of one server ([`Handout::InRounds`]): a Redlock
/// caller waits for a majority of the nodes, and a call held back on one
/// node holds back the whole round (at 64 callers over five nodes on two
/// CPUs, the p99 of an acquire was about 7.5 ms with this rule in four
/// runs of five, and 3.6 to 5.5 ms without).
const BUSY_WIRE: usize = 2;

/// See [`BUSY_WIRE`].
const FULL_ENOUGH: usize = 8;

/// A batch written to the socket, waiting for its reply.
struct Sent {
    requests: Vec<Request>,
    /// Sent with the script's text (`EVAL`), after a `NOSCRIPT`.
    with_text: bool,
    /// When it was written: the oldest call on the wire unanswered for the
    /// response timeout makes the connection stalled.
    written: Instant,
}

/// Sends what has queued up as one call, up to [`IN_FLIGHT_ON_OWN_SOCKET`]
/// calls at a time, hands out the answers, and repeats, until every
/// [`Batcher`](super::Batcher) is dropped.
///
/// While the oldest call on the wire has gone unanswered for the response
/// timeout (a paused or hung server), the connection is stalled: a request
/// asked then fails at once, unsent, rather than queue behind calls that
/// may never be answered (on a busy client, that queue would grow by every
/// request until the server answers). Only a request whose claim is on the
/// wire, or waits already, still waits (a release giving back a stuck
/// acquire, say), so that it runs after it; there are no more of those than
/// operations on the wire and waiting. A request kept once, or asked before
/// the stall, is never refused later: the call it follows may have run.
pub(super) async fn send_batches(
    mut line: Line,
    rule: TokenRule,
    handout: Handout,
    mut requests: mpsc::UnboundedReceiver<Request>,
) {
    let mut queue = Queue::new(handout);
    let mut on_wire: VecDeque<Sent> = VecDeque::new();
    // Batches the server answered `NOSCRIPT` (a restarted or flushed
    // server): sent again, first, with the script's text, which loads it.
    let mut again: VecDeque<Vec<Request>> = VecDeque::new();
    let mut open = true;
    // Whether the connection has answered a call since it was opened.
    let mut answered = false;
    let response_timeout = line.response_timeout();
    // Not open yet (started in the background): dialled now, before the
    // first call asks; the calls asked meanwhile wait in the channel.
    if line.socket().is_none() {
        let _ = line.connected().await;
    }
    loop {
        queue.hand_out();
        if let Err(e) = write_batches(&mut line, &rule, &mut queue, &mut on_wire, &mut again).await
        {
            fail(&mut queue, &mut line, &mut on_wire, &mut again, e);
        }
        if !open && on_wire.is_empty() && again.is_empty() && queue.is_empty() {
            return;
        }
        // A response timeout too long for the clock (`Duration::MAX`) means
        // "as long as it takes": the connection never stalls.
        let stalls_at = on_wire
            .front()
            .and_then(|sent| sent.written.checked_add(response_timeout));
        let stalled = stalls_at.is_some_and(|at| Instant::now() >= at);
        // The requests received in this pass are those after these.
        let waited = queue.waiting();
        tokio::select! {
            biased;
            // Read also while no call is on the wire, so that a connection
            // the server closes is noticed before the next call is written.
            read = read_more(&mut line) => {
                let idle = on_wire.is_empty();
                match read.and_then(|()| take_replies(&mut line, &mut queue, &mut on_wire, &mut again)) {
                    Ok(taken) => answered |= taken > 0,
                    Err(e) => {
                        fail(&mut queue, &mut line, &mut on_wire, &mut again, e);
                        // Closed while idle (the server's `timeout`, a proxy's
                        // idle limit, `CLIENT KILL`): opened again now, so the
                        // next call does not wait for it. Only after a
                        // connection that answered calls: one closed at once,
                        // again and again, would otherwise be reopened in a loop.
                        if idle && answered {
                            let _ = line.connected().await;
                        }
                        answered = false;
                    }
                }
            }
            // While stalled, requests are taken (to be refused) even when
            // the queue is full.
            received = queue.receive(&mut requests), if open && (queue.has_room() || stalled) => {
                open = received;
                if open {
                    queue.gather_ready(&mut requests).await;
                    let stalled_now = |on_wire: &VecDeque<Sent>| {
                        on_wire.front().is_some_and(|sent| sent.written.elapsed() >= response_timeout)
                    };
                    if stalled_now(&on_wire) {
                        // Replies that have come already are taken first: a
                        // server that has just answered is not stalled.
                        if let Some(read) = read_more(&mut line).now_or_never() {
                            match read.and_then(|()| take_replies(&mut line, &mut queue, &mut on_wire, &mut again)) {
                                Ok(taken) => answered |= taken > 0,
                                Err(e) => fail(&mut queue, &mut line, &mut on_wire, &mut again, e),
                            }
                        }
                        if stalled_now(&on_wire) {
                            queue.refuse_new(waited, || not_sent(response_timeout));
                        }
                    }
                }
            }
            // A full queue takes no requests, so the moment the connection
            // stalls is awaited here.
            () = sleep_until_if(stalls_at), if stalls_at.is_some() && !stalled && !queue.has_room() => {}
            // More answers to hand out: the callers answered so far go first.
            () = tokio::task::yield_now(), if queue.has_answers() => {}
        }
    }
}

/// Sleeps until `at`; never ready without it. The timer is only made when
/// polled (`select!` makes every branch's future on each pass, also a
/// disabled one's).
async fn sleep_until_if(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Writes the batches that are ready, while there is room on the wire,
/// connecting first if the connection is closed.
async fn write_batches(
    line: &mut Line,
    rule: &TokenRule,
    queue: &mut Queue,
    on_wire: &mut VecDeque<Sent>,
    again: &mut VecDeque<Vec<Request>>,
) -> redis::RedisResult<()> {
    let room = |on_wire: &VecDeque<Sent>| on_wire.len() < IN_FLIGHT_ON_OWN_SOCKET;
    if !room(on_wire) || (again.is_empty() && !queue.has_ready()) {
        return Ok(());
    }
    // The server has work: fewer, fuller calls cost both sides less.
    if again.is_empty()
        && queue.fills_calls()
        && on_wire.len() >= BUSY_WIRE
        && queue.waiting() < FULL_ENOUGH
    {
        return Ok(());
    }
    let socket = match line.connected().await {
        Ok(socket) => socket,
        Err(e) => {
            // Nothing can be sent: what is ready fails, rather than
            // try again at once.
            fail_all(queue, on_wire, again, e.clone());
            while let batch = queue.next_batch()
                && !batch.is_empty()
            {
                queue.answer(batch, Err(e.clone()));
            }
            return Ok(());
        }
    };
    let written = Instant::now();
    while room(on_wire) {
        let (requests, with_text) = match again.pop_front() {
            Some(requests) => (requests, true),
            None => (queue.next_batch(), false),
        };
        if requests.is_empty() {
            break;
        }
        super::command(rule, &requests, with_text).write_packed_command(&mut socket.out);
        on_wire.push_back(Sent {
            requests,
            with_text,
            written,
        });
    }
    socket.flush().await
}

/// Why a request was not sent: the connection is stalled.
fn not_sent(response_timeout: Duration) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("not sent: the server has left a call unanswered for over {response_timeout:?}"),
    ))
}

/// Waits for more of the replies; never ready without a connection.
async fn read_more(line: &mut Line) -> redis::RedisResult<()> {
    match line.socket() {
        Some(socket) => socket.read_more().await,
        None => std::future::pending().await,
    }
}

/// Takes every complete reply read so far, each for the oldest batch on
/// the wire; returns how many.
fn take_replies(
    line: &mut Line,
    queue: &mut Queue,
    on_wire: &mut VecDeque<Sent>,
    again: &mut VecDeque<Vec<Request>>,
) -> redis::RedisResult<usize> {
    let Some(socket) = line.socket() else {
        return Ok(0);
    };
    let mut taken = 0;
    while let Some(reply) = socket.take_reply()? {
        taken += 1;
        let Some(sent) = on_wire.pop_front() else {
            return Err(RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "the server answered a call that was not sent",
            )));
        };
        let answers = reply.into_answers(sent.requests.len());
        match answers {
            Err(e)
                if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) && !sent.with_text =>
            {
                again.push_back(sent.requests);
            }
            answers => queue.answer(sent.requests, answers),
        }
    }
    Ok(taken)
}

/// The connection broke: the batches on it fail with `error`, and the
/// next batch connects again. Whether the server ran them is unknown, as
/// on any connection that breaks mid-call.
fn fail(
    queue: &mut Queue,
    line: &mut Line,
    on_wire: &mut VecDeque<Sent>,
    again: &mut VecDeque<Vec<Request>>,
    error: RedisError,
) {
    tracing::debug!(
        error = %crate::errors::describe(&error),
        calls_on_the_wire = on_wire.len(),
        "the batcher's connection broke"
    );
    line.close();
    fail_all(queue, on_wire, again, error);
}

/// The batches on the wire, and those waiting to be sent again, fail with `error`.
fn fail_all(
    queue: &mut Queue,
    on_wire: &mut VecDeque<Sent>,
    again: &mut VecDeque<Vec<Request>>,
    error: RedisError,
) {
    for sent in on_wire.drain(..) {
        queue.answer(sent.requests, Err(error.clone()));
    }
    for requests in again.drain(..) {
        queue.answer(requests, Err(error.clone()));
    }
}
