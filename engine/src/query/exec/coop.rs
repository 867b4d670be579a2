//! Queries that can be cancelled mid-join.
//!
//! A join can emit without bound from one input batch: a cross join of four
//! 800-row tables is 4e11 rows, all computed in memory without polling a
//! scan. DataFusion's `EnsureCooperative` makes only leaves and exchanges
//! spend tokio's cooperative budget, so such a query never yields: dropping
//! it (Ctrl-C in Python aborts its task) would leave it running on every core
//! until it finished. [`YieldingJoins`] puts the output of every join behind a
//! `CooperativeExec`, so the consumer of a join yields every budget's worth of
//! batches and an abort takes effect there.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::Result as DfResult;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::joins::{
    CrossJoinExec, HashJoinExec, NestedLoopJoinExec, PiecewiseMergeJoinExec, SortMergeJoinExec,
    SymmetricHashJoinExec,
};
use datafusion::physical_plan::unnest::UnnestExec;
use datafusion::physical_plan::ExecutionPlan;

/// Physical optimizer rule: every join (and unnest) spends the cooperative
/// budget per output batch. Runs last, after joins have been chosen.
#[derive(Debug, Default)]
pub struct YieldingJoins;

fn amplifies(plan: &dyn ExecutionPlan) -> bool {
    let any = plan as &dyn std::any::Any;
    any.is::<NestedLoopJoinExec>()
        || any.is::<CrossJoinExec>()
        || any.is::<HashJoinExec>()
        || any.is::<SortMergeJoinExec>()
        || any.is::<SymmetricHashJoinExec>()
        || any.is::<PiecewiseMergeJoinExec>()
        || any.is::<UnnestExec>()
}

impl PhysicalOptimizerRule for YieldingJoins {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|node| {
            if amplifies(node.as_ref()) {
                Ok(Transformed::yes(
                    Arc::new(CooperativeExec::new(node)) as Arc<dyn ExecutionPlan>
                ))
            } else {
                Ok(Transformed::no(node))
            }
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "yielding_joins"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
