//! `hosts`: a fleet of HTTP consumers serving one dispatcher (docs/dispatchers.md, "Dispatchers"). Each lane
//! has a home host (lane modulo the fleet); a host that fails to answer (a communication failure)
//! rests, and its lanes go to the next healthy hosts until it answers again. A lane is one request
//! at a time whichever host serves it, so per-key order holds across a move.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mmmq_core::HostHealth;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::HttpTarget;
use crate::dispatch::target::{BoxFuture, Delivery, Outcome, RunAnswer, Target, TargetStatus};

/// How long a host that failed rests before it gets its lanes back (doubling while it keeps
/// failing, at most [`MAX_REST`]).
const FIRST_REST: Duration = Duration::from_millis(500);
const MAX_REST: Duration = Duration::from_secs(30);

struct Member {
    target: HttpTarget,
    url: String,
    /// When it may be tried again, and how long it rested last.
    rest: Mutex<Option<(Instant, Duration)>>,
    answered: AtomicU64,
    failures: AtomicU64,
}

impl Member {
    fn healthy(&self, now: Instant) -> bool {
        self.rest.lock().is_none_or(|(until, _)| now >= until)
    }

    fn failed(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        let mut rest = self.rest.lock();
        let next = rest.map_or(FIRST_REST, |(_, last)| (last * 2).min(MAX_REST));
        *rest = Some((Instant::now() + next, next));
    }

    fn answered(&self) {
        self.answered.fetch_add(1, Ordering::Relaxed);
        *self.rest.lock() = None;
    }
}

/// A dispatcher target over several hosts.
pub struct FleetTarget {
    members: Vec<Member>,
    /// At-most-once: a message a host failed to answer may have reached it, so it is not sent to
    /// another host (the worker drops it); the next messages go to the healthy hosts.
    no_second_host: bool,
}

impl FleetTarget {
    /// A fleet of `targets` (with their URLs, for status); `at_most_once` stops a failed message
    /// from being tried on a second host.
    pub fn new(targets: Vec<(HttpTarget, String)>, at_most_once: bool) -> Self {
        Self {
            no_second_host: at_most_once,
            members: targets
                .into_iter()
                .map(|(target, url)| Member {
                    target,
                    url,
                    rest: Mutex::new(None),
                    answered: AtomicU64::new(0),
                    failures: AtomicU64::new(0),
                })
                .collect(),
        }
    }

    /// The hosts to try for `lane`, in order: its home first, then the others; healthy ones
    /// before resting ones (a fleet that is all resting still tries its hosts, in that order).
    fn order(&self, lane: u32) -> Vec<usize> {
        let n = self.members.len();
        let now = Instant::now();
        let ring: Vec<usize> = (0..n).map(|i| (lane as usize + i) % n).collect();
        let (mut healthy, resting): (Vec<usize>, Vec<usize>) = ring
            .into_iter()
            .partition(|&i| self.members[i].healthy(now));
        if healthy.is_empty() {
            healthy = resting;
        }
        healthy
    }
}

impl Target for FleetTarget {
    fn deliver_run<'a>(
        &'a self,
        batch: &'a [Delivery],
        stop: &'a CancellationToken,
    ) -> BoxFuture<'a, RunAnswer> {
        Box::pin(async move {
            let mut last = None;
            for i in self.order(batch[0].lane) {
                let member = &self.members[i];
                let answer = member.target.deliver_run(batch, stop).await;
                match &answer.stopped {
                    Some(Outcome::Failed(_)) if answer.acked == 0 => {
                        member.failed();
                        tracing::warn!(host = %member.url, lane = batch[0].lane, "host failed; its lanes go to the others while it rests");
                        last = Some(answer);
                        if stop.is_cancelled() || self.no_second_host {
                            break;
                        }
                    }
                    _ => {
                        member.answered();
                        return answer;
                    }
                }
            }
            last.expect("a fleet has at least one host")
        })
    }

    fn status(&self) -> TargetStatus {
        let now = Instant::now();
        TargetStatus::Hosts {
            hosts: self
                .members
                .iter()
                .map(|m| HostHealth {
                    url: m.url.clone(),
                    healthy: m.healthy(now),
                    answered: m.answered.load(Ordering::Relaxed),
                    failures: m.failures.load(Ordering::Relaxed),
                })
                .collect(),
        }
    }
}
