//! Table `payloads`: one row per stored sample, keyed by `(cache_id,
//! sample_id)`, with the index columns (`stored_len`, `raw_len`, `codec`,
//! `checksum`) and `data`.
//!
//! Scanning it ([`PayloadScanExec`]) reads payload bytes only when `data` is
//! selected. A join of any query with `payloads` on the identity is planned by
//! [`PayloadJoinRule`](super::exec::PayloadJoinRule) to a `PayloadTakeExec`
//! over the other side: only the joined rows are read, never every payload.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::TableType;
use datafusion::error::Result as DfResult;
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::ExecutionPlan;

use super::exec::scan::schema_of;
use super::exec::take::PayloadColumn;
use super::exec::PayloadScanExec;
use crate::store::CacheSet;

/// The `payloads` table of a dataset.
#[derive(Debug)]
pub struct PayloadsTable {
    caches: CacheSet,
    concurrency: usize,
}

impl PayloadsTable {
    pub fn new(caches: CacheSet, concurrency: usize) -> Self {
        PayloadsTable {
            caches,
            concurrency,
        }
    }
}

#[async_trait]
impl TableProvider for PayloadsTable {
    fn schema(&self) -> SchemaRef {
        schema_of(&PayloadColumn::ALL)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let columns: Vec<PayloadColumn> = match projection {
            Some(p) => p.iter().map(|&i| PayloadColumn::ALL[i]).collect(),
            None => PayloadColumn::ALL.to_vec(),
        };
        Ok(Arc::new(PayloadScanExec::new(
            self.caches.clone(),
            columns,
            limit,
            self.concurrency,
        )))
    }
}
