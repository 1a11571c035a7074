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

use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::{Builder, Handle, Runtime};
use tokio_util::task::AbortOnDropHandle;

/// Stack of each query thread. Only the pages a plan touches are
/// committed; [`crate::MAX_EXPR_DEPTH`] is checked against it by a test.
pub const QUERY_STACK_BYTES: usize = 64 * 1024 * 1024;

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

/// The query runtime: one worker per core. Created on first use and never
/// dropped (a runtime may not be dropped inside another's async context,
/// and this one lives as long as the process).
pub fn handle() -> Handle {
    RUNTIME
        .get_or_init(|| {
            Builder::new_multi_thread()
                .thread_name("leaseline-query")
                .thread_stack_size(QUERY_STACK_BYTES)
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
