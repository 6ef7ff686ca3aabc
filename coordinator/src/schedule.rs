//! When a submitter of a served dataset may see a job move. How long a job takes follows
//! the rows it reads, which are private; so its release (the first part under its output
//! prefix) and its end are shown only at boundaries fixed when it started: q, 2q, 4q, …
//! after its start, q the coordinator's quantum. A job then shows at most log₂(T/q) bits
//! of its duration T, and a dataset's `min_job_epsilon` bounds how many jobs a budget runs.

use std::time::{Duration, Instant};

/// A job's boundaries.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    pub started: Instant,
    pub quantum: Duration,
}

impl Schedule {
    /// The first boundary at or after `at`.
    pub fn boundary_after(&self, at: Instant) -> Instant {
        let mut boundary = self.started + self.quantum;
        while boundary < at {
            boundary = self.started + (boundary - self.started) * 2;
        }
        boundary
    }

    /// Waits for the first boundary from now.
    pub async fn hold(&self) {
        tokio::time::sleep_until(self.boundary_after(Instant::now()).into()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundaries_double_from_the_start() {
        let started = Instant::now();
        let s = Schedule { started, quantum: Duration::from_secs(10) };
        let at = |secs: u64| started + Duration::from_secs(secs);
        for (now, boundary) in [(0, 10), (10, 10), (11, 20), (20, 20), (21, 40), (79, 80), (81, 160)] {
            assert_eq!(s.boundary_after(at(now)), at(boundary), "{now} s");
        }
    }
}
