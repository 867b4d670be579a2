//! The memory a query may hold, and where it spills past it.
//!
//! Every session runs under one memory pool with a limit: sorts and
//! grouped aggregates spill to temporary files when they reach it, and a
//! query that still needs more (a hash join's build side, a result too big
//! to hand back) ends with [`crate::Error::DataFusion`] saying so, a
//! `QueryError` in Python. Without a pool, a query bigger than memory ended
//! the process (an allocation failure aborts).
//!
//! Spilled files go to the system's temporary directory, at most
//! [`SPILL_LIMIT_ENV`] of them (default: half the space free there when
//! the session starts, at most 100 GiB): a query never fills the disk.
//!
//! The memory limit: [`MEMORY_LIMIT_ENV`] when set (bytes, or with a `K`,
//! `M`, `G` or `T` suffix, powers of 1024), else half of what this process
//! can have: the machine's memory, or the address-space limit (`RLIMIT_AS`)
//! when it is lower (then a quarter of it: mapped files, stacks and the
//! allocator's slack count there too).

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::execution::memory_pool::{
    FairSpillPool, MemoryConsumer, MemoryPool, TrackConsumersPool,
};
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::{execute_stream, ExecutionPlan};
use futures::StreamExt;

use crate::{Error, Result};

/// The variable that sets every session's memory limit.
pub const MEMORY_LIMIT_ENV: &str = "DATASETRT_MEMORY_LIMIT";

/// The variable that bounds the temporary files one session spills
/// (default: [`default_spill_limit`]); past it a query fails as past memory.
pub const SPILL_LIMIT_ENV: &str = "DATASETRT_SPILL_LIMIT";

/// The memory limit of a new session (see the module).
pub fn memory_limit() -> Result<usize> {
    match std::env::var(MEMORY_LIMIT_ENV) {
        Ok(text) => parse_bytes(&text).ok_or_else(|| {
            Error::invalid(format!(
                "{MEMORY_LIMIT_ENV}={text:?} is not a size: bytes, or a number with K, M, G or T"
            ))
        }),
        Err(_) => Ok(default_limit()),
    }
}

/// `text` as bytes: digits with an optional `K`, `M`, `G` or `T` (and
/// optional `iB`/`B`) suffix; at least 1 MiB.
pub fn parse_bytes(text: &str) -> Option<usize> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: u64 = number.parse().ok()?;
    let shift = match unit.trim().trim_end_matches("iB").trim_end_matches('B') {
        "" => 0,
        "K" | "k" => 10,
        "M" | "m" => 20,
        "G" | "g" => 30,
        "T" | "t" => 40,
        _ => return None,
    };
    let bytes = number.checked_mul(1 << shift)?;
    (bytes >= 1 << 20).then(|| usize::try_from(bytes).ok())?
}

/// Half the machine's memory, or a quarter of the address-space limit when
/// that is lower.
fn default_limit() -> usize {
    // SAFETY: sysconf and getrlimit only read system values into locals.
    let (pages, page, space) = unsafe {
        let mut limit = std::mem::zeroed::<libc::rlimit>();
        let space = match libc::getrlimit(libc::RLIMIT_AS, &mut limit) {
            0 if limit.rlim_cur != libc::RLIM_INFINITY => Some(limit.rlim_cur as u64),
            _ => None,
        };
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
            space,
        )
    };
    let machine = match (pages, page) {
        (p, s) if p > 0 && s > 0 => p as u64 * s as u64,
        _ => 8 << 30,
    };
    let limit = (machine / 2).min(space.map_or(u64::MAX, |s| s / 4));
    usize::try_from(limit.max(64 << 20)).unwrap_or(usize::MAX)
}

/// A runtime whose pool holds `limit` bytes, spilling to the system's
/// temporary directory (DataFusion's disk manager). The pool is fair: each
/// operator that can spill gets an equal share of what the others do not
/// hold, so one partition's sort cannot starve another's into failing.
pub fn runtime(limit: usize) -> Result<Arc<RuntimeEnv>> {
    let pool: Arc<dyn MemoryPool> = Arc::new(TrackConsumersPool::new(
        FairSpillPool::new(limit),
        std::num::NonZeroUsize::new(3).expect("3 is not 0"),
    ));
    let spill = match std::env::var(SPILL_LIMIT_ENV) {
        Ok(text) => parse_bytes(&text).ok_or_else(|| {
            Error::invalid(format!(
                "{SPILL_LIMIT_ENV}={text:?} is not a size: bytes, or a number with K, M, G or T"
            ))
        })? as u64,
        Err(_) => default_spill_limit(),
    };
    Ok(RuntimeEnvBuilder::new()
        .with_memory_pool(pool)
        .with_max_temp_directory_size(spill)
        .build_arc()?)
}

/// Half the space free in the system's temporary directory, at most
/// 100 GiB (DataFusion's default) and at least 64 MiB.
pub fn default_spill_limit() -> u64 {
    let dir = std::env::temp_dir();
    let free = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .ok()
        .and_then(|path| {
            // SAFETY: statvfs fills the zeroed struct from a NUL-terminated path.
            let mut stats = unsafe { std::mem::zeroed::<libc::statvfs>() };
            // SAFETY: as above; `stats` outlives the call.
            let ok = unsafe { libc::statvfs(path.as_ptr(), &mut stats) } == 0;
            ok.then(|| stats.f_bavail as u64 * stats.f_frsize as u64)
        });
    free.map_or(100 << 30, |f| (f / 2).min(100 << 30))
        .max(64 << 20)
}

/// Run `plan` to its batches, the batches held counted against the
/// session's pool: a result bigger than the limit is an error, not an
/// allocation that ends the process.
pub async fn collect(
    plan: Arc<dyn ExecutionPlan>,
    task: Arc<TaskContext>,
) -> Result<Vec<RecordBatch>> {
    let held = MemoryConsumer::new("query result").register(task.memory_pool());
    let mut stream = execute_stream(plan, task)?;
    let mut batches = Vec::new();
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        held.try_grow(batch.get_array_memory_size())?;
        batches.push(batch);
    }
    // the caller holds the rows from here: the pool serves the next query
    held.free();
    Ok(batches)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_bytes("2G"), Some(2 << 30));
        assert_eq!(parse_bytes(" 512MiB "), Some(512 << 20));
        assert_eq!(parse_bytes("1048576"), Some(1 << 20));
        assert_eq!(parse_bytes("3TB"), Some(3 << 40));
        for bad in [
            "",
            "G",
            "1.5G",
            "-1G",
            "12X",
            "100",
            "99999999999999999999T",
        ] {
            assert_eq!(parse_bytes(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_default_is_a_share_of_the_machine() {
        let limit = default_limit();
        assert!(limit >= 64 << 20, "{limit}");
    }
}
