//! `lode simulate` through the binary: the JSON rows the issue names, and a bad trace.

use crate::support::{lode, ok, stderr};

#[test]
fn json_lists_every_scheduler_with_the_table_columns() {
    let out = ok(&lode(&["simulate", "--synthetic", "2", "--format", "json"]));
    let rows: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let rows = rows.as_array().expect("a list");
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["scheduler"].as_str().expect("name"))
        .collect();
    for want in [
        "no-dw-tuned",
        "no-dw-hw",
        "fixed-dw",
        "maxtp",
        "srtf",
        "fair",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    for row in rows {
        for key in ["avg_jct_min", "jct_gain", "avg_queue_min"] {
            assert!(
                row[key].as_f64().is_some_and(f64::is_finite),
                "{key} in {row}"
            );
        }
    }
    let reference = rows
        .iter()
        .find(|r| r["scheduler"] == "no-dw-tuned")
        .expect("reference");
    assert_eq!(reference["jct_gain"].as_f64(), Some(1.0));
}

#[test]
fn a_malformed_trace_is_refused_with_its_line() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let trace = tmp.path().join("trace.csv");
    std::fs::write(
        &trace,
        "job,arrival_s,gpus,steps,model\n0,0,1,100,resnet50\n1,5,lots,100,resnet50\n",
    )
    .expect("write");
    let out = lode(&["simulate", "--trace", trace.to_str().expect("path")]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("trace.csv") && err.contains("line 3") && err.contains("gpus"),
        "{err}"
    );
}

#[test]
fn no_floors_reaches_the_simulator() {
    // A long 8-GPU job among short jobs that want more CPUs than the cluster has: SRTF ranks it
    // last, and only its floor keeps it training (scheduler/README.md, "Floors"), so the flag
    // must change the average JCT.
    let tmp = tempfile::tempdir().expect("tempdir");
    let trace = tmp.path().join("trace.csv");
    let mut csv = String::from("0,0,8,24000,resnet18\n");
    for i in 1..=120 {
        csv.push_str(&format!("{i},{},1,8000,resnet18\n", 60 * i));
    }
    std::fs::write(&trace, csv).expect("write");
    let jct = |extra: &[&str]| {
        let path = trace.to_str().expect("path");
        let mut args = vec![
            "simulate", "--trace", path, "--policy", "srtf", "--format", "json",
        ];
        args.extend_from_slice(extra);
        let rows: serde_json::Value = serde_json::from_str(&ok(&lode(&args))).expect("JSON");
        rows[0]["avg_jct_min"].as_f64().expect("a number")
    };
    let (with, without) = (jct(&[]), jct(&["--no-floors"]));
    assert!((with - without).abs() > 0.01 * with, "{with} vs {without}");
}
