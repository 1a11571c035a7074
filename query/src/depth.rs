//! How deep a query's expressions may nest.
//!
//! The parser reads `a OR b OR c ...` and `1 + 1 + ...` in a loop, so a
//! few kilobytes of SQL become a tree thousands of levels deep, and the
//! planner, the optimizer and even dropping the tree recurse through it.
//! Past a bound that is refused as "statement too complex" before
//! anything else looks at it.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{Expr, Visit, Visitor};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::parser::Parser;

/// The deepest expression nesting a query may have. A thousand nested
/// operators is far past what a person or a dashboard writes (a long
/// list of alternatives fits in `IN (...)`, which is one level).
pub const MAX_EXPR_DEPTH: usize = 1000;

struct Depth {
    now: usize,
    max: usize,
}

impl Visitor for Depth {
    type Break = ();

    fn pre_visit_expr(&mut self, _: &Expr) -> ControlFlow<()> {
        self.now += 1;
        self.max = self.max.max(self.now);
        // Stop descending at once: the walk itself recurses.
        if self.now > MAX_EXPR_DEPTH {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }

    fn post_visit_expr(&mut self, _: &Expr) -> ControlFlow<()> {
        self.now -= 1;
        ControlFlow::Continue(())
    }
}

/// `Err(depth)` when `sql` nests expressions deeper than
/// [`MAX_EXPR_DEPTH`] (`depth` is how deep the walk got before it
/// stopped). SQL that does not parse passes: the planner words that error.
pub fn check(sql: &str) -> Result<(), usize> {
    match Parser::parse_sql(&GenericDialect {}, sql) {
        Ok(statements) => check_parsed(&statements),
        Err(_) => Ok(()),
    }
}

/// [`check`] on statements a caller has parsed already (the PostgreSQL
/// protocol parses with its own dialect).
pub fn check_parsed<V: Visit + ?Sized>(statements: &V) -> Result<(), usize> {
    let mut d = Depth { now: 0, max: 0 };
    match statements.visit(&mut d) {
        ControlFlow::Break(()) => Err(d.max),
        ControlFlow::Continue(()) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As on a query thread: the walk and the parser's drop recurse.
    fn on_query_stack(f: impl FnOnce() + Send + 'static) {
        std::thread::Builder::new()
            .stack_size(crate::executor::QUERY_STACK_BYTES)
            .spawn(f)
            .unwrap()
            .join()
            .unwrap();
    }

    fn sum(terms: usize) -> String {
        format!("SELECT {}", vec!["1"; terms].join("+"))
    }

    #[test]
    fn nesting_up_to_the_bound_passes_and_past_it_is_refused() {
        on_query_stack(|| {
            // n terms nest n - 1 additions over the literals: depth n.
            assert_eq!(check(&sum(MAX_EXPR_DEPTH)), Ok(()));
            assert_eq!(check(&sum(MAX_EXPR_DEPTH + 1)), Err(MAX_EXPR_DEPTH + 1));
            let ors: Vec<String> = (0..3000).map(|i| format!("lease_id = 'l{i}'")).collect();
            let q = format!("SELECT * FROM lease_events WHERE {}", ors.join(" OR "));
            assert_eq!(check(&q), Err(MAX_EXPR_DEPTH + 1));
        });
    }

    #[test]
    fn a_long_in_list_is_one_level() {
        let ids: Vec<String> = (0..3000).map(|i| format!("'l{i}'")).collect();
        let q = format!(
            "SELECT * FROM lease_events WHERE lease_id IN ({})",
            ids.join(", ")
        );
        assert_eq!(check(&q), Ok(()));
    }
}
