//! Lease throughput of the dispatcher's state machine under TensorFlow's order: 10M records in
//! batches of 32, shuffled through a 1M-element buffer, against the same chain without the
//! shuffle (sequential order). One worker loops RequestLease → Complete → Consumed, so each
//! iteration is one step leased, completed and consumed (three commands, their events, and
//! the step's order computed by the walk); the buffer's initial fill is paid in the warm-up,
//! and one epoch (312,500 steps) outlasts a measurement.
//!
//! A second group times the order alone (`StepOrder::batch` of the next step), which is the
//! part the shuffle changes.
//!
//! Run: `cargo bench -p lode-dispatcher --bench order`

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use lode_dispatcher::{
    Command, DispatcherConfig, DispatcherState, IndexChain, StageId, StepId, Time, WorkerId,
    PROTOCOL_VERSION,
};
use lode_proto::plan::IndexOp;

const RECORDS: u64 = 10_000_000;
const BUFFER: i64 = match option_env!("LODE_BENCH_BUFFER") {
    Some(_) => 1_000,
    None => 1_000_000,
};
const BATCH: i64 = 32;

fn config(shuffled: bool) -> DispatcherConfig {
    let mut ops = Vec::new();
    if shuffled {
        ops.push(IndexOp::Shuffle {
            buffer_size: BUFFER,
            seed: 7,
            seed2: 42,
            reshuffle_each_iteration: true,
        });
    }
    ops.push(IndexOp::Batch {
        batch_size: BATCH,
        drop_remainder: true,
    });
    let chain = IndexChain {
        ops,
        picked_seed: None,
    };
    DispatcherConfig::for_chain(RECORDS, chain, None, Duration::from_secs(3_600), 1, 1)
        .expect("config")
}

fn leases(c: &mut Criterion) {
    let mut group = c.benchmark_group("lease_10M_records");
    group.throughput(Throughput::Elements(1));
    for (name, shuffled) in [("sequential", false), ("shuffle_1M_buffer", true)] {
        let mut state = DispatcherState::new(config(shuffled)).expect("state");
        let worker = WorkerId(1);
        let now = Time::from_millis(0);
        state
            .apply(
                Command::RegisterWorker {
                    worker,
                    stage: StageId(0),
                    protocol_version: PROTOCOL_VERSION,
                },
                now,
            )
            .expect("register");
        group.bench_function(name, |b| {
            b.iter(|| state.lease_complete_consume(worker, now).expect("a step"));
        });
    }
    group.finish();
}

fn order_alone(c: &mut Criterion) {
    let mut group = c.benchmark_group("order_10M_records");
    group.throughput(Throughput::Elements(1));
    for (name, shuffled) in [("sequential", false), ("shuffle_1M_buffer", true)] {
        let config = config(shuffled);
        let per_epoch = config.steps_per_epoch();
        let mut order = config.step_order().expect("a chain");
        let mut next = 0u64;
        group.bench_function(name, |b| {
            b.iter(|| {
                let id = StepId::new(next / per_epoch, next % per_epoch);
                let batch = order.batch(id.epoch.0, id.step.0).expect("a step");
                next += 1;
                batch
            });
        });
    }
    group.finish();
}

criterion_group!(benches, leases, order_alone);
criterion_main!(benches);
