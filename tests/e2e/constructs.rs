//! The construct graphs of `fixtures/constructs/` (one small training graph per
//! feature-pipeline construct of issue 14, written by `fixtures/gen/constructs.py` with
//! TensorFlow 2.18.1): every one partitions with exit 0, its whole data side runs on the data
//! worker (`lode kernels --coverage`), `lode exec` gives the crossing tensors TensorFlow
//! computed (recorded in each `facts.json`), and an index that the data runs out of range
//! fails with TensorFlow's message, naming the node and the step.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use lode_runtime::convert::decode_tensor;
use lode_runtime::{DType, Tensor, TensorData};
use serde_json::Value;

use crate::support::{fixtures, lode, ok, stderr, stdout};

fn constructs_dir() -> PathBuf {
    fixtures().join("constructs")
}

fn index() -> Value {
    let text = std::fs::read_to_string(constructs_dir().join("constructs.json"))
        .expect("constructs.json is committed");
    serde_json::from_str(&text).expect("constructs.json is JSON")
}

fn names(index: &Value, key: &str) -> Vec<String> {
    index[key]
        .as_array()
        .expect("a list")
        .iter()
        .map(|c| c["name"].as_str().expect("name").to_owned())
        .collect()
}

fn facts(dir: &Path) -> Value {
    let text = std::fs::read_to_string(dir.join("facts.json")).expect("facts.json");
    serde_json::from_str(&text).expect("facts.json is JSON")
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// A tensor as the generator records it (`dtype` TensorFlow's name, floats and strings hex).
fn golden(v: &Value) -> Tensor {
    let shape = v["shape"]
        .as_array()
        .expect("shape")
        .iter()
        .map(|d| usize::try_from(d.as_u64().expect("dim")).expect("dim"))
        .collect();
    let vals = v["values"].as_array().expect("values");
    let hex = |x: &Value| x.as_str().expect("hex").to_owned();
    let ints = || vals.iter().map(|x| x.as_i64().expect("int"));
    let dtype = match v["dtype"].as_str().expect("dtype") {
        "float32" => DType::Float32,
        "float64" => DType::Float64,
        name => DType::ALL
            .into_iter()
            .find(|d| d.name() == name)
            .unwrap_or_else(|| panic!("dtype {name}")),
    };
    let data = match dtype {
        DType::Float32 => TensorData::Float32(
            vals.iter()
                .map(|x| f32::from_bits(u32::from_str_radix(&hex(x), 16).expect("bits")))
                .collect(),
        ),
        DType::Float64 => TensorData::Float64(
            vals.iter()
                .map(|x| f64::from_bits(u64::from_str_radix(&hex(x), 16).expect("bits")))
                .collect(),
        ),
        DType::Float16 => TensorData::Float16(
            vals.iter()
                .map(|x| u16::from_str_radix(&hex(x), 16).expect("bits"))
                .collect(),
        ),
        DType::String => TensorData::String(vals.iter().map(|x| unhex(&hex(x))).collect()),
        DType::Bool => TensorData::Bool(vals.iter().map(|x| x.as_bool().expect("bool")).collect()),
        DType::Int8 => TensorData::Int8(ints().map(|x| i8::try_from(x).expect("i8")).collect()),
        DType::Int16 => TensorData::Int16(ints().map(|x| i16::try_from(x).expect("i16")).collect()),
        DType::Int32 => TensorData::Int32(ints().map(|x| i32::try_from(x).expect("i32")).collect()),
        DType::Int64 => TensorData::Int64(ints().collect()),
        DType::UInt8 => TensorData::UInt8(ints().map(|x| u8::try_from(x).expect("u8")).collect()),
        DType::UInt16 => {
            TensorData::UInt16(ints().map(|x| u16::try_from(x).expect("u16")).collect())
        }
        other => panic!("no golden dtype {other:?}"),
    };
    Tensor::new(shape, data).expect("golden tensor")
}

/// Distance in units in the last place (ordered bit patterns), for floats.
fn ulps32(a: f32, b: f32) -> u64 {
    let key = |x: f32| {
        let i = i64::from(x.to_bits().cast_signed());
        if i < 0 {
            i64::from(i32::MIN) - i
        } else {
            i
        }
    };
    key(a).abs_diff(key(b))
}

/// Equal, or (DESIGN.md invariant 3) float32 elements at most 1 ulp apart: TensorFlow's
/// grappler turns `x / sqrt(y)` into `x * rsqrt(y)`, whose approximation is the CPU's. Returns
/// how many elements are 1 ulp apart, or None when the tensors differ more.
fn close(got: &Tensor, want: &Tensor) -> Option<usize> {
    if got.bitwise_eq(want) {
        return Some(0);
    }
    match (got.data(), want.data()) {
        (TensorData::Float32(g), TensorData::Float32(w)) if got.shape() == want.shape() => {
            let mut one = 0;
            for (&a, &b) in g.iter().zip(w) {
                match ulps32(a, b) {
                    0 => {}
                    1 => one += 1,
                    _ if a.is_nan() && b.is_nan() => {}
                    _ => return None,
                }
            }
            Some(one)
        }
        _ => None,
    }
}

/// Every construct is cut with its whole data side on the data worker: the coverage report
/// says 100% and names no problem (an op that regresses, or a stale exception, fails here).
#[test]
fn every_construct_runs_its_data_side_natively() {
    let dir = constructs_dir();
    let out = lode(&[
        "kernels",
        "--coverage",
        dir.to_str().expect("UTF-8"),
        "--format",
        "json",
    ]);
    let report: Value = serde_json::from_str(&stdout(&out)).expect("a JSON report");
    let problems = report["problems"].as_array().expect("problems");
    assert!(
        out.status.success() && problems.is_empty(),
        "{problems:?} {}",
        stderr(&out)
    );
    let verdicts = report["constructs"].as_array().expect("constructs");
    let listed = names(&index(), "constructs");
    assert_eq!(verdicts.len(), listed.len());
    assert!(listed.len() >= 60, "{} constructs", listed.len());
    for v in verdicts {
        assert!(
            v["native"].as_bool().expect("native") || v["exception"].is_string(),
            "{v}"
        );
    }
    // Every construct not listed in decoupler's EXCEPTIONS (each with its reason) is native;
    // today there are none, so the report says 100%.
    let exceptions = verdicts
        .iter()
        .filter(|v| v["exception"].is_string())
        .count();
    assert_eq!(exceptions, lode_decoupler::coverage::EXCEPTIONS.len());
    let native = listed.len() - exceptions;
    let text = ok(&lode(&[
        "kernels",
        "--coverage",
        dir.to_str().expect("UTF-8"),
    ]));
    assert!(
        text.contains(&format!(
            "{native} of {} constructs run natively",
            listed.len()
        )),
        "{text}"
    );
    if exceptions == 0 {
        assert!(text.contains("(100.0%)"), "{text}");
    }
}

/// `lode exec` of each construct's stage gives, step by step, the crossing tensors that
/// TensorFlow computed when the generator ran the graph: bit for bit, but for float32
/// elements 1 ulp apart where TensorFlow itself used an approximation (counted, and few).
#[test]
fn construct_stages_equal_tensorflows_crossing_tensors() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut compared = 0usize;
    let mut one_ulp = 0usize;
    for name in names(&index(), "constructs") {
        let dir = constructs_dir().join(&name);
        let facts = facts(&dir);
        let steps = facts["steps"].as_u64().expect("steps");
        let plan = tmp.path().join(&name);
        let out = ok(&lode(&[
            "partition",
            dir.join("model.pb").to_str().expect("UTF-8"),
            "-o",
            plan.to_str().expect("UTF-8"),
            "--format",
            "json",
        ]));
        let plan_json: Value = serde_json::from_str(&out).expect("plan JSON");
        let dump = tmp.path().join(format!("{name}-dump"));
        ok(&lode(&[
            "exec",
            plan.to_str().expect("UTF-8"),
            "--steps",
            &steps.to_string(),
            "--dump",
            dump.to_str().expect("UTF-8"),
        ]));
        let crossing: HashMap<&str, &Value> = facts["crossing"]
            .as_object()
            .expect("crossing")
            .iter()
            .map(|(k, v)| (k.as_str(), v))
            .collect();
        let sends = plan_json["stages"][0]["send"]["tensors"]
            .as_array()
            .expect("send tensors");
        let mut here = 0;
        for (k, send) in sends.iter().enumerate() {
            let tensor = send["tensor"].as_str().expect("tensor");
            let Some(values) = crossing.get(tensor) else {
                continue;
            };
            for step in 0..steps {
                let path = dump.join(format!("step_{step}")).join(format!("{k}.pb"));
                let got = decode_tensor(&std::fs::read(&path).expect("dumped")).expect("decodes");
                let want = golden(&values[usize::try_from(step).expect("step")]);
                let near = close(&got, &want);
                one_ulp += near.unwrap_or(0);
                assert!(
                    near.is_some(),
                    "{name} step {step} {tensor}: got {:?} {:?}, TensorFlow {:?} {:?}",
                    got.shape(),
                    got.data(),
                    want.shape(),
                    want.data()
                );
                here += 1;
            }
        }
        assert!(
            here > 0,
            "{name}: no send tensor is one TensorFlow's view of the cut crosses"
        );
        compared += here;
    }
    assert!(compared > 500, "{compared} tensors compared");
    assert!(one_ulp < 20, "{one_ulp} float elements 1 ulp apart");
}

/// An index the data runs out of range fails the step with TensorFlow's own message, named
/// with the node and the step (TensorFlow's `, node name: …` suffix aside: Lode names it).
#[test]
fn an_out_of_range_index_fails_like_tensorflow_naming_node_and_step() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let errors = names(&index(), "errors");
    assert!(errors.len() >= 4, "{errors:?}");
    for name in errors {
        let dir = constructs_dir().join("errors").join(&name);
        let want = &facts(&dir)["error"];
        let plan = tmp.path().join(&name);
        ok(&lode(&[
            "partition",
            dir.join("model.pb").to_str().expect("UTF-8"),
            "-o",
            plan.to_str().expect("UTF-8"),
        ]));
        let out = lode(&["exec", plan.to_str().expect("UTF-8"), "--steps", "3"]);
        assert_eq!(out.status.code(), Some(2), "{name}: {}", stderr(&out));
        let err = stderr(&out);
        let message = want["message"].as_str().expect("message");
        let message = message.split(", node name: ").next().expect("the message");
        let step = want["step"].as_u64().expect("step");
        let node = want["node"].as_str().expect("node");
        let op = want["op"].as_str().expect("op");
        assert!(
            err.contains(&format!("step {step}: node {node} ({op}): "))
                && err.trim_end().ends_with(message),
            "{name}: Lode says {err:?}; TensorFlow fails step {step} at {node}: {message:?}"
        );
    }
}
