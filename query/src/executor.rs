//! Where queries run: a runtime of their own.
//!
//! A query can be CPU-bound for as long as its timeout allows, and can
//! plan a deeply nested expression. On the runtime that accepts
//! connections, answers `/health`, ingests and handles signals, one such
//! query would starve all of that, and a deep plan would overflow a
//! worker's stack and abort the process. So every query is planned and
//! executed here, on threads with room for deep plans, and is awaited
//! from the caller's runtime, whose timer can give up on it and abort it
//! however busy these threads are.
//!
//! The query threads also run at a lower scheduling priority than the
//! rest of the process. By default they are idle-class threads (Linux's
//! `SCHED_IDLE`, `query.sched_idle`): they run on the time the rest of
//! the process leaves, and a thread of ingest that wakes takes its core
//! from a query thread at once. Ingest is a pipeline whose stages wait on
//! each other and on the broker, so it rarely keeps every core busy; what
//! slows it under query load is each stage waiting, at every wake-up, for
//! a query thread's time slice to end. At nice 10, sixteen clients
//! querying in a loop left ingest 0.87–0.90 of its rate, on two cores a
//! third idle without them, and 0.91–0.97 with idle-class query threads;
//! see BENCHMARKS.md. The cost: while ingest, or any other process of
//! the machine, keeps every core busy (a backlog caught up on a small
//! machine), queries wait for it and may time out. `query.sched_idle =
//! false` shares the cores by `query.nice` instead (10: about a tenth of
//! what a busy thread of normal priority gets). Work that holds a lock
//! the feeder of the alert engine waits on runs elsewhere (`LiveAudit`),
//! so a slow query thread never holds ingest up.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::OnceLock;

use tokio::runtime::{Builder, Handle, Runtime};
use tokio_util::task::AbortOnDropHandle;

/// Stack of each query thread. Only the pages a plan touches are
/// committed; [`crate::MAX_EXPR_DEPTH`] is checked against it by a test.
pub const QUERY_STACK_BYTES: usize = 64 * 1024 * 1024;

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

/// The query threads' nice value unless configured (`query.nice`).
pub const DEFAULT_NICE: i32 = 10;

static NICE: AtomicI32 = AtomicI32::new(DEFAULT_NICE);

static IDLE: AtomicBool = AtomicBool::new(true);

/// Sets the priority of query threads started from now on: idle-class
/// when `idle`, and the nice value (clamped to 0..=19) in any case. Call
/// it before the first query.
pub fn set_priority(idle: bool, nice: i32) {
    IDLE.store(idle, Ordering::Relaxed);
    NICE.store(nice.clamp(0, 19), Ordering::Relaxed);
}

/// Lowers the calling thread's priority to the configured nice value,
/// never raising it (that needs a privilege the process rarely has), then
/// makes it idle-class if so configured (any thread may). On Linux both
/// are a thread's own; elsewhere this does nothing. If the idle class is
/// refused (a seccomp profile), the nice value still holds.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        let nice = NICE.load(Ordering::Relaxed);
        // SAFETY: plain system calls on the calling thread (who = 0, pid
        // = 0), with a parameter that lives across the call.
        unsafe {
            *libc::__errno_location() = 0;
            let now = libc::getpriority(libc::PRIO_PROCESS, 0);
            if *libc::__errno_location() == 0 && now < nice {
                libc::setpriority(libc::PRIO_PROCESS, 0, nice);
            }
            if IDLE.load(Ordering::Relaxed) {
                let param = libc::sched_param { sched_priority: 0 };
                libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
            }
        }
    }
}

/// The query runtime: one worker per core. Created on first use and never
/// dropped (a runtime may not be dropped inside another's async context,
/// and this one lives as long as the process).
pub fn handle() -> Handle {
    RUNTIME
        .get_or_init(|| {
            Builder::new_multi_thread()
                .thread_name("leaseline-query")
                .thread_stack_size(QUERY_STACK_BYTES)
                .on_thread_start(lower_priority)
                .enable_all()
                .build()
                .expect("starting the query runtime")
        })
        .handle()
        .clone()
}

/// Runs `work` on the query runtime. Dropping the returned future (a
/// timeout, a client that went away) aborts the work, and with it every
/// task DataFusion spawned for it.
pub fn spawn<T: Send + 'static>(
    work: impl Future<Output = T> + Send + 'static,
) -> AbortOnDropHandle<T> {
    AbortOnDropHandle::new(handle().spawn(work))
}
