//! Table `metadata`: a snapshot, zero-copy over its mapped column files,
//! one DataFusion partition per snapshot partition (cut finer when there
//! are fewer than the session's target partitions), scanned by
//! [`MetadataScanExec`]. A query maps and checks only the columns it reads,
//! of the partitions its filters can match: the manifest records the range
//! of each numeric column of each partition, and a partition no value of
//! whose ranges can satisfy the filters is skipped unread.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use arrow::array::{new_null_array, Array, ArrayRef, BooleanArray};
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::{Column, DFSchema, ScalarValue};
use datafusion::datasource::TableType;
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::pruning::{PruningPredicateBuilder, PruningStatistics};
use datafusion::physical_plan::ExecutionPlan;

use super::exec::MetadataScanExec;
use crate::catalog::Snapshot;

/// A snapshot as a table.
pub struct MetadataTable {
    snapshot: Arc<Snapshot>,
    /// DataFusion partitions to cut the rows into, at least.
    partitions: usize,
}

impl fmt::Debug for MetadataTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetadataTable")
            .field("snapshot", &self.snapshot.number())
            .field("partitions", &self.partitions)
            .finish()
    }
}

impl MetadataTable {
    pub fn new(snapshot: Arc<Snapshot>, partitions: usize) -> MetadataTable {
        MetadataTable {
            snapshot,
            partitions: partitions.max(1),
        }
    }

    /// The snapshot partitions whose ranges `filter` may match, in order:
    /// every one when the ranges cannot tell.
    pub fn matching(&self, filter: &Arc<dyn PhysicalExpr>) -> Vec<usize> {
        let all = (0..self.snapshot.num_partitions()).collect();
        let Some(predicate) = PruningPredicateBuilder::new()
            .with_file_schema(self.snapshot.schema())
            .build(filter.clone())
        else {
            return all;
        };
        match predicate.prune(&Ranges(&self.snapshot)) {
            Ok(keep) => keep
                .iter()
                .enumerate()
                .filter_map(|(p, &keep)| keep.then_some(p))
                .collect(),
            Err(_) => all,
        }
    }
}

#[async_trait]
impl TableProvider for MetadataTable {
    fn schema(&self) -> SchemaRef {
        self.snapshot.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        // filters choose partitions; DataFusion still filters their rows
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        _limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let schema = self.snapshot.schema();
        // Choosing partitions by their ranges is an optimization: it may use
        // any of the conjuncts (fewer keep more partitions, never fewer than
        // needed). Long filters are left to the rows: pruning 4,000 ANDed
        // conditions took seconds, and grew with the square of their count.
        let small = filters
            .iter()
            .filter(|f| at_most_nodes(f, PRUNE_NODES))
            .take(PRUNE_CONJUNCTS)
            .cloned();
        let parts = match conjunction(small) {
            Some(filter) => {
                let df_schema = DFSchema::try_from(schema.clone())?;
                self.matching(&state.create_physical_expr(filter, &df_schema)?)
            }
            None => (0..self.snapshot.num_partitions()).collect(),
        };
        let columns: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..schema.fields().len()).collect(),
        };
        let slices = MetadataScanExec::slices_of(&self.snapshot, &parts, self.partitions);
        let scan = MetadataScanExec::new(self.snapshot.clone(), columns, slices)?;
        Ok(Arc::new(scan))
    }
}

/// Partitions are chosen by at most this many of a filter's conjuncts...
const PRUNE_CONJUNCTS: usize = 32;
/// ... each of at most this many expression nodes.
const PRUNE_NODES: usize = 64;

/// Whether `expr` has at most `limit` nodes (stops counting past it).
fn at_most_nodes(expr: &Expr, limit: usize) -> bool {
    use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
    let mut seen = 0;
    let _ = expr.apply(|_| {
        seen += 1;
        Ok(match seen > limit {
            true => TreeNodeRecursion::Stop,
            false => TreeNodeRecursion::Continue,
        })
    });
    seen <= limit
}

/// The manifest's ranges, one container per snapshot partition.
struct Ranges<'a>(&'a Snapshot);

impl Ranges<'_> {
    fn values(&self, column: &Column, greatest: bool) -> Option<ArrayRef> {
        let schema = self.0.schema();
        let k = schema.index_of(column.name()).ok()?;
        let data_type = schema.field(k).data_type();
        let mut known = false;
        let values: Vec<ArrayRef> = (0..self.0.num_partitions())
            .map(
                |p| match self.0.range(p, k).and_then(|r| r.arrays(data_type)) {
                    Some((least, most)) => {
                        known = true;
                        if greatest {
                            most
                        } else {
                            least
                        }
                    }
                    None => new_null_array(data_type, 1),
                },
            )
            .collect();
        if !known {
            return None;
        }
        let refs: Vec<&dyn Array> = values.iter().map(|a| a.as_ref()).collect();
        arrow::compute::concat(&refs).ok()
    }
}

impl PruningStatistics for Ranges<'_> {
    fn min_values(&self, column: &Column) -> Option<ArrayRef> {
        self.values(column, false)
    }

    fn max_values(&self, column: &Column) -> Option<ArrayRef> {
        self.values(column, true)
    }

    fn num_containers(&self) -> usize {
        self.0.num_partitions()
    }

    fn null_counts(&self, _column: &Column) -> Option<ArrayRef> {
        None
    }

    fn row_counts(&self) -> Option<ArrayRef> {
        None
    }

    fn contained(&self, _column: &Column, _values: &HashSet<ScalarValue>) -> Option<BooleanArray> {
        None
    }
}
