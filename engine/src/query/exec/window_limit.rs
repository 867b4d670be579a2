//! `LimitAboveWindows`: an `ORDER BY ... LIMIT` above a window function
//! stays above it.
//!
//! DataFusion 55 plans `ORDER BY ... LIMIT n` as a sort that keeps `n` rows
//! (a top-k sort). When the rows under a window function already arrive in
//! the sort's order (a payload scan is ordered by identity), its sort
//! pushdown moves that top-k sort below the window, which then sees `n`
//! rows: `count(*) OVER ()` answered 2 instead of 112 (found by the
//! differential SQL fuzzer). Before that pass runs, this rule splits such a
//! top-k sort into a full sort and a limit above it: the sort may still
//! move, the limit does not.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result as DfResult;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::limit::GlobalLimitExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::windows::{BoundedWindowAggExec, WindowAggExec};
use datafusion::physical_plan::ExecutionPlan;

/// See the module: a top-k sort over a window becomes a sort and a limit.
#[derive(Debug, Default)]
pub struct LimitAboveWindows;

/// Whether `plan` computes a window function anywhere below it.
fn has_window(plan: &Arc<dyn ExecutionPlan>) -> bool {
    super::any_node(plan, |any| {
        any.is::<WindowAggExec>() || any.is::<BoundedWindowAggExec>()
    })
}

impl PhysicalOptimizerRule for LimitAboveWindows {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        plan.transform_down(|node| {
            let any = node.as_ref() as &dyn std::any::Any;
            let Some(sort) = any.downcast_ref::<SortExec>() else {
                return Ok(Transformed::no(node));
            };
            match sort.fetch() {
                Some(n) if !sort.preserve_partitioning() && has_window(sort.input()) => {
                    let full: Arc<dyn ExecutionPlan> = Arc::new(sort.with_fetch(None));
                    Ok(Transformed::yes(Arc::new(GlobalLimitExec::new(
                        full,
                        0,
                        Some(n),
                    ))))
                }
                _ => Ok(Transformed::no(node)),
            }
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "limit_above_windows"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
