//! Tags: names given to snapshots, one small checksummed file each under
//! [`TAGS_DIR`] of a snapshot directory. A tagged snapshot survives
//! [`Dataset::cleanup`].

use std::collections::BTreeMap;

use super::{commit, Dataset};
use crate::store::fs;
use crate::{Error, Result};

/// Where tags live, inside a dataset's snapshot directory.
pub const TAGS_DIR: &str = "tags";

impl Dataset {
    /// Give snapshot `number` a name; named snapshots survive [`Dataset::cleanup`].
    pub fn tag(&self, name: &str, number: u64) -> Result<()> {
        let ok = !name.is_empty()
            && name.len() <= 100
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
            && !name.starts_with('.');
        if !ok {
            return Err(Error::invalid(format!(
                "invalid tag {name:?}: use 1-100 characters from [A-Za-z0-9._-], not starting with '.'"
            )));
        }
        // under the commit lock: a cleanup cannot delete the snapshot between
        // the check and the tag
        let _guard = commit::lock(&self.snapshot_dir)?;
        if !self.snapshot_numbers()?.contains(&number) {
            return Err(Error::invalid(format!(
                "there is no snapshot {number} to tag"
            )));
        }
        let dir = self.snapshot_dir.join(TAGS_DIR);
        std::fs::create_dir_all(&dir).map_err(Error::io(&dir))?;
        fs::write_atomic(&dir.join(name), commit::encode_tag(number).as_bytes())?;
        match &self.mirror {
            Some(m) => m.push_tag(&self.snapshot_dir, name),
            None => Ok(()),
        }
    }

    /// Every tag and the snapshot it names.
    pub fn tags(&self) -> Result<BTreeMap<String, u64>> {
        let dir = self.snapshot_dir.join(TAGS_DIR);
        let mut tags = BTreeMap::new();
        if !dir.is_dir() {
            return Ok(tags);
        }
        for entry in std::fs::read_dir(&dir).map_err(Error::io(&dir))? {
            let entry = entry.map_err(Error::io(&dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let raw = std::fs::read(entry.path()).map_err(Error::io(entry.path()))?;
            tags.insert(name, commit::parse_tag(&entry.path(), &raw)?);
        }
        Ok(tags)
    }
}
