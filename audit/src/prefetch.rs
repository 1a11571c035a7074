//! Software prefetch: the audit's pushes are bound by memory latency, and
//! asking for a cache line some work before it is needed hides most of it.

/// Asks the CPU to bring the line holding `p` into cache. Any address is
/// fine, even one past an allocation: a prefetch never faults.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    // SAFETY: a prefetch reads nothing observable and cannot fault; SSE is
    // part of the x86_64 baseline.
    #[allow(unused_unsafe)]
    unsafe {
        _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>())
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub(crate) fn prefetch<T>(_: *const T) {}
