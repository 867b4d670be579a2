//! Every DataFusion node and optimizer rule of the engine, together:
//!
//! * [`SampleExec`]: the loader plan's source, one reader's draws of an epoch.
//! * [`MetadataScanExec`]: a scan of table `metadata`, by recipe.
//! * [`PayloadScanExec`]: a scan of table `payloads`.
//! * [`PayloadTakeExec`]: identities in, the same rows plus payload columns out.
//! * [`PayloadJoinRule`]: a join with `payloads` on the identity becomes a
//!   `PayloadTakeExec` over the other side.
//! * [`YieldingJoins`]: joins that give the runtime back its threads.
//! * [`LimitAboveWindows`]: `ORDER BY ... LIMIT` over a window function
//!   keeps its limit above the window (DataFusion moved it below).
//! * [`BalanceChains`]: long `AND`/`OR`/`||` chains as balanced trees (a
//!   generated 20,000-term filter plans in linear time, without deep
//!   recursion).
//! * [`CanonicalFloats`]: every float a query computes has one NaN and one
//!   zero, as the values it reads do ([`canonical_batch`]): SQL's equality
//!   and order of floats, where Arrow's and DataFusion's differ.
//! * [`BetweenAsComparisons`]: `BETWEEN` compares each pair of operands in
//!   its own type, as SQL does (not all three in one).
//! * [`GroupKeysKeepNames`]: `GROUP BY x, CAST(x AS t)` plans (DataFusion
//!   names both keys `x`).
//! * [`SortKeysAsColumns`], [`EnsureOrderings`]: ordinary sorts plan where
//!   DataFusion's ordering analysis cannot see the order a plan delivers.
//! * [`PopulationWriteExec`]: a query's rows stored as partitions of an
//!   update where they are computed, planned by [`WritingPlanner`].

mod between;
mod coop;
mod deep;
mod floats;
mod groups;
mod join_rule;
pub(crate) mod metadata_scan;
pub(crate) mod sample;
pub(crate) mod scan;
mod sorts;
pub mod take;
mod window_limit;
mod write;

use std::sync::Arc;

use datafusion::optimizer::analyzer::{Analyzer, AnalyzerRule};
use datafusion::optimizer::{Optimizer, OptimizerRule};
use datafusion::physical_optimizer::optimizer::PhysicalOptimizer;
use datafusion::physical_optimizer::sanity_checker::SanityCheckPlan;
use datafusion::physical_optimizer::PhysicalOptimizerRule;

pub use between::BetweenAsComparisons;
pub use coop::YieldingJoins;
pub use deep::BalanceChains;
pub use floats::{canonical, canonical_batch, CanonicalFloats};
pub use groups::GroupKeysKeepNames;
pub use join_rule::{NoteSorts, PayloadJoinRule};
pub use metadata_scan::{MetadataScanExec, Slice};
pub use sample::{draws_schema, SampleExec};
pub use scan::PayloadScanExec;
pub use sorts::{EnsureOrderings, SortKeysAsColumns};
pub use take::{PayloadColumn, PayloadTakeExec, Unmatched};
pub use window_limit::LimitAboveWindows;
pub use write::{describe, PopulationWriteExec, WriteTo, WritingPlanner};

/// The rules of the engine's sessions, ours among DataFusion's, in order.
pub struct Rules {
    pub analyzer: Vec<Arc<dyn AnalyzerRule + Send + Sync>>,
    pub logical: Vec<Arc<dyn OptimizerRule + Send + Sync>>,
    pub physical: Vec<Arc<dyn PhysicalOptimizerRule + Send + Sync>>,
}

impl Rules {
    pub fn ours() -> Rules {
        let mut analyzer: Vec<Arc<dyn AnalyzerRule + Send + Sync>> =
            vec![Arc::new(BalanceChains), Arc::new(BetweenAsComparisons)];
        analyzer.extend(Analyzer::new().rules);
        // after type coercion, before the optimizer folds constants
        analyzer.push(Arc::new(CanonicalFloats));
        // long chains balanced before DataFusion's rules in each pass (they
        // are quadratic on a left-deep chain) and after them (they rebuild
        // conjunctions left-deep): see `BalanceChains`
        let mut logical: Vec<Arc<dyn OptimizerRule + Send + Sync>> = vec![Arc::new(BalanceChains)];
        logical.extend(Optimizer::new().rules.into_iter().map(|rule| {
            match rule.name() == GroupKeysKeepNames::WRAPS {
                true => Arc::new(GroupKeysKeepNames::new(rule)) as _,
                false => rule,
            }
        }));
        logical.push(Arc::new(BalanceChains));
        logical.push(Arc::new(SortKeysAsColumns));
        // before DataFusion's passes, one of which moves a top-k sort below
        // a window function (`LimitAboveWindows`)
        let mut physical: Vec<Arc<dyn PhysicalOptimizerRule + Send + Sync>> =
            vec![Arc::new(NoteSorts), Arc::new(LimitAboveWindows)];
        let sanity = SanityCheckPlan::new();
        physical.extend(
            PhysicalOptimizer::new()
                .rules
                .into_iter()
                .filter(|rule| rule.name() != sanity.name()),
        );
        physical.push(Arc::new(PayloadJoinRule));
        physical.push(Arc::new(YieldingJoins));
        physical.push(Arc::new(EnsureOrderings));
        // DataFusion's own check that every node gets the ordering and
        // partitioning it requires, once, after our rules: a rule or node
        // that declares more than it delivers is a planning error, not
        // wrong rows
        physical.push(Arc::new(sanity));
        Rules {
            analyzer,
            logical,
            physical,
        }
    }
}

/// Whether any node of `plan` (itself included) is a `T`, or one of the
/// `T`s `is` accepts (walked until the first found).
pub(crate) fn any_node(
    plan: &Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    is: impl Fn(&dyn std::any::Any) -> bool,
) -> bool {
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    let mut found = false;
    let _ = plan.apply(|node| {
        found = is(node.as_ref() as &dyn std::any::Any);
        Ok(match found {
            true => TreeNodeRecursion::Stop,
            false => TreeNodeRecursion::Continue,
        })
    });
    found
}
