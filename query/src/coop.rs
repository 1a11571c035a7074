//! Operators that make many rows from few give way to the scheduler.
//!
//! A query is stopped (timeout, cancel, client gone) by dropping its task,
//! which takes effect only when the task next returns `Pending` to the
//! query runtime. DataFusion's `EnsureCooperative` makes the plan's leaves
//! spend the task's scheduling budget, one unit per batch they produce, so
//! a plan that reads yields every so many batches read. A join or an
//! `UNNEST` can make billions of rows from one batch of input: `SELECT
//! count(*) FROM lease_events a CROSS JOIN lease_events b` on a lake of
//! ten million events makes 8192 × 10⁷ rows from each batch of `b`
//! without spending any budget. Its task then never yields, so its
//! timeout never stops it: it keeps the query threads busy after its
//! client has been told it timed out, and every later query waits behind
//! it.
//!
//! The rule: every join and every unnest is wrapped in DataFusion's
//! `CooperativeExec`, which spends one unit of budget per batch the
//! operator produces, so such a plan yields at least every 128 batches
//! it makes (about a million rows), whatever it reads.

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::config::ConfigOptions;
use datafusion::error::Result;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::execution_plan::replace_children_if_necessary;
use datafusion::physical_plan::joins::{
    CrossJoinExec, HashJoinExec, NestedLoopJoinExec, SortMergeJoinExec, SymmetricHashJoinExec,
};
use datafusion::physical_plan::unnest::UnnestExec;
use datafusion::physical_plan::ExecutionPlan;

/// The physical optimizer rule of the module docs; runs after DataFusion's
/// own rules.
#[derive(Debug, Default)]
pub struct AmplifiersCooperate;

/// Whether `plan` can produce many more rows than it reads.
fn amplifies(plan: &dyn ExecutionPlan) -> bool {
    plan.is::<CrossJoinExec>()
        || plan.is::<NestedLoopJoinExec>()
        || plan.is::<HashJoinExec>()
        || plan.is::<SortMergeJoinExec>()
        || plan.is::<SymmetricHashJoinExec>()
        || plan.is::<UnnestExec>()
}

impl PhysicalOptimizerRule for AmplifiersCooperate {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            let wrapped = node.children().iter().any(|c| amplifies(c.as_ref()))
                && !node.is::<CooperativeExec>();
            if !wrapped {
                return Ok(Transformed::no(node));
            }
            let children = node
                .children()
                .into_iter()
                .map(|c| {
                    if amplifies(c.as_ref()) {
                        Arc::new(CooperativeExec::new(c.clone())) as Arc<dyn ExecutionPlan>
                    } else {
                        c.clone()
                    }
                })
                .collect();
            Ok(Transformed::yes(replace_children_if_necessary(
                node, children,
            )?))
        })
        .map(|t| {
            // The root has no parent to wrap it.
            let root = t.data;
            if amplifies(root.as_ref()) {
                Arc::new(CooperativeExec::new(root)) as Arc<dyn ExecutionPlan>
            } else {
                root
            }
        })
    }

    fn name(&self) -> &str {
        "AmplifiersCooperate"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::physical_plan::displayable;
    use datafusion::prelude::SessionContext;

    async fn plan_of(sql: &str) -> String {
        plan_with(sql, true).await
    }

    async fn plan_with(sql: &str, rule: bool) -> String {
        let mut state = datafusion::execution::SessionStateBuilder::new().with_default_features();
        if rule {
            state = state.with_physical_optimizer_rule(Arc::new(AmplifiersCooperate));
        }
        let state = state.build();
        let ctx = SessionContext::new_with_state(state);
        let plan = ctx
            .sql(sql)
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        let text = displayable(plan.as_ref()).indent(false).to_string();
        text
    }

    /// Each line of the plan that names `op` is directly under a
    /// `CooperativeExec` line.
    fn each_under_cooperative(plan: &str, op: &str) -> usize {
        let lines: Vec<&str> = plan.lines().collect();
        let mut n = 0;
        for (i, l) in lines.iter().enumerate() {
            if l.trim_start().starts_with(op) {
                assert!(i > 0, "{plan}");
                assert!(
                    lines[i - 1].trim_start().starts_with("CooperativeExec"),
                    "{op} not wrapped:\n{plan}"
                );
                n += 1;
            }
        }
        n
    }

    #[tokio::test]
    async fn joins_and_unnest_are_wrapped_and_other_operators_are_not() {
        let cross = plan_of(
            "SELECT count(*) FROM generate_series(1, 1000) a CROSS JOIN generate_series(1, 1000) b",
        )
        .await;
        assert!(
            each_under_cooperative(&cross, "CrossJoinExec")
                + each_under_cooperative(&cross, "NestedLoopJoinExec")
                == 1,
            "{cross}"
        );
        let hash = plan_of(
            "SELECT count(*) FROM generate_series(1, 1000) a JOIN generate_series(1, 1000) b \
             ON a.value % 3 = b.value % 3",
        )
        .await;
        assert_eq!(each_under_cooperative(&hash, "HashJoinExec"), 1, "{hash}");
        let unnest = plan_of("SELECT unnest(make_array(1, 2, 3)) AS x").await;
        assert_eq!(each_under_cooperative(&unnest, "UnnestExec"), 1, "{unnest}");
        // A plain aggregate reads budgeted leaves and is left as it is.
        let plain = "SELECT sum(value) FROM generate_series(1, 1000)";
        assert_eq!(plan_of(plain).await, plan_with(plain, false).await);
    }
}
