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

#[test]
fn cpu_only_machines_are_accepted_and_a_cluster_without_cpus_is_refused() {
    // Four CPU-only machines beside the paper's cluster: the same GPUs, more CPUs, and every
    // Lode policy faster than on the paper's cluster alone (the extra CPUs are data-worker
    // capacity that only Lode's data workers use).
    let trace = &["simulate", "--synthetic", "2", "--format", "json"];
    let rows = |extra: &[&str]| {
        let mut args = trace.to_vec();
        args.extend_from_slice(extra);
        let rows: serde_json::Value = serde_json::from_str(&ok(&lode(&args))).expect("JSON");
        rows.as_array().expect("a list").clone()
    };
    let jct = |rows: &[serde_json::Value], name: &str| {
        rows.iter()
            .find(|r| r["scheduler"] == name)
            .and_then(|r| r["avg_jct_min"].as_f64())
            .expect("a row")
    };
    let paper = rows(&[]);
    let more = rows(&["--cluster", "8x8gpu64cpu+4x0gpu64cpu"]);
    // The baselines run without data workers: CPU-only machines change nothing for them.
    assert_eq!(jct(&paper, "no-dw-tuned"), jct(&more, "no-dw-tuned"));
    assert_eq!(jct(&paper, "no-dw-hw"), jct(&more, "no-dw-hw"));
    for policy in ["maxtp", "srtf", "fair"] {
        assert!(
            jct(&more, policy) < jct(&paper, policy),
            "{policy}: {} with CPU-only machines, {} without",
            jct(&more, policy),
            jct(&paper, policy)
        );
    }
    for (spec, part) in [
        ("8x8gpu64cpu+2x0gpu0cpu", "CPUs must be positive"),
        ("8x8gpu64cpu+0x0gpu64cpu", "machine count"),
        ("4x0gpu64cpu", "no machine has GPUs"),
    ] {
        let out = lode(&["simulate", "--synthetic", "2", "--cluster", spec]);
        assert_eq!(out.status.code(), Some(2), "{spec}: {}", stderr(&out));
        assert!(stderr(&out).contains(part), "{spec}: {}", stderr(&out));
    }
}
