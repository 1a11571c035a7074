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
//! rest of the process (nice 10 by default, `query.nice`). On a machine
//! whose cores ingest keeps busy (a backlog being caught up), the kernel
//! then gives queries the time ingest leaves, about a tenth of a core
//! each at nice 10, rather than an equal share: sixteen clients querying
//! in a loop cost ingest a tenth of its rate instead of half. An idle
//! machine gives queries all of it. Work that holds a lock the feeder of
//! the alert engine waits on runs elsewhere (`LiveAudit`), so a slow
//! query thread never holds ingest up.

use std::future::Future;
use std::sync::atomic::{AtomicI32, Ordering};
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

/// Sets the nice value of query threads started from now on: call it
/// before the first query. Clamped to 0..=19.
pub fn set_nice(nice: i32) {
    NICE.store(nice.clamp(0, 19), Ordering::Relaxed);
}

/// Lowers the calling thread's priority to the configured nice value,
/// never raising it (that needs a privilege the process rarely has). On
/// Linux a nice value is a thread's own; elsewhere this does nothing.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        let nice = NICE.load(Ordering::Relaxed);
        // SAFETY: plain system calls on the calling thread (who = 0).
        unsafe {
            *libc::__errno_location() = 0;
            let now = libc::getpriority(libc::PRIO_PROCESS, 0);
            if *libc::__errno_location() == 0 && now < nice {
                libc::setpriority(libc::PRIO_PROCESS, 0, nice);
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
