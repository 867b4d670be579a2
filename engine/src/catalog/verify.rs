//! Verification: every byte a dataset stores checked again, every problem
//! reported rather than the first.

use super::{snapshot, Dataset};
use crate::store::Cache;
use crate::Error;

impl Dataset {
    /// Check everything this dataset stores: every record of every cache
    /// (reopened from disk, its manifest, index and attributes checked whole
    /// again), the head, the tags, and every snapshot manifest with every
    /// column file it names (checksums recomputed, whatever this process
    /// verified before). Returns every problem found, not just the first;
    /// `progress` is told how many of `total` records and snapshots are done.
    pub fn verify(&self, progress: &dyn Fn(u64, u64)) -> Vec<Error> {
        let mut problems = Vec::new();
        let numbers = self.snapshot_numbers().unwrap_or_else(|e| {
            problems.push(e);
            Vec::new()
        });
        let total = self.caches.iter().map(|c| c.records()).sum::<u64>() + numbers.len() as u64;
        let mut done = 0;
        for cache in self.caches.iter() {
            // a remote cache is read (and fetched) through its replica
            let reopened = match cache.replica() {
                Some(_) => None,
                None => match Cache::open(cache.dir()) {
                    Ok(c) => Some(c),
                    Err(e) => {
                        problems.push(e);
                        done += cache.records();
                        continue;
                    }
                },
            };
            let reopened = reopened.as_ref().unwrap_or(cache);
            // its index and attributes whole, whatever was checked before
            if let Err(e) = reopened.check_files() {
                problems.push(e);
            }
            let mut buf = Vec::new();
            for sample in 0..reopened.records() {
                buf.clear();
                if let Err(e) = reopened.read_into(sample, &mut buf, true) {
                    problems.push(e);
                }
                done += 1;
                if done % 4096 == 0 {
                    progress(done, total);
                }
            }
        }
        if let Err(e) = self.head() {
            problems.push(e);
        }
        if let Err(e) = self.tags() {
            problems.push(e);
        }
        let mut tables = std::collections::HashSet::new();
        for &n in &numbers {
            problems.extend(snapshot::verify_files(
                &self.snapshot_dir,
                n,
                Some(&mut tables),
            ));
            done += 1;
            progress(done, total);
        }
        progress(total, total);
        problems
    }
}
