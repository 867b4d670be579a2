//! Every DataFusion node and optimizer rule of the engine, together:
//!
//! * [`SampleExec`]: the loader plan's source, one reader's draws of an epoch.
//! * [`MetadataScanExec`]: a scan of table `metadata`, by recipe.
//! * [`PayloadScanExec`]: a scan of table `payloads`.
//! * [`PayloadTakeExec`]: identities in, the same rows plus payload columns out.
//! * [`PayloadJoinRule`]: a join with `payloads` on the identity becomes a
//!   `PayloadTakeExec` over the other side.
//! * [`YieldingJoins`]: joins that give the runtime back its threads.
//! * [`PopulationWriteExec`]: a query's rows stored as partitions of an
//!   update where they are computed, planned by [`WritingPlanner`].

mod coop;
mod join_rule;
pub(crate) mod metadata_scan;
pub(crate) mod sample;
pub(crate) mod scan;
pub mod take;
mod write;

pub use coop::YieldingJoins;
pub use join_rule::PayloadJoinRule;
pub use metadata_scan::{MetadataScanExec, Slice};
pub use sample::{draws_schema, SampleExec};
pub use scan::PayloadScanExec;
pub use take::{PayloadColumn, PayloadTakeExec, Unmatched};
pub use write::{describe, PopulationWriteExec, WriteTo, WritingPlanner};
