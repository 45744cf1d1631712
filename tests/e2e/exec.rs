//! `lode exec`: stages run natively on the fixtures' data. Equality with TensorFlow's own
//! crossing tensors is checked by tests/conformance/exec_equivalence.py (under the pinned
//! TensorFlow, in CI); these tests pin what can be known without TensorFlow: the values read
//! from the CSV text itself, determinism across thread counts, the epoch wrap, and the errors
//! for corrupt input.

use std::path::{Path, PathBuf};

use lode_runtime::convert::decode_tensor;
use lode_runtime::records::tfrecord::encode_record;
use lode_runtime::{Tensor, TensorData};

use crate::support::{fixtures, lode, ok, stderr};

/// Copies fixtures/<model> (graph and data) into a fresh directory, so tests can corrupt it.
fn copy_fixture(model: &str, into: &Path) -> PathBuf {
    let dst = into.join(model);
    copy_dir(&fixtures().join(model), &dst);
    dst
}

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).expect("create the copy");
    for entry in std::fs::read_dir(src).expect("read the fixture") {
        let entry = entry.expect("entry");
        let to = dst.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &to);
        } else {
            std::fs::copy(entry.path(), &to).expect("copy a fixture file");
        }
    }
}

fn partition(model_dir: &Path, plan: &Path) {
    ok(&lode(&[
        "partition",
        model_dir.join("model.pb").to_str().expect("UTF-8"),
        "-o",
        plan.to_str().expect("UTF-8"),
    ]));
}

fn exec(plan: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["exec", plan.to_str().expect("UTF-8")];
    args.extend_from_slice(extra);
    lode(&args)
}

/// `lode exec PLAN EXTRA --format json`, run to success: its report.
fn exec_json(plan: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = extra.to_vec();
    args.extend_from_slice(&["--format", "json"]);
    let out = exec(plan, &args);
    ok(&out);
    serde_json::from_slice(&out.stdout).expect("a JSON report")
}

fn read_dump(dir: &Path, step: u64, k: usize) -> Tensor {
    let path = dir.join(format!("step_{step}")).join(format!("{k}.pb"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    decode_tensor(&bytes).expect("a dumped TensorProto decodes")
}

fn floats(t: &Tensor) -> &[f32] {
    match t.data() {
        TensorData::Float32(v) => v,
        other => panic!("expected float32, got {:?}", other.dtype()),
    }
}

#[test]
fn sgd_ref_steps_are_the_csv_rows_in_order_and_wrap_at_the_epoch() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let plan = tmp.path().join("plan");
    partition(&fixtures().join("sgd_ref"), &plan);
    let dump = tmp.path().join("dump");
    ok(&exec(
        &plan,
        &[
            "--steps",
            "10",
            "--threads",
            "1",
            "--dump",
            dump.to_str().expect("UTF-8"),
        ],
    ));
    // The expected values straight from the text: header skipped, x0..x3 then y per row.
    let csv = std::fs::read_to_string(fixtures().join("sgd_ref/data/train.csv")).expect("csv");
    let rows: Vec<Vec<f32>> = csv
        .lines()
        .skip(1)
        .map(|l| {
            l.split(',')
                .map(|f| f.parse().expect("a float field"))
                .collect()
        })
        .collect();
    assert_eq!(rows.len(), 256);
    for step in 0..10u64 {
        let x = read_dump(&dump, step, 0);
        let y = read_dump(&dump, step, 1);
        assert_eq!(x.shape(), &[32, 4]);
        assert_eq!(y.shape(), &[32, 1]);
        // 256 rows make 8 steps per epoch; steps 8 and 9 start the second epoch.
        let first = usize::try_from(step % 8).expect("small") * 32;
        for r in 0..32 {
            let row = &rows[first + r];
            assert_eq!(
                floats(&x)[r * 4..r * 4 + 4]
                    .iter()
                    .map(|f| f.to_bits())
                    .collect::<Vec<_>>(),
                row[..4].iter().map(|f| f.to_bits()).collect::<Vec<_>>(),
                "step {step} row {r}"
            );
            assert_eq!(
                floats(&y)[r].to_bits(),
                row[4].to_bits(),
                "step {step} row {r}"
            );
        }
    }
}

/// The steps are computed and run a chunk (4,096 steps) at a time, so that a long run's memory
/// does not grow with its length: a run over several chunks (sgd_ref has 8 steps an epoch)
/// still counts every step and every sample once.
#[test]
fn a_run_of_several_chunks_counts_every_step_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let plan = tmp.path().join("plan");
    partition(&fixtures().join("sgd_ref"), &plan);
    for threads in ["1", "2"] {
        let report = exec_json(&plan, &["--steps", "5000", "--threads", threads]);
        assert_eq!(report["steps"], 5_000, "{threads} thread(s): {report}");
        assert_eq!(report["samples"], 160_000, "{threads} thread(s): {report}");
        assert_eq!(report["skipped_steps"], 0, "{report}");
    }
}

/// A run counts its CPU over the steps (its loading not in it) and its pool threads' part of
/// it: the steady figure `peer.py worker-eff` puts beside a worker's.
#[test]
fn a_run_reports_its_cpu_over_the_steps_and_its_pool_threads_part() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let plan = tmp.path().join("plan");
    partition(&fixtures().join("sgd_ref"), &plan);
    for threads in ["1", "2"] {
        let report = exec_json(&plan, &["--steps", "5000", "--threads", threads]);
        let cpu = report["cpu_seconds"].as_f64().expect("cpu_seconds");
        let pool = report["step_threads_cpu_seconds"]
            .as_f64()
            .expect("step_threads_cpu_seconds");
        assert!(cpu > 0.0, "{threads} thread(s): {report}");
        // The pool's threads are part of the process, and the steps are most of its work.
        assert!(
            pool <= cpu && pool >= 0.5 * cpu,
            "{threads} thread(s): {report}"
        );
        let out = exec(&plan, &["--steps", "50", "--threads", threads]);
        ok(&out);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("CPU over the steps: ") && text.contains("of it in the pool's threads"),
            "{text}"
        );
    }
}

#[test]
fn thread_counts_give_identical_tensors() {
    let tmp = tempfile::tempdir().expect("tempdir");
    for model in ["sgd_ref", "adam_resource", "wide_deep", "deepfm"] {
        let plan = tmp.path().join(format!("plan-{model}"));
        partition(&fixtures().join(model), &plan);
        let last = (serde_json::from_slice::<serde_json::Value>(
            &std::fs::read(plan.join("plan.json")).expect("plan.json"),
        )
        .expect("JSON")["stages"]
            .as_array()
            .expect("stages")
            .len()
            - 1)
        .to_string();
        let one = tmp.path().join(format!("one-{model}"));
        let two = tmp.path().join(format!("two-{model}"));
        for (dir, threads) in [(&one, "1"), (&two, "2")] {
            ok(&exec(
                &plan,
                &[
                    "--stage",
                    &last,
                    "--steps",
                    "9",
                    "--threads",
                    threads,
                    "--dump",
                    dir.to_str().expect("UTF-8"),
                ],
            ));
        }
        for step in 0..9 {
            let a = one.join(format!("step_{step}"));
            let mut files: Vec<_> = std::fs::read_dir(&a)
                .expect("dumped step")
                .map(|e| e.expect("entry").file_name())
                .collect();
            files.sort();
            assert!(!files.is_empty());
            for f in files {
                assert_eq!(
                    std::fs::read(a.join(&f)).expect("read"),
                    std::fs::read(two.join(format!("step_{step}")).join(&f)).expect("read"),
                    "{model} step {step} {f:?}"
                );
            }
        }
    }
}

/// Asserts exit status 2 and one stderr line containing every `needle`.
fn expect_error(output: &std::process::Output, needles: &[&str]) {
    let err = stderr(output);
    assert_eq!(output.status.code(), Some(2), "stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    for n in needles {
        assert!(err.contains(n), "{n:?} missing from: {err}");
    }
}

/// The byte offset of TFRecord record `n` in `bytes`.
fn record_offset(bytes: &[u8], n: usize) -> usize {
    let mut at = 0;
    for _ in 0..n {
        let len = u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        at += 12 + usize::try_from(len).expect("small") + 4;
    }
    at
}

#[test]
fn a_bad_crc_names_the_file_and_record_and_ignore_errors_skips_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let model = copy_fixture("adam_resource", tmp.path());
    let data = model.join("data/train.tfrecord");
    let mut bytes = std::fs::read(&data).expect("data");
    // Flip a byte inside record 37's payload: its data CRC no longer matches.
    let at = record_offset(&bytes, 37) + 12 + 5;
    bytes[at] ^= 0x55;
    std::fs::write(&data, &bytes).expect("write");
    let plan = tmp.path().join("plan");
    partition(&model, &plan);
    // Record 37 is in step 1 (records 32..63).
    expect_error(
        &exec(&plan, &["--steps", "3"]),
        &["train.tfrecord", "record 37", "step 1"],
    );
    let out = ok(&exec(
        &plan,
        &["--steps", "3", "--ignore-errors", "--format", "json"],
    ));
    let report: serde_json::Value = serde_json::from_str(&out).expect("JSON report");
    assert_eq!(report["steps"], 3);
    assert_eq!(report["skipped_records"], 1);
    // drop_remainder: the short batch is dropped, so step 1 produces nothing.
    assert_eq!(report["skipped_steps"], 1);
    assert_eq!(report["samples"], 64);
}

#[test]
fn a_truncated_file_names_the_file_and_record() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let model = copy_fixture("adam_resource", tmp.path());
    let data = model.join("data/train.tfrecord");
    let bytes = std::fs::read(&data).expect("data");
    let cut = record_offset(&bytes, 100) + 20;
    std::fs::write(&data, &bytes[..cut]).expect("write");
    let plan = tmp.path().join("plan");
    partition(&model, &plan);
    expect_error(
        &exec(&plan, &["--steps", "1"]),
        &["train.tfrecord", "record 100", "truncated"],
    );
    // ignore_errors: the file ends at the damage (TensorFlow's behaviour): 100 records are
    // 3 full steps per epoch.
    let out = ok(&exec(
        &plan,
        &["--steps", "4", "--ignore-errors", "--format", "json"],
    ));
    let report: serde_json::Value = serde_json::from_str(&out).expect("JSON report");
    assert_eq!(report["samples"], 128);
}

#[test]
fn a_malformed_csv_line_names_the_file_and_line() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let model = copy_fixture("sgd_ref", tmp.path());
    let data = model.join("data/train.csv");
    let text = std::fs::read_to_string(&data).expect("csv");
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    // Line 40 of the file (counting from 0; line 0 is the header) is record 39 of the epoch,
    // in step 1.
    lines[40] = "0.5,not-a-number,1,2,3".into();
    std::fs::write(&data, lines.join("\n") + "\n").expect("write");
    let plan = tmp.path().join("plan");
    partition(&model, &plan);
    expect_error(
        &exec(&plan, &["--steps", "2"]),
        &["train.csv record 40", "DecodeCSV", "not-a-number"],
    );
    // The map runs on whole batches here, so ignore_errors drops the step's batch.
    let out = ok(&exec(
        &plan,
        &["--steps", "2", "--ignore-errors", "--format", "json"],
    ));
    let report: serde_json::Value = serde_json::from_str(&out).expect("JSON report");
    assert_eq!(report["skipped_steps"], 1);
    assert_eq!(report["samples"], 32);
}

/// A serialized `tf.train.Example` with float features (name, values).
fn example(features: &[(&str, &[f32])]) -> Vec<u8> {
    fn ld(field: u8, payload: &[u8], out: &mut Vec<u8>) {
        out.push(field << 3 | 2);
        let mut n = payload.len();
        loop {
            let b = u8::try_from(n & 0x7f).expect("7 bits");
            n >>= 7;
            if n == 0 {
                out.push(b);
                break;
            }
            out.push(b | 0x80);
        }
        out.extend_from_slice(payload);
    }
    let mut map = Vec::new();
    for (name, values) in features {
        let packed: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut float_list = Vec::new();
        ld(1, &packed, &mut float_list);
        let mut feature = Vec::new();
        ld(2, &float_list, &mut feature);
        let mut entry = Vec::new();
        ld(1, name.as_bytes(), &mut entry);
        ld(2, &feature, &mut entry);
        ld(1, &entry, &mut map);
    }
    let mut features_msg = Vec::new();
    features_msg.extend(map);
    let mut ex = Vec::new();
    ld(1, &features_msg, &mut ex);
    ex
}

#[test]
fn a_missing_required_feature_names_the_file_and_record() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let model = copy_fixture("adam_resource", tmp.path());
    let data = model.join("data/train.tfrecord");
    let mut out = Vec::new();
    for i in 0..64u16 {
        let x = [f32::from(i), 1.0, 2.0, 3.0];
        let ex = if i == 45 {
            example(&[("x", &x)])
        } else {
            example(&[("x", &x), ("y", &[0.5])])
        };
        encode_record(&ex, &mut out);
    }
    std::fs::write(&data, &out).expect("write");
    let plan = tmp.path().join("plan");
    partition(&model, &plan);
    // Steps 0 and 1 run; record 45 lacks "y" and the feature has no default.
    let dump = tmp.path().join("dump");
    let output = exec(
        &plan,
        &["--steps", "1", "--dump", dump.to_str().expect("UTF-8")],
    );
    ok(&output);
    assert_eq!(floats(&read_dump(&dump, 0, 0))[4], 1.0, "record 1's x[0]");
    expect_error(
        &exec(&plan, &["--steps", "2"]),
        &["train.tfrecord record 45", "\"y\"", "required"],
    );
}

#[test]
fn a_missing_vocabulary_file_is_named() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let model = copy_fixture("wide_deep", tmp.path());
    std::fs::remove_file(model.join("data/country_vocab.txt")).expect("remove the vocabulary");
    let plan = tmp.path().join("plan");
    partition(&model, &plan);
    expect_error(&exec(&plan, &["--steps", "1"]), &["country_vocab.txt"]);
}

#[test]
fn bad_arguments_are_errors() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let plan = tmp.path().join("plan");
    partition(&fixtures().join("sgd_ref"), &plan);
    expect_error(&exec(&plan, &["--stage", "3"]), &["stage 3", "1 stage"]);
    expect_error(
        &exec(&tmp.path().join("nowhere"), &[]),
        &["nowhere", "plan.json"],
    );
    std::fs::write(tmp.path().join("plan.json"), b"{\"version\": 1").expect("write");
    expect_error(&exec(tmp.path(), &[]), &["plan.json", "not a Lode plan"]);
    let dump = tmp.path().join("dump");
    std::fs::create_dir_all(&dump).expect("mkdir");
    std::fs::write(dump.join("keep.txt"), b"user data").expect("write");
    expect_error(
        &exec(&plan, &["--dump", dump.to_str().expect("UTF-8")]),
        &["not empty"],
    );
    assert_eq!(
        std::fs::read(dump.join("keep.txt")).expect("kept"),
        b"user data"
    );
}

#[test]
fn ops_without_a_kernel_stay_in_training_or_are_refused_when_strict() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // deepfm with its Log1p turned into Expm1 (same signature; TensorFlow has it, Lode's data
    // worker does not).
    let text = std::fs::read_to_string(fixtures().join("deepfm/model.pbtxt")).expect("pbtxt");
    assert!(text.contains("op: \"Log1p\""));
    let model = tmp.path().join("model.pbtxt");
    std::fs::write(&model, text.replace("op: \"Log1p\"", "op: \"Expm1\"")).expect("write");
    let partition =
        |plan: &Path, extra: &[&str]| crate::support::partition_into(&model, plan, extra);
    // By default the Expm1 stays in training and the plan runs.
    let plan = tmp.path().join("plan");
    let data_root = fixtures().join("deepfm");
    let out = partition(&plan, &["--data-root", data_root.to_str().expect("UTF-8")]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let plan_json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(plan.join("plan.json")).expect("plan written"))
            .expect("JSON");
    assert_eq!(plan_json["kernel_limits"][0]["op"], "Expm1", "{plan_json}");
    assert!(plan_json["stages"][0].get("missing_kernels").is_none());
    let out = exec(&plan, &["--steps", "1"]);
    assert!(out.status.success(), "{}", stderr(&out));

    // --strict-kernels refuses, and a worker refuses the stage.
    let plan = tmp.path().join("strict");
    let out = partition(&plan, &["--strict-kernels"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a negative answer: {}",
        stderr(&out)
    );
    let report = crate::support::stdout(&out);
    assert!(report.contains("NO KERNEL for Expm1"), "{report}");
    let plan_json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(plan.join("plan.json")).expect("plan written"))
            .expect("JSON");
    let missing = &plan_json["stages"][0]["missing_kernels"]["Expm1"];
    assert_eq!(missing.as_array().map(Vec::len), Some(1), "{missing}");
    expect_error(
        &exec(&plan, &["--steps", "1"]),
        &["no kernel", "Expm1", "used by"],
    );
}

#[test]
fn a_transport_run_counts_the_frames_it_encodes_and_sends_and_refuses_threads_and_dump() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let plan = tmp.path().join("plan");
    partition(&fixtures().join("sgd_ref"), &plan);
    let mut bytes = Vec::new();
    for (transport, frames) in [("none", 0), ("encode", 12), ("loopback", 12)] {
        let out = ok(&exec(
            &plan,
            &[
                "--steps",
                "12",
                "--transport",
                transport,
                "--format",
                "json",
            ],
        ));
        let report: serde_json::Value =
            serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
        assert_eq!(report["steps"], 12, "{out}");
        assert_eq!(report["threads"], 1, "{out}");
        let sent = &report["sending"];
        assert_eq!(sent["transport"], transport, "{out}");
        assert_eq!(sent["frames"], frames, "{out}");
        assert!(
            sent["cpu_us_per_step"].as_f64().is_some_and(|us| us > 0.0),
            "{out}"
        );
        assert!(
            sent["stage_us_per_step"]
                .as_f64()
                .is_some_and(|us| us > 0.0),
            "{out}"
        );
        // The freeing is timed only when there are tensors to free (a frame was encoded),
        // and the steady figure is then the stages and the freeing over the CPU.
        let free = sent["free_us_per_step"].as_f64().expect("free_us_per_step");
        let steady = sent["steady"].as_f64().expect("steady");
        if frames == 0 {
            assert_eq!(free, 0.0, "{out}");
        } else {
            assert!(free > 0.0, "{out}");
            let cpu = sent["cpu_us_per_step"].as_f64().expect("cpu");
            let stage = sent["stage_us_per_step"].as_f64().expect("stage");
            assert!(((stage + free) / cpu - steady).abs() < 1e-9, "{out}");
        }
        bytes.push(sent["bytes"].as_u64().expect("bytes"));
    }
    assert_eq!(bytes[0], 0, "nothing encoded");
    // Each frame holds a step's 32 x 4 floats and 32 labels at least, after its prefix.
    assert!(bytes[1] > 12 * (4 + 32 * 5 * 4), "{bytes:?}");
    assert_eq!(bytes[1], bytes[2], "loopback writes what encode makes");

    let out = exec(
        &plan,
        &["--steps", "2", "--transport", "loopback", "--threads", "2"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--threads must be 1"),
        "{}",
        stderr(&out)
    );
    let dump = tmp.path().join("dump");
    let out = exec(
        &plan,
        &[
            "--steps",
            "2",
            "--transport",
            "encode",
            "--dump",
            dump.to_str().expect("UTF-8"),
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--transport and --dump"),
        "{}",
        stderr(&out)
    );
    assert!(!dump.exists(), "nothing dumped");
}
