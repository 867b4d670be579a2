//! Cleanup: deleting the snapshots nobody keeps, then the column, alias and
//! partition files no remaining snapshot uses, and the host's records of
//! the files deleted.

use super::{assemble, commit, lease, schedule, snapshot, Dataset, Snapshot};
use crate::store::fs;
use crate::{Error, Result};

impl Dataset {
    /// Delete every snapshot except the newest `keep`, the tagged ones, those
    /// a run's schedule names, the head and the active one, then every column and alias file no
    /// remaining snapshot uses, and the partitions built with caches
    /// (`prepare_partitions`) that no snapshot directory beside this one
    /// links. Returns the deleted snapshot numbers. Holds
    /// the commit lock, so no commit of this dataset runs meanwhile.
    pub fn cleanup(&self, keep: usize) -> Result<Vec<u64>> {
        self.cleanup_with(keep, false)
    }

    /// [`Dataset::cleanup`], or with `dry_run` only the snapshot numbers it
    /// would delete now (nothing is deleted).
    pub fn cleanup_with(&self, keep: usize, dry_run: bool) -> Result<Vec<u64>> {
        let active = self.snapshot().number(); // before the lock: update locks in that order
        let _guard = commit::lock(&self.snapshot_dir)?;
        // snapshots a live process reads (a DataLoader's workers, another
        // job) are kept; no lease is taken until this cleanup is done
        let leased = lease::held(&self.snapshot_dir)?;
        let numbers = self.snapshot_numbers()?;
        let mut kept: std::collections::BTreeSet<u64> =
            numbers.iter().rev().take(keep).copied().collect();
        kept.extend(self.tags()?.values().copied());
        kept.extend(leased.numbers.iter().copied());
        // what runs drew from, for `exposures` (removing runs/<run> lets it go)
        kept.extend(schedule::named_snapshots(&self.snapshot_dir)?);
        kept.insert(active);
        kept.insert(self.head()?);
        let removed: Vec<u64> = numbers
            .iter()
            .copied()
            .filter(|n| !kept.contains(n))
            .collect();
        if dry_run {
            return Ok(removed);
        }
        let mut used = std::collections::HashSet::new();
        for &n in &kept {
            if numbers.contains(&n) {
                used.extend(snapshot::used_names(&self.snapshot_dir, n)?);
            }
        }
        let mut deleted: Vec<String> = Vec::new();
        for &n in &removed {
            let path = self.snapshot_dir.join(Snapshot::file_name(n));
            std::fs::remove_file(&path).map_err(Error::io(&path))?;
            deleted.push(Snapshot::file_name(n));
        }
        let columns = self.snapshot_dir.join(snapshot::COLUMNS_DIR);
        for entry in std::fs::read_dir(&columns).map_err(Error::io(&columns))? {
            let entry = entry.map_err(Error::io(&columns))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let stem = name.split('.').next().unwrap_or_default();
            if !name.starts_with('.') && !used.contains(stem) {
                std::fs::remove_file(entry.path()).map_err(Error::io(entry.path()))?;
                deleted.push(format!("{}/{name}", snapshot::COLUMNS_DIR));
            }
        }
        // the partitions built with their caches (`assemble::prepare`)
        // that no snapshot directory links any more
        let prepared = match self.snapshot_dir.parent() {
            Some(base) => assemble::remove_unlinked(base)?,
            None => Vec::new(),
        };
        // the host's records of verified columns go with their columns
        let gone: std::collections::HashSet<&str> = deleted
            .iter()
            .filter_map(|d| d.strip_prefix(snapshot::COLUMNS_DIR)?.strip_prefix('/'))
            .chain(prepared.iter().map(String::as_str))
            .filter_map(|name| name.strip_suffix(".arrow"))
            .collect();
        if let Some(Ok(records)) =
            crate::store::host::records::verified_dir().map(std::fs::read_dir)
        {
            for record in records.flatten() {
                let name = record.file_name().to_string_lossy().into_owned();
                if gone.contains(name.split('.').next().unwrap_or_default()) {
                    let _ = std::fs::remove_file(record.path());
                }
            }
        }
        fs::sync_dir(&self.snapshot_dir)?;
        if let Some(m) = &self.mirror {
            m.delete(&deleted)?; // manifests first: no kept snapshot names these columns
        }
        Ok(removed)
    }
}
