//! The checker: reads the recorded histories and the resource's own counts
//! and reports what went wrong in one run.

use std::collections::HashMap;

use serde::Serialize;

use crate::clock::ms;
use crate::history::{Event, Kind, Op};
use crate::resource::Stats;
use crate::workload::{Hold, Workload};

/// A grant that certainly happened, and the interval during which its holder
/// certainly held the lock (as far as the contract goes): from the acquire's
/// completion to the earlier of the release's invocation and the deadline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Held {
    /// Client.
    pub c: u32,
    /// The acquire's `n`.
    pub n: u64,
    /// Fencing token.
    pub token: u64,
    /// Acquire invoked.
    pub invoked: u64,
    /// Acquire completed: the interval starts.
    pub start: u64,
    /// The interval ends.
    pub end: u64,
    /// The lease's deadline.
    pub deadline: u64,
    /// How it held the key.
    pub hold: Hold,
}

/// What the checker found in one run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Findings {
    /// Grants that certainly happened.
    pub grants: u64,
    /// Overlaps of "definitely held" intervals that the mode forbids:
    /// pairs of different clients' grants where both are exclusive, or one
    /// is a writer; for a semaphore, grants that began while N others held.
    pub overlaps: u64,
    /// The longest such overlap (a semaphore: the longest time with more
    /// than N holders), ms.
    pub longest_overlap_ms: f64,
    /// The first overlap, in words.
    pub overlap_example: Option<String>,
    /// The most "definitely held" intervals at one instant.
    pub max_holders: u64,
    /// The most clients inside the resource at once, as the resource saw
    /// them (a holder paused inside stays inside, whatever the lock says).
    pub resource_most_inside: u64,
    /// Entries into the resource that put a writer beside another client.
    pub resource_writer_overlaps: u64,
    /// Unfenced counter: writes applied minus final value.
    pub lost_updates: u64,
    /// Unfenced writes that completed after their holder's deadline.
    pub late_writes: u64,
    /// Fenced counter: writes applied minus final value.
    pub fenced_lost_updates: u64,
    /// Fenced reads refused.
    pub stale_reads_rejected: u64,
    /// Fenced writes refused.
    pub stale_writes_rejected: u64,
    /// Fenced writes accepted with a token below one already admitted.
    pub stale_writes_accepted: u64,
    /// Grants whose token is not above the token of a grant that completed
    /// before they were invoked.
    pub token_regressions: u64,
    /// The first regression, in words.
    pub regression_example: Option<String>,
    /// Longest time without a grant from the fault's start to the end of
    /// the run, ms (from the fault to the next grant, or between grants).
    pub unavailable_ms: f64,
    /// Operations whose effect is unknown: an error after which a grant or a
    /// release may or may not have happened, or an invocation that never
    /// completed (its process was killed or paused to the end).
    pub indeterminate: u64,
    /// Acquires that failed for certain (contended, timed out waiting).
    pub failed_acquires: u64,
}

/// Pairs invocations with completions; returns (invocation, completion).
fn pairs(events: &[Event]) -> Vec<(&Event, Option<&Event>)> {
    let mut done: HashMap<(u32, u64), &Event> = HashMap::new();
    for e in events.iter().filter(|e| e.kind != Kind::Invoke) {
        done.insert((e.c, e.n), e);
    }
    events
        .iter()
        .filter(|e| e.kind == Kind::Invoke)
        .map(|e| (e, done.get(&(e.c, e.n)).copied()))
        .collect()
}

/// The "definitely held" intervals of a history.
pub fn held_intervals(events: &[Event]) -> Vec<Held> {
    let pairs = pairs(events);
    let releases: HashMap<(u32, u64), u64> = pairs
        .iter()
        .filter(|(i, _)| i.op == Op::Release)
        .filter_map(|(i, _)| Some(((i.c, i.grant?), i.at)))
        .collect();
    let mut held: Vec<Held> = pairs
        .iter()
        .filter(|(i, _)| i.op == Op::Acquire)
        .filter_map(|(i, done)| {
            let done = done.filter(|d| d.kind == Kind::Ok)?;
            let deadline = done.deadline?;
            let end = releases
                .get(&(i.c, i.n))
                .map_or(deadline, |&released| released.min(deadline));
            Some(Held {
                c: i.c,
                n: i.n,
                token: done.token?,
                invoked: i.at,
                start: done.at,
                end: end.max(done.at),
                deadline,
                hold: done.hold.unwrap_or(Hold::Exclusive),
            })
        })
        .collect();
    held.sort_by_key(|h| (h.start, h.c));
    held
}

/// Overlapping pairs of different clients whose holds conflict under
/// `workload`: count, longest in ns, first example.
pub fn overlaps(held: &[Held], workload: Workload) -> (u64, u64, Option<(Held, Held)>) {
    let (mut count, mut longest, mut first) = (0, 0, None);
    for (i, a) in held.iter().enumerate() {
        for b in held[i + 1..].iter().take_while(|b| b.start < a.end) {
            let overlap = a.end.min(b.end).saturating_sub(b.start);
            if b.c != a.c && overlap > 0 && workload.conflict(a.hold, b.hold) {
                count += 1;
                longest = longest.max(overlap);
                first.get_or_insert((*a, *b));
            }
        }
    }
    (count, longest, first)
}

/// The holders at once, counted by overlap depth (an interval ends before
/// one that starts at the same instant): the most at one instant, the grants
/// that began while `allowed` others held, the longest time with more than
/// `allowed` holders (ns), and the holders at the first such grant.
pub fn depth(held: &[Held], allowed: u64) -> (u64, u64, u64, Vec<Held>) {
    let mut edges: Vec<(u64, bool)> = held
        .iter()
        .filter(|h| h.end > h.start)
        .flat_map(|h| [(h.start, true), (h.end, false)])
        .collect();
    // At one instant, ends (false) before starts (true).
    edges.sort_unstable();
    let (mut now, mut most, mut over, mut longest) = (0u64, 0, 0, 0);
    let mut above_since = None;
    let mut first = Vec::new();
    for (at, starts) in edges {
        if starts {
            now += 1;
            most = most.max(now);
            if now > allowed {
                over += 1;
                above_since.get_or_insert(at);
                if first.is_empty() {
                    first = held
                        .iter()
                        .filter(|h| h.start <= at && at < h.end)
                        .copied()
                        .collect();
                }
            }
        } else {
            now -= 1;
            if now <= allowed
                && let Some(since) = above_since.take()
            {
                longest = longest.max(at - since);
            }
        }
    }
    (most, over, longest, first)
}

/// Grants whose token does not exceed that of a grant completed before
/// they were invoked: count and first example (earlier, later).
pub fn regressions(held: &[Held]) -> (u64, Option<(Held, Held)>) {
    let mut by_completion: Vec<&Held> = held.iter().collect();
    by_completion.sort_by_key(|h| h.start);
    let mut by_invocation: Vec<&Held> = held.iter().collect();
    by_invocation.sort_by_key(|h| h.invoked);
    let (mut count, mut first) = (0, None);
    let mut best: Option<&Held> = None;
    let mut k = 0;
    for b in by_invocation {
        while k < by_completion.len() && by_completion[k].start < b.invoked {
            let a = by_completion[k];
            if best.is_none_or(|m| a.token > m.token) {
                best = Some(a);
            }
            k += 1;
        }
        if let Some(a) = best
            && b.token <= a.token
        {
            count += 1;
            first.get_or_insert((*a, *b));
        }
    }
    (count, first)
}

/// Checks one run: `fault_at` is when the fault was injected, `end` when
/// the clients were told to stop (both on the shared clock); `deaths` are
/// clients the harness killed, and when: a dead process holds nothing, so
/// its interval ends there at the latest.
pub fn check(
    events: &[Event],
    stats: &Stats,
    fault_at: u64,
    end: u64,
    deaths: &[(u32, u64)],
    workload: Workload,
) -> Findings {
    let mut held = held_intervals(events);
    for h in &mut held {
        if let Some(&(_, died)) = deaths.iter().find(|(c, _)| *c == h.c) {
            h.end = h.end.min(died).max(h.start);
        }
    }
    let (max_holders, over_limit, longest_over, crowd) =
        depth(&held, workload.holders_allowed().unwrap_or(u64::MAX));
    let (overlap_count, longest, example) = overlaps(&held, workload);
    let (regression_count, regression) = regressions(&held);
    let deadline_of: HashMap<(u32, u64), u64> =
        held.iter().map(|h| ((h.c, h.n), h.deadline)).collect();
    let pairs = pairs(events);
    let late_writes = pairs
        .iter()
        .filter(|(i, _)| i.op == Op::Write)
        .filter_map(|(i, done)| Some((deadline_of.get(&(i.c, i.grant?))?, done.as_ref()?.at)))
        .filter(|(deadline, completed)| completed > deadline)
        .count() as u64;
    let indeterminate = pairs
        .iter()
        .filter(|(_, done)| done.is_none_or(|d| d.kind == Kind::Info))
        .count() as u64;
    let failed_acquires = pairs
        .iter()
        .filter(|(i, done)| i.op == Op::Acquire && done.is_some_and(|d| d.kind == Kind::Fail))
        .count() as u64;

    let mut grants_after: Vec<u64> = held
        .iter()
        .map(|h| h.start)
        .filter(|&t| t >= fault_at && t <= end)
        .collect();
    grants_after.sort_unstable();
    let mut last = fault_at;
    let mut gap = 0;
    for t in grants_after.iter().copied().chain([end]) {
        gap = gap.max(t.saturating_sub(last));
        last = t;
    }

    let describe = |a: &Held, b: &Held| {
        format!(
            "client {} (token {}) held until +{:.0} ms; client {} (token {}) granted at +{:.0} ms",
            a.c,
            a.token,
            ms(fault_at, a.end),
            b.c,
            b.token,
            ms(fault_at, b.start)
        )
    };
    let (overlaps, longest, overlap_example) =
        if workload.conflict(Hold::Exclusive, Hold::Exclusive) {
            (
                overlap_count,
                longest,
                example.map(|(a, b)| describe(&a, &b)),
            )
        } else {
            let example = (!crowd.is_empty()).then(|| {
                let who: Vec<String> = crowd
                    .iter()
                    .map(|h| {
                        format!(
                            "client {} (token {}, +{:.0} to +{:.0} ms)",
                            h.c,
                            h.token,
                            ms(fault_at, h.start),
                            ms(fault_at, h.end)
                        )
                    })
                    .collect();
                format!("{} held at once: {}", crowd.len(), who.join(", "))
            });
            (over_limit, longest_over, example)
        };
    Findings {
        grants: held.len() as u64,
        overlaps,
        longest_overlap_ms: longest as f64 / 1e6,
        overlap_example,
        max_holders,
        resource_most_inside: stats.most_inside,
        resource_writer_overlaps: stats.writer_overlaps,
        lost_updates: stats.writes.saturating_sub(stats.counter),
        late_writes,
        fenced_lost_updates: stats.fenced_writes.saturating_sub(stats.fenced_counter),
        stale_reads_rejected: stats.stale_reads_rejected,
        stale_writes_rejected: stats.stale_writes_rejected,
        stale_writes_accepted: stats.stale_writes_accepted,
        token_regressions: regression_count,
        regression_example: regression.map(|(a, b)| {
            format!(
                "client {} got token {} at +{:.0} ms, after client {} got token {} at +{:.0} ms",
                b.c,
                b.token,
                ms(fault_at, b.start),
                a.c,
                a.token,
                ms(fault_at, a.start)
            )
        }),
        unavailable_ms: gap as f64 / 1e6,
        indeterminate,
        failed_acquires,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(c: u32, n: u64, token: u64, inv: u64, ok: u64, deadline: u64) -> [Event; 2] {
        [
            Event::new(c, n, Op::Acquire, Kind::Invoke, inv),
            Event {
                token: Some(token),
                deadline: Some(deadline),
                ..Event::new(c, n, Op::Acquire, Kind::Ok, ok)
            },
        ]
    }

    fn release(c: u32, n: u64, grant: u64, at: u64) -> Event {
        Event {
            grant: Some(grant),
            ..Event::new(c, n, Op::Release, Kind::Invoke, at)
        }
    }

    #[test]
    fn intervals_end_at_the_release_or_the_deadline_whichever_is_first() {
        let mut h: Vec<Event> = grant(1, 1, 10, 0, 5, 100).into();
        h.push(release(1, 2, 1, 50));
        h.extend(grant(2, 1, 11, 0, 60, 90));
        h.push(release(2, 2, 1, 200)); // paused past its deadline
        let held = held_intervals(&h);
        assert_eq!((held[0].start, held[0].end), (5, 50));
        assert_eq!((held[1].start, held[1].end), (60, 90));
        assert_eq!(overlaps(&held, Workload::Mutex).0, 0);
        assert_eq!(regressions(&held).0, 0);
    }

    #[test]
    fn overlapping_grants_and_lower_tokens_are_found() {
        let mut h: Vec<Event> = grant(1, 1, 10, 0, 5, 100).into();
        h.extend(grant(2, 1, 9, 20, 40, 140)); // while 1 still holds, older token
        h.extend(grant(3, 1, 12, 150, 160, 200));
        let held = held_intervals(&h);
        let (count, longest, first) = overlaps(&held, Workload::Mutex);
        assert_eq!((count, longest), (1, 60));
        let (a, b) = first.unwrap();
        assert_eq!((a.c, b.c), (1, 2));
        let (regressed, example) = regressions(&held);
        assert_eq!(regressed, 1);
        assert_eq!(example.unwrap().1.token, 9);
    }

    #[test]
    fn a_killed_holder_holds_nothing_after_its_death() {
        let mut h: Vec<Event> = grant(1, 1, 10, 0, 5, 100).into();
        h.extend(grant(2, 1, 11, 6, 40, 140));
        assert_eq!(
            check(&h, &Stats::default(), 0, 200, &[], Workload::Mutex).overlaps,
            1
        );
        assert_eq!(
            check(&h, &Stats::default(), 0, 200, &[(1, 30)], Workload::Mutex).overlaps,
            0
        );
    }

    #[test]
    fn unknown_outcomes_and_unavailability_are_counted() {
        let mut h: Vec<Event> = grant(1, 1, 10, 0, 5, 100).into();
        h.push(Event::new(2, 1, Op::Acquire, Kind::Invoke, 10)); // killed mid-call
        h.push(Event::new(3, 1, Op::Acquire, Kind::Invoke, 10));
        h.push(Event::new(3, 1, Op::Acquire, Kind::Info, 30));
        h.extend(grant(1, 2, 11, 300, 1_000_000_300, 2_000_000_000));
        let f = check(
            &h,
            &Stats::default(),
            100,
            3_000_000_000,
            &[],
            Workload::Mutex,
        );
        assert_eq!(f.indeterminate, 2);
        assert_eq!(f.grants, 2);
        // From the fault to the next grant (~1 s), then to the end (~2 s).
        assert!(
            (f.unavailable_ms - 2000.0).abs() < 0.01,
            "{}",
            f.unavailable_ms
        );
    }

    fn hold(mut events: [Event; 2], hold: Hold) -> [Event; 2] {
        events[1].hold = Some(hold);
        events
    }

    #[test]
    fn a_semaphore_counts_holders_by_depth_not_by_pairs() {
        let sem = Workload::Semaphore { permits: 2 };
        let mut h: Vec<Event> = hold(grant(1, 1, 10, 0, 10, 100), Hold::Permit).into();
        h.extend(hold(grant(2, 1, 11, 0, 20, 100), Hold::Permit));
        h.push(release(2, 2, 1, 50));
        // Begins as 2 ends: never more than two at once.
        h.extend(hold(grant(3, 1, 12, 0, 50, 100), Hold::Permit));
        let f = check(&h, &Stats::default(), 0, 200, &[], sem);
        assert_eq!((f.max_holders, f.overlaps), (2, 0));
        // A fourth client while three hold (1, 3 and 4, from 60 to 80).
        h.extend(hold(grant(4, 1, 13, 0, 60, 80), Hold::Permit));
        let f = check(&h, &Stats::default(), 0, 200, &[], sem);
        assert_eq!((f.max_holders, f.overlaps), (3, 1));
        assert!(
            (f.longest_overlap_ms - 20e-6).abs() < 1e-9,
            "{}",
            f.longest_overlap_ms
        );
        assert!(f.overlap_example.unwrap().starts_with("3 held at once"));
        // The same history as a mutex: every pair counts.
        assert!(check(&h, &Stats::default(), 0, 200, &[], Workload::Mutex).overlaps >= 3);
    }

    #[test]
    fn readers_overlap_readers_but_no_writer_overlaps_anyone() {
        let rw = Workload::ReadWrite;
        let mut h: Vec<Event> = hold(grant(2, 1, 10, 0, 10, 100), Hold::Shared).into();
        h.extend(hold(grant(3, 1, 11, 0, 20, 100), Hold::Shared));
        let f = check(&h, &Stats::default(), 0, 200, &[], rw);
        assert_eq!((f.max_holders, f.overlaps), (2, 0));
        h.extend(hold(grant(1, 1, 12, 0, 90, 150), Hold::Exclusive));
        let f = check(&h, &Stats::default(), 0, 200, &[], rw);
        assert_eq!((f.max_holders, f.overlaps), (3, 2));
        assert!(f.overlap_example.unwrap().contains("client 1 (token 12)"));
    }
}
