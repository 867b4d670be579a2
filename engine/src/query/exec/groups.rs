//! `GROUP BY x, CAST(x AS t)`: DataFusion names a cast as the value it
//! casts, so both keys are named `x`. Its `eliminate_group_by_constant`
//! drops the cast (it follows from `x`) and projects both keys back under
//! their names, which a projection refuses ("require unique expression
//! names"): a query SQL answers failed to plan. [`GroupKeysKeepNames`]
//! runs that rule only where the keys' names are unique; elsewhere the
//! aggregate keeps every key, which is the same grouping.

use std::collections::HashSet;

use datafusion::common::tree_node::Transformed;
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::LogicalPlan;
use datafusion::optimizer::{ApplyOrder, OptimizerConfig, OptimizerRule};

/// DataFusion's `eliminate_group_by_constant` (`inner`), skipped for an
/// aggregate whose group keys share a name.
#[derive(Debug)]
pub struct GroupKeysKeepNames {
    inner: std::sync::Arc<dyn OptimizerRule + Send + Sync>,
}

impl GroupKeysKeepNames {
    /// The name of the rule this one wraps.
    pub const WRAPS: &'static str = "eliminate_group_by_constant";

    pub fn new(inner: std::sync::Arc<dyn OptimizerRule + Send + Sync>) -> Self {
        Self { inner }
    }
}

/// Whether two group keys of `plan` (an aggregate) have the same name.
fn keys_share_a_name(plan: &LogicalPlan) -> bool {
    let LogicalPlan::Aggregate(aggregate) = plan else {
        return false;
    };
    let mut names = HashSet::new();
    !aggregate
        .group_expr
        .iter()
        .all(|key| names.insert(key.schema_name().to_string()))
}

impl OptimizerRule for GroupKeysKeepNames {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        self.inner.apply_order()
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        config: &dyn OptimizerConfig,
    ) -> DfResult<Transformed<LogicalPlan>> {
        match keys_share_a_name(&plan) {
            true => Ok(Transformed::no(plan)),
            false => self.inner.rewrite(plan, config),
        }
    }
}
