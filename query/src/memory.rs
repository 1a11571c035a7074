//! Query memory: one pool for the process, a share of it per query.
//!
//! Protocol:
//! - Every query of the process reserves from one pool of
//!   [`QueryLimits::memory_pool_bytes`]. However many queries run, and on
//!   whichever surface, their reservations together stay under it.
//! - Each query also has a cap of its own, [`QueryLimits::max_memory_bytes`],
//!   so one query cannot take the whole pool from the others.
//! - A reservation over either limit fails with DataFusion's
//!   `ResourcesExhausted` (HTTP 503, a PostgreSQL error), naming the limit
//!   to raise. Nothing spills to disk.
//!
//! DataFusion's operators (sorts, joins, aggregations) reserve what they
//! hold. Scalar functions do not: `repeat('x', 1000000000)` or
//! `range(1, 1000000000)` would allocate gigabytes unseen. [`bounded`]
//! wraps the functions whose result can be far larger than their input
//! so that they reserve their result's size before building it.

use std::fmt;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytesize::ByteSize;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::{
    GreedyMemoryPool, MemoryLimit, MemoryPool, MemoryReservation, TrackConsumersPool,
};

use crate::QueryLimits;

/// The process's pool: every query's reservations together.
pub(crate) fn process_pool(limits: &QueryLimits) -> Arc<dyn MemoryPool> {
    Arc::new(TrackConsumersPool::new(
        GreedyMemoryPool::new(limits.memory_pool_bytes.as_u64() as usize),
        NonZeroUsize::new(3).expect("3 is not zero"),
    ))
}

/// One query's share of the process pool: at most `limit` bytes of it.
#[derive(Debug)]
pub(crate) struct QueryPool {
    process: Arc<dyn MemoryPool>,
    limit: usize,
    used: AtomicUsize,
}

impl QueryPool {
    pub(crate) fn shared(
        process: Arc<dyn MemoryPool>,
        limits: &QueryLimits,
    ) -> Arc<dyn MemoryPool> {
        Arc::new(QueryPool {
            process,
            limit: limits.max_memory_bytes.as_u64() as usize,
            used: AtomicUsize::new(0),
        })
    }
}

impl fmt::Display for QueryPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "query memory: {} of {} used",
            ByteSize::b(self.used.load(Ordering::Relaxed) as u64),
            ByteSize::b(self.limit as u64)
        )
    }
}

impl MemoryPool for QueryPool {
    fn name(&self) -> &str {
        "leaseline-query"
    }

    fn register(&self, consumer: &datafusion::execution::memory_pool::MemoryConsumer) {
        self.process.register(consumer);
    }

    fn unregister(&self, consumer: &datafusion::execution::memory_pool::MemoryConsumer) {
        self.process.unregister(consumer);
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.used.fetch_add(additional, Ordering::Relaxed);
        self.process.grow(reservation, additional);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.used.fetch_sub(shrink, Ordering::Relaxed);
        self.process.shrink(reservation, shrink);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> Result<()> {
        let claimed = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(additional).filter(|&n| n <= self.limit)
            });
        if let Err(used) = claimed {
            return Err(DataFusionError::ResourcesExhausted(format!(
                "the query needs more than its memory limit: {} asked for {} more with {} \
                 already held, over query.max_memory_bytes = {}",
                reservation.consumer().name(),
                ByteSize::b(additional as u64),
                ByteSize::b(used as u64),
                ByteSize::b(self.limit as u64)
            )));
        }
        if let Err(e) = self.process.try_grow(reservation, additional) {
            self.used.fetch_sub(additional, Ordering::Relaxed);
            return Err(DataFusionError::ResourcesExhausted(format!(
                "the queries running now hold the memory of every query together \
                 (query.memory_pool_bytes = {}): {}",
                match self.process.memory_limit() {
                    MemoryLimit::Finite(n) => ByteSize::b(n as u64).to_string(),
                    _ => "unknown".into(),
                },
                e.strip_backtrace()
            )));
        }
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn memory_limit(&self) -> MemoryLimit {
        MemoryLimit::Finite(self.limit)
    }
}

pub(crate) mod bounded {
    //! Scalar functions whose result can be far larger than their input,
    //! wrapped so that they reserve the result's size from the query's
    //! pool before building it. The estimate is a lower bound of the
    //! bytes the result's values take; a function whose arguments give no
    //! estimate (a date range with an interval step) is measured after it
    //! ran instead.

    use std::sync::Arc;

    use arrow::array::{Array, ArrayRef, AsArray};
    use arrow::compute::kernels::cast::cast;
    use arrow::datatypes::{DataType, Int64Type};
    use datafusion::error::Result;
    use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool};
    use datafusion::logical_expr::{
        ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    };
    use datafusion::prelude::SessionContext;
    use datafusion::scalar::ScalarValue;

    /// How a function's result size follows from its arguments.
    #[derive(Debug, Clone, Copy)]
    enum Growth {
        /// `repeat(text, n)`: the text's bytes times n.
        Repeat,
        /// `lpad(text, n [, fill])`, `rpad`: n characters.
        Pad,
        /// `range(stop)`, `range(start, stop [, step])`, `generate_series`
        /// (inclusive): one 8-byte value per step.
        Range,
        /// `array_repeat(value, n)`: n values of 8 bytes at least.
        ArrayRepeat,
    }

    const WRAPPED: [(&str, Growth); 6] = [
        ("repeat", Growth::Repeat),
        ("lpad", Growth::Pad),
        ("rpad", Growth::Pad),
        ("range", Growth::Range),
        ("generate_series", Growth::Range),
        ("array_repeat", Growth::ArrayRepeat),
    ];

    /// Replaces the session's functions that build large values with
    /// bounded ones reserving from `pool`.
    pub(crate) fn install(ctx: &SessionContext, pool: &Arc<dyn MemoryPool>) {
        for (name, growth) in WRAPPED {
            let Some(inner) = ctx.state().scalar_functions().get(name).cloned() else {
                continue;
            };
            ctx.register_udf(ScalarUDF::new_from_impl(Bounded {
                inner,
                growth,
                pool: pool.clone(),
            }));
        }
    }

    #[derive(Debug)]
    struct Bounded {
        inner: Arc<ScalarUDF>,
        growth: Growth,
        pool: Arc<dyn MemoryPool>,
    }

    impl PartialEq for Bounded {
        fn eq(&self, other: &Self) -> bool {
            self.inner == other.inner
        }
    }
    impl Eq for Bounded {}
    impl std::hash::Hash for Bounded {
        fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
            self.inner.hash(state)
        }
    }

    impl ScalarUDFImpl for Bounded {
        fn name(&self) -> &str {
            self.inner.name()
        }
        fn aliases(&self) -> &[String] {
            self.inner.aliases()
        }
        fn signature(&self) -> &Signature {
            self.inner.signature()
        }
        fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
            self.inner.return_type(arg_types)
        }
        fn return_field_from_args(
            &self,
            args: ReturnFieldArgs,
        ) -> Result<arrow::datatypes::FieldRef> {
            self.inner.return_field_from_args(args)
        }
        fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
            self.inner.coerce_types(arg_types)
        }
        fn documentation(&self) -> Option<&datafusion::logical_expr::Documentation> {
            self.inner.documentation()
        }

        fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
            let reservation = MemoryConsumer::new(self.name()).register(&self.pool);
            match estimate(self.growth, &args.args, args.number_rows)? {
                Some(bytes) => {
                    reservation.try_grow(bytes)?;
                    self.inner.invoke_with_args(args)
                }
                None => {
                    let out = self.inner.invoke_with_args(args)?;
                    if let ColumnarValue::Array(a) = &out {
                        reservation.try_grow(a.get_array_memory_size())?;
                    }
                    Ok(out)
                }
            }
        }
    }

    /// An argument's values as Int64, one per row (a scalar repeated);
    /// None when it is not a number.
    fn ints(v: &ColumnarValue, rows: usize) -> Result<Option<Vec<Option<i64>>>> {
        let one = |s: &ScalarValue| -> Result<Option<i64>> {
            if s.is_null() {
                return Ok(None);
            }
            Ok(match s.cast_to(&DataType::Int64)? {
                ScalarValue::Int64(v) => v,
                _ => None,
            })
        };
        match v {
            ColumnarValue::Scalar(s) if s.data_type().is_integer() => {
                Ok(Some(vec![one(s)?; rows.max(1)]))
            }
            ColumnarValue::Array(a) if a.data_type().is_integer() => {
                let a = cast(a, &DataType::Int64)?;
                Ok(Some(a.as_primitive::<Int64Type>().iter().collect()))
            }
            _ => Ok(None),
        }
    }

    /// Each row's byte length of a text argument.
    fn text_lens(v: &ColumnarValue, rows: usize) -> Result<Option<Vec<u64>>> {
        match v {
            ColumnarValue::Scalar(s) => {
                let len = match s {
                    ScalarValue::Utf8(v) | ScalarValue::LargeUtf8(v) | ScalarValue::Utf8View(v) => {
                        v.as_ref().map_or(0, |s| s.len())
                    }
                    _ => return Ok(None),
                };
                Ok(Some(vec![len as u64; rows.max(1)]))
            }
            ColumnarValue::Array(a) => {
                let a: ArrayRef = cast(a, &DataType::LargeUtf8)?;
                Ok(Some(
                    a.as_string::<i64>()
                        .iter()
                        .map(|s| s.map_or(0, |s| s.len() as u64))
                        .collect(),
                ))
            }
        }
    }

    fn count(n: Option<i64>) -> u64 {
        n.unwrap_or(0).max(0) as u64
    }

    /// Bytes the result will take at least, or None when the arguments do
    /// not tell.
    fn estimate(growth: Growth, args: &[ColumnarValue], rows: usize) -> Result<Option<usize>> {
        let total = match (growth, args) {
            (Growth::Repeat, [text, n]) => {
                let (Some(lens), Some(ns)) = (text_lens(text, rows)?, ints(n, rows)?) else {
                    return Ok(None);
                };
                lens.iter().zip(ns).fold(0u64, |acc, (l, n)| {
                    acc.saturating_add(l.saturating_mul(count(n)))
                })
            }
            (Growth::Pad, [_, n, ..]) => {
                let Some(ns) = ints(n, rows)? else {
                    return Ok(None);
                };
                ns.into_iter()
                    .fold(0u64, |acc, n| acc.saturating_add(count(n)))
            }
            (Growth::ArrayRepeat, [_, n]) => {
                let Some(ns) = ints(n, rows)? else {
                    return Ok(None);
                };
                ns.into_iter().fold(0u64, |acc, n| {
                    acc.saturating_add(count(n).saturating_mul(8))
                })
            }
            (Growth::Range, [stop]) => {
                let Some(stops) = ints(stop, rows)? else {
                    return Ok(None);
                };
                stops.into_iter().fold(0u64, |acc, s| {
                    acc.saturating_add(count(s).saturating_mul(8))
                })
            }
            (Growth::Range, [start, stop, rest @ ..]) => {
                let (Some(starts), Some(stops)) = (ints(start, rows)?, ints(stop, rows)?) else {
                    return Ok(None);
                };
                let steps = match rest {
                    [] => vec![Some(1); starts.len()],
                    [step] => match ints(step, rows)? {
                        Some(s) => s,
                        None => return Ok(None),
                    },
                    _ => return Ok(None),
                };
                starts
                    .iter()
                    .zip(stops)
                    .zip(steps)
                    .fold(0u64, |acc, ((a, b), s)| {
                        let (Some(a), Some(b), Some(s)) = (*a, b, s) else {
                            return acc;
                        };
                        let span = (b as i128 - a as i128).unsigned_abs();
                        let step = (s as i128).unsigned_abs().max(1);
                        let values = (span / step + 1).min(u64::MAX as u128) as u64;
                        acc.saturating_add(values.saturating_mul(8))
                    })
            }
            _ => return Ok(None),
        };
        Ok(Some(total.min(usize::MAX as u64) as usize))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn int(v: i64) -> ColumnarValue {
            ColumnarValue::Scalar(ScalarValue::Int64(Some(v)))
        }
        fn text(v: &str) -> ColumnarValue {
            ColumnarValue::Scalar(ScalarValue::Utf8(Some(v.into())))
        }

        #[test]
        fn estimates_are_the_result_size() {
            let e = |g, a: &[ColumnarValue]| estimate(g, a, 1).unwrap();
            assert_eq!(e(Growth::Repeat, &[text("ab"), int(1000)]), Some(2000));
            assert_eq!(e(Growth::Repeat, &[text("ab"), int(-5)]), Some(0));
            assert_eq!(e(Growth::Pad, &[text("x"), int(70)]), Some(70));
            assert_eq!(e(Growth::Range, &[int(10)]), Some(80));
            assert_eq!(e(Growth::Range, &[int(1), int(10)]), Some(80));
            assert_eq!(e(Growth::Range, &[int(1), int(10), int(3)]), Some(32));
            assert_eq!(
                e(Growth::Range, &[int(i64::MIN), int(i64::MAX), int(1)]),
                Some(usize::MAX)
            );
            assert_eq!(e(Growth::ArrayRepeat, &[int(0), int(4)]), Some(32));
            // Per row over an array argument.
            let ns = ColumnarValue::Array(Arc::new(arrow::array::Int64Array::from(vec![
                Some(1),
                None,
                Some(3),
            ])));
            assert_eq!(
                estimate(Growth::Repeat, &[text("abc"), ns], 3).unwrap(),
                Some(12)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::execution::memory_pool::MemoryConsumer;

    fn limits(query: u64, process: u64) -> QueryLimits {
        QueryLimits {
            max_memory_bytes: ByteSize::b(query),
            memory_pool_bytes: ByteSize::b(process),
            ..QueryLimits::default()
        }
    }

    #[test]
    fn a_query_is_held_to_its_own_cap_and_all_to_the_pool() {
        let l = limits(100, 150);
        let process = process_pool(&l);
        let a = QueryPool::shared(process.clone(), &l);
        let b = QueryPool::shared(process.clone(), &l);
        let ra = MemoryConsumer::new("a").register(&a);
        let rb = MemoryConsumer::new("b").register(&b);

        ra.try_grow(100).unwrap();
        let e = ra.try_grow(1).unwrap_err().to_string();
        assert!(e.contains("query.max_memory_bytes"), "{e}");
        // The query's refusal took nothing from the pool.
        assert_eq!(process.reserved(), 100);

        rb.try_grow(50).unwrap();
        let e = rb.try_grow(1).unwrap_err().to_string();
        assert!(e.contains("query.memory_pool_bytes"), "{e}");
        // Nor did the pool's: b holds what it had.
        assert_eq!(b.reserved(), 50);

        drop(ra);
        rb.try_grow(50).unwrap();
        assert_eq!(process.reserved(), 100);
    }
}
