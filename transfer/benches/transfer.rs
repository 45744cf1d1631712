//! Throughput of the step codec: encode, decode, and both, with compression off and LZ4, on
//! three kinds of step. Throughput is counted in uncompressed payload bytes.
//!
//! - `wide_deep`: 60 tensors of a 256-example batch as a wide & deep model's input pipeline
//!   sends them: 30 int64 id features (hashed into 10,000 buckets, so partly repetitive), 20
//!   float32 dense features and 10 int32 [256, 2] cross features.
//! - `float_1mib`: one float32 tensor of 1 MiB (262,144 values in [0, 1): poorly compressible).
//! - `strings`: 32 examples × 10 string fields (CSV-like numbers and words, 3 to 20 bytes).
//!
//! `encode_local` is the frame a worker sends a receiver on this machine
//! (`encode_parts_for`: uncompressed, large values borrowed, no checksum).
//!
//! Run with `cargo bench -p lode-transfer --bench transfer` (`-- --quick` for a fast pass).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use lode_runtime::{Tensor, TensorData};
use lode_transfer::{CodecConfig, Compression, StepDecoder, StepEncoder, StepMessage};

/// A small deterministic generator (xorshift64*), so runs are comparable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A float in [0, 1) from the top 24 bits.
    fn unit(&mut self) -> f32 {
        // 24 bits convert to f32 exactly.
        (self.next() >> 40) as f32 / 16_777_216.0
    }
}

fn tensor(shape: Vec<usize>, data: TensorData) -> Tensor {
    Tensor::new(shape, data).expect("valid tensor")
}

fn message(tensors: Vec<Tensor>) -> StepMessage {
    StepMessage {
        job: 1,
        stage: 0,
        step: 12_345,
        epoch: 2,
        records: Vec::new(),
        tensors,
    }
}

fn wide_deep(rng: &mut Rng) -> StepMessage {
    const BATCH: usize = 256;
    let mut tensors = Vec::with_capacity(60);
    for _ in 0..30 {
        let ids = (0..BATCH)
            .map(|_| i64::try_from(rng.below(10_000)).expect("small"))
            .collect();
        tensors.push(tensor(vec![BATCH], TensorData::Int64(ids)));
    }
    for _ in 0..20 {
        let values = (0..BATCH).map(|_| rng.unit() * 4.0 - 2.0).collect();
        tensors.push(tensor(vec![BATCH], TensorData::Float32(values)));
    }
    for _ in 0..10 {
        let crosses = (0..BATCH * 2)
            .map(|_| i32::try_from(rng.below(1_000)).expect("small"))
            .collect();
        tensors.push(tensor(vec![BATCH, 2], TensorData::Int32(crosses)));
    }
    message(tensors)
}

fn float_1mib(rng: &mut Rng) -> StepMessage {
    let n = (1 << 20) / 4;
    let values = (0..n).map(|_| rng.unit()).collect();
    message(vec![tensor(vec![n], TensorData::Float32(values))])
}

fn strings(rng: &mut Rng) -> StepMessage {
    const WORDS: [&str; 8] = [
        "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
    ];
    let tensors = (0..10)
        .map(|field| {
            let values = (0..32)
                .map(|_| {
                    if field % 2 == 0 {
                        rng.below(1_000_000).to_string().into_bytes()
                    } else {
                        let a = WORDS[usize::try_from(rng.below(8)).expect("small")];
                        let b = WORDS[usize::try_from(rng.below(8)).expect("small")];
                        format!("{a} {b}").into_bytes()
                    }
                })
                .collect();
            tensor(vec![32], TensorData::String(values))
        })
        .collect();
    message(tensors)
}

fn encoder(compression: Compression) -> StepEncoder {
    StepEncoder::new(CodecConfig {
        compression,
        ..CodecConfig::default()
    })
}

fn bench_codec(c: &mut Criterion) {
    let mut rng = Rng(0x853c_49e6_748f_ea9b);
    let workloads = [
        ("wide_deep", wide_deep(&mut rng)),
        ("float_1mib", float_1mib(&mut rng)),
        ("strings", strings(&mut rng)),
    ];
    for (name, msg) in &workloads {
        // The uncompressed payload size, from a frame stored raw.
        let raw = encoder(Compression::Off).encode(msg).expect("encodes");
        let payload = u64::try_from(raw.len() - 18).expect("fits");
        let mut group = c.benchmark_group(format!("transfer/{name}"));
        group.throughput(Throughput::Bytes(payload));
        for compression in [Compression::Off, Compression::Lz4] {
            let mut enc = encoder(compression);
            let mut dec = StepDecoder::default();
            let mut frame = Vec::new();
            enc.encode_into(msg, &mut frame).expect("encodes");
            let frame_len = frame.len();
            eprintln!("{name}: payload {payload} bytes, {compression} frame {frame_len} bytes");
            group.bench_function(BenchmarkId::new("encode", compression), |b| {
                b.iter(|| enc.encode_into(msg, &mut frame).expect("encodes"));
            });
            let encoded = frame.clone();
            group.bench_function(BenchmarkId::new("decode", compression), |b| {
                b.iter(|| dec.decode(&encoded).expect("decodes"));
            });
            group.bench_function(BenchmarkId::new("encode+decode", compression), |b| {
                b.iter(|| {
                    enc.encode_into(msg, &mut frame).expect("encodes");
                    dec.decode(&frame).expect("decodes")
                });
            });
        }
        // What a worker does for a receiver on this machine: values borrowed, no checksum.
        let mut enc = encoder(Compression::Auto);
        group.bench_function("encode_local", |b| {
            b.iter(|| enc.encode_parts_for(msg, true).expect("encodes").len());
        });
        group.finish();
    }
}

criterion_group!(benches, bench_codec);
criterion_main!(benches);
