//! Every fixture loads in every form it exists in, and `lode inspect --format json` agrees
//! with the facts TensorFlow recorded when it wrote the fixture.

use std::path::Path;

use serde_json::Value;

use crate::support::{fixture_dirs, lode_path, ok};

struct Form {
    path: std::path::PathBuf,
    tags: Option<Vec<String>>,
    /// The facts this form must match: the top-level facts, or a `meta_graphs` entry.
    facts: Value,
}

/// The (path, tags, facts) triples a fixture's facts.json describes.
fn forms(dir: &Path) -> Vec<Form> {
    let text = std::fs::read_to_string(dir.join("facts.json")).expect("facts.json readable");
    let facts: Value = serde_json::from_str(&text).expect("facts.json is JSON");
    let mut out = Vec::new();
    let forms = facts["forms"]
        .as_object()
        .expect("facts.forms is an object");
    for (_, file) in forms {
        let path = dir.join(file.as_str().expect("form path is a string"));
        match facts.get("meta_graphs").and_then(Value::as_array) {
            Some(metas) => {
                for meta in metas {
                    let tags = strings(&meta["tags"]);
                    out.push(Form {
                        path: path.clone(),
                        tags: Some(tags),
                        facts: meta.clone(),
                    });
                }
            }
            None => out.push(Form {
                path,
                tags: facts["tags"].as_array().map(|_| strings(&facts["tags"])),
                facts: facts.clone(),
            }),
        }
    }
    assert!(!out.is_empty(), "{} lists no forms", dir.display());
    out
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .expect("a JSON list")
        .iter()
        .map(|s| s.as_str().expect("a string").to_owned())
        .collect()
}

fn inspect(form: &Form) -> Value {
    let mut args = vec!["inspect", "--format", "json"];
    let tags = form.tags.as_ref().map(|t| t.join(","));
    if let Some(tags) = &tags {
        args.push("--tags");
        args.push(tags);
    }
    let out = ok(&lode_path(&args, &form.path));
    serde_json::from_str(&out).expect("inspect prints JSON")
}

#[test]
fn inspect_matches_tensorflow_facts_for_every_form() {
    let mut checked = 0;
    for dir in fixture_dirs() {
        for form in forms(&dir) {
            let report = inspect(&form);
            let what = format!("{} {:?}", form.path.display(), form.tags);
            assert_eq!(report["nodes"], form.facts["nodes"], "node count of {what}");
            assert_eq!(report["ops"], form.facts["ops"], "op histogram of {what}");
            assert_eq!(
                report["variables"], form.facts["variables"],
                "variables of {what}"
            );
            assert_eq!(
                report["functions"], form.facts["functions"],
                "functions of {what}"
            );
            if let Some(tags) = &form.tags {
                let mut want = tags.clone();
                want.sort();
                assert_eq!(report["tags"], serde_json::json!(want), "tags of {what}");
            }
            checked += 1;
        }
    }
    assert!(checked >= 15, "only {checked} fixture forms checked");
}

#[test]
fn inspect_traces_the_input_pipeline() {
    for dir in fixture_dirs() {
        let text = std::fs::read_to_string(dir.join("facts.json")).expect("facts.json");
        let facts: Value = serde_json::from_str(&text).expect("JSON");
        let Some(init) = facts["iterator_initializer"].as_str() else {
            continue;
        };
        for form in primary_forms(&dir, &facts) {
            let report = inspect(&form);
            let pipeline = &report["input_pipeline"];
            let inits: Vec<&str> = pipeline["initializers"]
                .as_array()
                .expect("initializers")
                .iter()
                .filter_map(|n| n["name"].as_str())
                .collect();
            assert!(
                inits.contains(&init),
                "{}: {inits:?} lacks {init}",
                form.path.display()
            );
            let chain = pipeline["chains"][0].as_array().expect("one dataset chain");
            assert!(
                chain.len() >= 3,
                "{}: short chain {chain:?}",
                form.path.display()
            );
            // Every dataset op's function must be found in the library with a non-empty body.
            for step in chain {
                for f in step["functions"].as_array().expect("functions") {
                    assert_eq!(f["found"], true, "{}: {f}", form.path.display());
                    assert!(f["ops"].as_object().is_some_and(|o| !o.is_empty()), "{f}");
                }
            }
            if let Some(get_next) = facts["get_next"].as_str() {
                assert!(
                    pipeline["get_next"]
                        .as_array()
                        .expect("get_next")
                        .iter()
                        .any(|n| n["name"] == get_next),
                    "{}: get_next {get_next} not reported",
                    form.path.display()
                );
            }
        }
    }
}

#[test]
fn wide_deep_pipeline_reads_tfrecords_and_parses_examples() {
    let dir = crate::support::fixtures().join("wide_deep");
    let out = ok(&lode_path(&["inspect"], &dir.join("model.pb")));
    assert!(out.contains("TFRecordDataset"), "{out}");
    assert!(out.contains("ParseExampleV2"), "{out}");
    assert!(out.contains("dataset chain"), "{out}");
}

#[test]
fn saved_model_signatures_are_reported() {
    for dir in fixture_dirs() {
        let text = std::fs::read_to_string(dir.join("facts.json")).expect("facts.json");
        let facts: Value = serde_json::from_str(&text).expect("JSON");
        let Some(signatures) = facts["signatures"].as_object().filter(|s| !s.is_empty()) else {
            continue;
        };
        for form in primary_forms(&dir, &facts) {
            let report = inspect(&form);
            for (name, sig) in signatures {
                let got = &report["signatures"][name];
                assert_eq!(
                    got["method_name"],
                    sig["method_name"],
                    "{name} in {}",
                    dir.display()
                );
                assert_eq!(
                    got["inputs"],
                    sig["inputs"],
                    "{name} inputs in {}",
                    dir.display()
                );
                assert_eq!(
                    got["outputs"],
                    sig["outputs"],
                    "{name} outputs in {}",
                    dir.display()
                );
            }
        }
    }
}

/// The forms holding the graph the top-level facts describe (for SavedModels with several
/// MetaGraphs: those with the top-level tags).
fn primary_forms(dir: &Path, facts: &Value) -> Vec<Form> {
    let tags = facts["tags"].as_array().map(|_| strings(&facts["tags"]));
    forms(dir).into_iter().filter(|f| f.tags == tags).collect()
}
