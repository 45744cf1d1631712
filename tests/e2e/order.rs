//! TensorFlow's element order through the whole path: the decoupler reads each
//! `fixtures/shuffle` graph (folding its seeds), the dispatcher's state machine leases the
//! steps of the chain it describes, and the leased batches are TensorFlow's elements, in order,
//! across every epoch.

use std::path::Path;
use std::time::Duration;

use lode_decoupler::graph::Graph;
use lode_decoupler::source::{describe, IndexOp};
use lode_dispatcher::{
    Command, DispatcherConfig, DispatcherState, Event, GrantedBatch, IndexChain, StageId, Time,
    WorkerId, PROTOCOL_VERSION,
};
use lode_proto::view::GraphView;
use lode_runtime::convert::decode_tensor;
use lode_runtime::TensorData;
use serde_json::Value;

use crate::partition::check_cover;
use crate::support::{fixtures, lode, ok, stderr};

/// Every batch the dispatcher leases, in step order, with one worker that completes each
/// step and a training side that consumes it at once.
fn leased(config: DispatcherConfig) -> Vec<Vec<u64>> {
    let mut state = DispatcherState::new(config).expect("config");
    let worker = WorkerId(1);
    let now = Time::from_millis(0);
    let mut events = state
        .apply(
            Command::RegisterWorker {
                worker,
                stage: StageId(0),
                protocol_version: PROTOCOL_VERSION,
            },
            now,
        )
        .expect("register");
    let mut out = Vec::new();
    while let Ok(step) = state.lease_complete_consume(worker, now) {
        let Some(Event::LeaseGranted {
            batch: GrantedBatch::Records(records),
            ..
        }) = step.first()
        else {
            panic!("a step starts with its grant, with its record ids");
        };
        out.push(records.clone());
        events.extend(step);
    }
    assert!(state.is_end_of_data(), "the job ends after its last step");
    // A restarted dispatcher replays the journal to the same state, every batch checked.
    let replayed = DispatcherState::replay(state.config().clone(), &events).expect("replay");
    assert_eq!(replayed, state);
    out
}

#[test]
fn the_dispatcher_leases_tensorflows_order_for_every_fixture_chain() {
    let dir = fixtures().join("shuffle");
    let text = std::fs::read_to_string(dir.join("orders.json")).expect("orders.json");
    let orders: Value = serde_json::from_str(&text).expect("parses");
    let cases = orders["cases"].as_array().expect("cases");
    assert!(cases.len() >= 50);
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let bytes = std::fs::read(dir.join("graphs").join(format!("{name}.pb"))).expect("graph");
        let view = GraphView::parse(&bytes).expect("graph parses");
        let graph = Graph::new(&view).expect("graph indexes");
        let source = describe(&graph).expect("a pipeline");
        assert_eq!(source.unsupported, None, "{name}");

        // plan.json holds the program's seeds, as TensorFlow evaluated them.
        let seeds: Vec<(i64, i64)> = source
            .order
            .iter()
            .filter_map(|op| match op {
                IndexOp::Shuffle { seed, seed2, .. } => Some((*seed, *seed2)),
                _ => None,
            })
            .collect();
        let want: Vec<(i64, i64)> = case["seeds"]
            .as_array()
            .expect("seeds")
            .iter()
            .map(|s| (s[0].as_i64().expect("seed"), s[1].as_i64().expect("seed2")))
            .collect();
        assert_eq!(seeds, want, "{name}: folded seeds");

        let (chain, epochs) = IndexChain::from_program(&source.order, None);
        // The leading skip and take are the reader's (its record numbers start after them).
        let skip = source.skip.map_or(0, |s| u64::try_from(s).expect("skip"));
        let mut records = case["n"].as_u64().expect("n").saturating_sub(skip);
        if let Some(take) = source.take {
            records = records.min(u64::try_from(take).expect("take"));
        }
        let config =
            DispatcherConfig::for_chain(records, chain, epochs, Duration::from_secs(1), 1, 1)
                .expect("config");
        let got: Vec<Vec<u64>> = leased(config)
            .into_iter()
            .map(|b| b.into_iter().map(|r| r + skip).collect())
            .collect();
        // An element is a record number, or a batch of them.
        let want: Vec<Vec<u64>> = serde_json::from_value::<Vec<Value>>(case["elements"].clone())
            .expect("elements")
            .into_iter()
            .map(|e| {
                serde_json::from_value::<Vec<u64>>(e.clone())
                    .or_else(|_| serde_json::from_value::<u64>(e).map(|r| vec![r]))
                    .expect("an element")
            })
            .collect();
        if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
            panic!(
                "{name}: step {i}: Lode leases {:?}, TensorFlow yields {:?}",
                got[i], want[i]
            );
        }
        assert_eq!(got.len(), want.len(), "{name}: steps");
    }
}

/// `lode partition` of the shuffled fixture program of `model` over that fixture's data.
fn partition_program(model: &str, plan: &Path) {
    let graph = fixtures().join(format!("shuffle/programs/{model}_shuffled.pb"));
    ok(&lode(&[
        "partition",
        graph.to_str().expect("UTF-8"),
        "--data-root",
        fixtures().join(model).to_str().expect("UTF-8"),
        "-o",
        plan.to_str().expect("UTF-8"),
    ]));
}

/// `lode exec` or `lode run` of `plan` for ten steps, writing `--dump` or `--log` to `out`.
fn ten_steps(command: &str, plan: &Path, flag: &str, out: &Path) {
    ok(&lode(&[
        command,
        plan.to_str().expect("UTF-8"),
        "--steps",
        "10",
        flag,
        out.to_str().expect("UTF-8"),
    ]));
}

/// The fixture training programs built with `shuffle=True` (`fixtures/shuffle/programs`):
/// `lode partition` keeps their seeds in plan.json and is a cover, and `lode exec` yields
/// TensorFlow's own first ten steps, bit for bit, the epoch boundary at step 8 included (a new
/// order there, as `reshuffle_each_iteration` derives it).
#[test]
fn shuffled_programs_partition_with_their_seeds_and_exec_yields_tensorflows_steps() {
    let dir = fixtures().join("shuffle");
    let text = std::fs::read_to_string(dir.join("orders.json")).expect("orders.json");
    let orders: Value = serde_json::from_str(&text).expect("parses");
    let programs = orders["programs"].as_array().expect("programs");
    assert_eq!(programs.len(), 2);
    let tmp = tempfile::tempdir().expect("tempdir");
    for program in programs {
        let model = program["model"].as_str().expect("model");
        let graph = dir.join("programs").join(format!("{model}_shuffled.pb"));
        let plan_dir = tmp.path().join(model);
        partition_program(model, &plan_dir);
        let plan: Value = serde_json::from_str(
            &std::fs::read_to_string(plan_dir.join("plan.json")).expect("plan.json"),
        )
        .expect("plan parses");
        // generate.py's builders: shuffle(256, seed=SEED) under set_random_seed(SEED).
        let seed = 20_240_611;
        assert_eq!(
            plan["source"]["shuffle_seed"],
            serde_json::json!([seed, seed])
        );
        assert_eq!(
            plan["source"]["order"][0],
            serde_json::json!({"op": "shuffle", "buffer_size": 256, "seed": seed,
                               "seed2": seed, "reshuffle_each_iteration": true})
        );
        let replaced: Vec<&str> = plan["source"]["replaced"]
            .as_array()
            .expect("replaced")
            .iter()
            .map(|v| v.as_str().expect("name"))
            .collect();
        assert!(replaced.contains(&"seed2/LogicalAnd"), "{replaced:?}");
        check_cover(&graph, None, &plan_dir, &plan);

        let dump = tmp.path().join(format!("{model}_dump"));
        ten_steps("exec", &plan_dir, "--dump", &dump);
        for (step, tensors) in program["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .enumerate()
        {
            for (k, want) in tensors.as_array().expect("tensors").iter().enumerate() {
                let path = dump.join(format!("step_{step}")).join(format!("{k}.pb"));
                let bytes = std::fs::read(&path).expect("a dumped tensor");
                let got = decode_tensor(&bytes).expect("decodes");
                let TensorData::Float32(got) = got.data() else {
                    panic!("{model}: step {step} tensor {k} is not float32");
                };
                // float32 values as their bit patterns.
                let want: Vec<u32> = serde_json::from_value(want.clone()).expect("bit patterns");
                if let Some(i) = got.iter().zip(&want).position(|(a, b)| a.to_bits() != *b) {
                    panic!(
                        "{model}: step {step} tensor {k} element {i}: Lode {}, TensorFlow {}",
                        got[i],
                        f32::from_bits(want[i])
                    );
                }
                assert_eq!(got.len(), want.len(), "{model}: step {step} tensor {k}");
            }
        }
    }
}

/// A pipeline that filters decides its steps by the records' values, which the dispatcher
/// cannot reproduce on indices: `lode partition` refuses it (status 2), naming the op.
#[test]
fn a_filtering_pipeline_is_refused_naming_the_op() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let graph = fixtures().join("shuffle/programs/range_filter.pb");
    let out = lode(&[
        "partition",
        graph.to_str().expect("UTF-8"),
        "-o",
        tmp.path().join("plan").to_str().expect("UTF-8"),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("FilterDataset"), "{}", stderr(&out));
    assert!(!tmp.path().join("plan").exists(), "no plan is written");
}

/// The whole runtime (dispatcher, two worker processes, the consumer) on the shuffled sgd_ref
/// program: the consumer's log names each step's records, and those CSV rows are the ones
/// TensorFlow's shuffled pipeline put in that step, in that order.
#[test]
fn lode_run_delivers_tensorflows_shuffled_steps() {
    let dir = fixtures().join("shuffle");
    let orders: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("orders.json")).expect("orders.json"),
    )
    .expect("parses");
    let program = &orders["programs"][0];
    assert_eq!(program["model"], "sgd_ref");
    let tmp = tempfile::tempdir().expect("tempdir");
    let plan = tmp.path().join("plan");
    let log = tmp.path().join("consumer.jsonl");
    partition_program("sgd_ref", &plan);
    ten_steps("run", &plan, "--log", &log);
    // Record r is CSV row r after the header (the program's leading skip(1)).
    let csv = std::fs::read_to_string(fixtures().join("sgd_ref/data/train.csv")).expect("csv");
    let rows: Vec<Vec<u32>> = csv
        .lines()
        .skip(1)
        .map(|l| {
            l.split(',')
                .map(|f| f.parse::<f32>().expect("a float").to_bits())
                .collect()
        })
        .collect();
    let steps: Vec<Value> = std::fs::read_to_string(&log)
        .expect("log")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a log line"))
        .collect();
    assert_eq!(steps.len(), 10);
    for (i, (step, want)) in steps
        .iter()
        .zip(program["steps"].as_array().expect("steps"))
        .enumerate()
    {
        let records: Vec<usize> = serde_json::from_value(step["records"].clone()).expect("records");
        let x: Vec<u32> = records
            .iter()
            .flat_map(|&r| rows[r][..4].to_vec())
            .collect();
        let want_x: Vec<u32> = serde_json::from_value(want[0].clone()).expect("x bits");
        assert_eq!(x, want_x, "step {i}: records {records:?}");
    }
}
