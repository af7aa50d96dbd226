//! Keeping the rayon pool's other workers spinning for the length of a forward pass.
//!
//! A decode step calls a few hundred parallel kernels, each a few to a few hundred
//! microseconds long, with short serial stretches (norms, RoPE, sampling) between them. An
//! idle rayon worker yields 32 times and then sleeps on a futex, so at batch 1 the helper
//! threads were asleep at the start of most kernels: the calling thread paid the wake-up
//! syscall, and the woken thread, a halted vCPU on a virtual machine, joined late, so the
//! weight stream ran on fewer cores than it had. llama.cpp's threads spin on a barrier for
//! the whole graph for the same reason. [`with_warm_workers`] gives rayon the same behaviour
//! for one forward pass: a job on every other worker that runs the pool's pending jobs the
//! moment they appear and busy-waits in between, and that returns when the pass ends.

use std::cell::Cell;
use std::hint::spin_loop;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Pauses between two looks at an empty pool: enough to keep a spinning worker off the
/// deques' cache lines while the caller pushes its jobs, short against a kernel's length.
const PAUSES_WHEN_IDLE: usize = 16;

/// How long a spinner waits without finding a job before it returns, pass over or not.
///
/// A worker that waits inside a join (for a job it split off and another thread took) also
/// looks in its own queues, and can start its spinner there, on top of the job it waits in:
/// that job, which the pass needs, cannot resume until the spinner returns. Without a bound
/// the pass and the spinner would wait for each other forever (seen in `tidal bench
/// speculative`); with it, that case costs at most this long, while the gaps between a
/// step's kernels (tens of microseconds) stay well under it.
const IDLE_LIMIT: Duration = Duration::from_millis(1);

thread_local! {
    /// Whether this worker is already running a spinner (a nested one returns at once).
    static SPINNING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with every other worker of the current rayon pool busy-waiting for `f`'s parallel
/// jobs, so that each kernel `f` calls starts on all the pool's threads at once. Outside a
/// pool, or in a pool of one thread, it just runs `f`. The spinners stop when `f` returns or
/// unwinds, or after [`IDLE_LIMIT`] without a job; a nested call adds no spinners.
pub fn with_warm_workers<R>(f: impl FnOnce() -> R) -> R {
    run_warm(f, &Arc::new(Spinners::default()))
}

/// What the spinners of one pass share.
#[derive(Debug, Default)]
struct Spinners {
    /// Set when the pass is over.
    done: AtomicBool,
    /// Spinners running now.
    live: AtomicUsize,
    /// Spinners started in this pass (each worker's at most once).
    started: AtomicUsize,
}

fn run_warm<R>(f: impl FnOnce() -> R, spinners: &Arc<Spinners>) -> R {
    let (Some(owner), threads) = (rayon::current_thread_index(), rayon::current_num_threads())
    else {
        return f();
    };
    if threads < 2 || SPINNING.get() {
        return f();
    }
    // One job per thread, in each thread's own broadcast queue: a spinner's look for work
    // never takes another thread's, and the caller's own returns at once.
    let shared = Arc::clone(spinners);
    rayon::spawn_broadcast(move |_| spin_until_done(&shared, owner));
    let _stop = StopOnDrop(spinners);
    f()
}

/// Runs the pool's jobs as they appear until the pass is done, or until none has come for
/// [`IDLE_LIMIT`]. Returns at once on the
/// caller's own thread (which can pick a spinner up while it waits inside a join: spinning
/// there would block the pass that ends it) and on a worker that already spins.
fn spin_until_done(spinners: &Spinners, owner: usize) {
    if rayon::current_thread_index() == Some(owner) || SPINNING.get() {
        return;
    }
    SPINNING.set(true);
    spinners.live.fetch_add(1, Ordering::AcqRel);
    spinners.started.fetch_add(1, Ordering::AcqRel);
    // The clock is read only while idle: a job that ran just clears it, so the jobs the
    // pass waits on pay nothing for the bound.
    let mut idle_since: Option<Instant> = None;
    while !spinners.done.load(Ordering::Acquire) {
        if rayon::yield_now() == Some(rayon::Yield::Executed) {
            idle_since = None;
        } else if idle_since.get_or_insert_with(Instant::now).elapsed() > IDLE_LIMIT {
            break;
        } else {
            for _ in 0..PAUSES_WHEN_IDLE {
                spin_loop();
            }
        }
    }
    spinners.live.fetch_sub(1, Ordering::AcqRel);
    SPINNING.set(false);
}

/// Ends the pass when dropped, so the spinners stop even when it panics.
struct StopOnDrop<'a>(&'a Spinners);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.done.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;
    use std::time::{Duration, Instant};

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool")
    }

    /// Runs small parallel jobs (which keep the spinners from going idle) until `n`
    /// spinners have started, for up to 20 s; false if the count never got there.
    fn busy_until_started(spinners: &Spinners, n: usize) -> bool {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(20) {
            if spinners.started.load(Ordering::Acquire) == n {
                return true;
            }
            let _: u64 = (0..1_000u64).into_par_iter().sum();
        }
        false
    }

    /// Waits up to 20 s for `live` spinners; false if the count never got there.
    fn live_becomes(spinners: &Spinners, live: usize) -> bool {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(20) {
            if spinners.live.load(Ordering::Acquire) == live {
                return true;
            }
            std::thread::yield_now();
        }
        false
    }

    #[test]
    fn the_other_workers_spin_during_the_pass_and_stop_after_it() {
        let pool = pool(3);
        let spinners = Arc::new(Spinners::default());
        let total: u64 = pool.install(|| {
            run_warm(
                || {
                    assert!(
                        busy_until_started(&spinners, 2),
                        "the two other workers never spun"
                    );
                    (0..200)
                        .map(|_| (0..10_000u64).into_par_iter().sum::<u64>())
                        .sum()
                },
                &spinners,
            )
        });
        assert_eq!(total, 200 * (10_000 * 9_999 / 2));
        assert!(live_becomes(&spinners, 0), "a spinner outlived its pass");
    }

    #[test]
    fn a_panicking_pass_stops_the_spinners() {
        let pool = pool(2);
        let spinners = Arc::new(Spinners::default());
        let caught = pool.install(|| {
            std::panic::catch_unwind(|| {
                run_warm(
                    || {
                        assert!(busy_until_started(&spinners, 1));
                        panic!("pass failed")
                    },
                    &spinners,
                )
            })
        });
        assert!(caught.is_err());
        assert!(live_becomes(&spinners, 0), "a spinner outlived its pass");
    }

    #[test]
    fn nested_passes_and_threads_outside_a_pool_just_run() {
        assert_eq!(with_warm_workers(|| 7), 7);
        let pool = pool(2);
        let v = pool.install(|| with_warm_workers(|| with_warm_workers(|| 5) + 1));
        assert_eq!(v, 6);
        let single = self::pool(1);
        assert_eq!(single.install(|| with_warm_workers(|| 3)), 3);
    }
}
