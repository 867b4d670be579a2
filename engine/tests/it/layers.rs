//! The engine's layers point down only: a module may name the modules below
//! it and never one above. A newcomer finds each concern in one place, and a
//! change to a higher layer cannot break a lower one.

use std::path::Path;

/// Lowest first: `store` (bytes on disk), `imports` (foreign formats read
/// to build caches), `sample` (which rows, in which order), `catalog`
/// (datasets, snapshots, commits), `query` (DataFusion), `load` (bytes to
/// Python).
const LAYERS: [&str; 6] = ["store", "imports", "sample", "catalog", "query", "load"];

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_layer_names_a_layer_above_it() {
    // read at run time: a target directory shared by checkouts at other
    // paths may hold this binary built elsewhere
    let root = std::env::var("CARGO_MANIFEST_DIR").unwrap_or(env!("CARGO_MANIFEST_DIR").into());
    let src = Path::new(&root).join("src");
    let mut violations = Vec::new();
    for (level, layer) in LAYERS.iter().enumerate() {
        let mut files = Vec::new();
        sources(&src.join(layer), &mut files);
        assert!(!files.is_empty(), "no sources for layer {layer}");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for above in &LAYERS[level + 1..] {
                for (n, line) in text.lines().enumerate() {
                    if line.contains(&format!("crate::{above}")) {
                        violations.push(format!(
                            "{}:{}: {layer} names {above}: {}",
                            file.strip_prefix(&src).unwrap().display(),
                            n + 1,
                            line.trim()
                        ));
                    }
                }
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}
