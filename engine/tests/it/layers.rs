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

/// The files of `catalog/snapshot/`, lowest first: the manifest's format
/// below the files that store and read it, reading below the samplers.
const SNAPSHOT_FILES: [&str; 11] = [
    "escape",
    "mixture",
    "manifest",
    "check",
    "columns",
    "verify",
    "partition",
    "write",
    "read",
    "groups",
    "sampler",
];

/// The siblings `code` names as `super::name` (one name, or each of a
/// `super::{a, b}` group).
fn siblings_named(code: &str) -> Vec<String> {
    let ident = |text: &str| -> String {
        text.trim()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = Vec::new();
    for (at, _) in code.match_indices("super::") {
        let rest = &code[at + "super::".len()..];
        match rest.strip_prefix('{') {
            Some(group) => {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                names.extend(group.split(',').map(ident));
            }
            None => names.push(ident(rest)),
        }
    }
    names
}

#[test]
fn no_snapshot_file_names_one_above_it() {
    let root = std::env::var("CARGO_MANIFEST_DIR").unwrap_or(env!("CARGO_MANIFEST_DIR").into());
    let dir = Path::new(&root).join("src/catalog/snapshot");
    let mut found: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name != "mod.rs")
        .collect();
    found.sort();
    let mut listed: Vec<String> = SNAPSHOT_FILES.iter().map(|f| format!("{f}.rs")).collect();
    listed.sort();
    assert_eq!(
        found, listed,
        "every file of catalog/snapshot/ has its place"
    );
    let mut violations = Vec::new();
    for (level, file) in SNAPSHOT_FILES.iter().enumerate() {
        let text = std::fs::read_to_string(dir.join(format!("{file}.rs"))).unwrap();
        // test code sets up with any file (and a test module's `super` is
        // the file itself)
        let code = text.split("#[cfg(test)]").next().unwrap();
        for name in siblings_named(code) {
            // `super::super` is the catalog, below the folder's layer rule
            let below = SNAPSHOT_FILES[..level].contains(&name.as_str());
            if !below && name != "super" {
                violations.push(format!("{file}.rs names super::{name}"));
            }
        }
        if code.contains("catalog::snapshot") {
            violations.push(format!("{file}.rs names its folder by path"));
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn a_sibling_is_named_once_per_super() {
    let names = siblings_named("use super::a::X;\nuse super::{b, c::Y};\nsuper::d::f()");
    assert_eq!(names, ["a", "b", "c", "d"]);
}
