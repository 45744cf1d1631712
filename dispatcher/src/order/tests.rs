//! The walk against TensorFlow's own orders (`fixtures/shuffle/orders.json`, written by
//! `fixtures/gen/shuffle_orders.py` from TensorFlow 2.18.1) and against a direct simulation
//! of TensorFlow's ring buffer.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;

use lode_proto::plan::IndexOp;
use proptest::prelude::*;
use serde_json::Value;

use super::*;

fn orders() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/shuffle/orders.json");
    let text = std::fs::read_to_string(&path).expect("fixtures/shuffle/orders.json");
    serde_json::from_str(&text).expect("orders.json parses")
}

/// A case of the fixture: its records, its chain with the seeds TensorFlow's shuffle ops
/// received, and the elements TensorFlow yielded (each as its records).
pub(crate) struct Case {
    pub records: u64,
    pub ops: Vec<IndexOp>,
    pub elements: Vec<Vec<u64>>,
}

pub(crate) fn case(name: &str) -> Case {
    let all = orders();
    let case = all["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no case {name} in orders.json"));
    let int = |v: &Value| v.as_i64().expect("an integer");
    let mut seeds = case["seeds"].as_array().expect("seeds").iter();
    let ops = case["chain"]
        .as_array()
        .expect("chain")
        .iter()
        .flat_map(|op| match op["op"].as_str().expect("op") {
            "skip" => vec![IndexOp::Skip {
                count: int(&op["count"]),
            }],
            "take" => vec![IndexOp::Take {
                count: int(&op["count"]),
            }],
            "repeat" => vec![IndexOp::Repeat {
                count: int(&op["count"]),
            }],
            "batch" => vec![IndexOp::Batch {
                batch_size: int(&op["batch_size"]),
                drop_remainder: op["drop_remainder"].as_bool().expect("bool"),
            }],
            // A shuffle-and-repeat is a shuffle, then a repeat (see `IndexOp::Shuffle`).
            "shuffle"
            | "shuffle_v2"
            | "shuffle_v3"
            | "shuffle_and_repeat"
            | "shuffle_and_repeat_v2" => {
                let s = seeds.next().expect("seeds for every shuffle");
                let shuffle = IndexOp::Shuffle {
                    buffer_size: int(&op["buffer_size"]),
                    seed: int(&s[0]),
                    seed2: int(&s[1]),
                    reshuffle_each_iteration: op["reshuffle_each_iteration"]
                        .as_bool()
                        .expect("bool"),
                };
                if op["count"].is_null() {
                    return vec![shuffle];
                }
                vec![
                    shuffle,
                    IndexOp::Repeat {
                        count: int(&op["count"]),
                    },
                ]
            }
            other => panic!("unknown op {other}"),
        })
        .collect();
    let elements = case["elements"]
        .as_array()
        .expect("elements")
        .iter()
        .map(|e| match e {
            Value::Array(b) => b.iter().map(|r| r.as_u64().expect("record")).collect(),
            r => vec![r.as_u64().expect("record")],
        })
        .collect();
    Case {
        records: case["n"].as_u64().expect("n"),
        ops,
        elements,
    }
}

fn walk_all(records: u64, ops: Vec<IndexOp>) -> Vec<Vec<u64>> {
    let chain = IndexChain {
        ops,
        picked_seed: None,
    };
    let mut walk = chain.plan(records).expect("chain").walk(0);
    std::iter::from_fn(|| walk.next_elem().map(Elem::into_records)).collect()
}

/// The first element where two orders differ, for the failure message.
fn first_difference(got: &[Vec<u64>], want: &[Vec<u64>]) -> String {
    match got.iter().zip(want).position(|(a, b)| a != b) {
        Some(i) => format!("element {i}: Lode {:?}, TensorFlow {:?}", got[i], want[i]),
        None => format!(
            "Lode yields {} elements, TensorFlow {}",
            got.len(),
            want.len()
        ),
    }
}

/// The whole chain walked as one stream, and (when it ends in a repeat with none inside)
/// epoch by epoch as the dispatcher walks it, both equal TensorFlow's order.
fn check(name: &str) {
    let case = case(name);
    let got = walk_all(case.records, case.ops.clone());
    assert!(
        got == case.elements,
        "{name}: {}",
        first_difference(&got, &case.elements)
    );

    if let Some((IndexOp::Repeat { count }, pass)) = case.ops.split_last() {
        let chain = IndexChain {
            ops: pass.to_vec(),
            picked_seed: None,
        };
        if !chain.repeats() {
            let plan = chain.plan(case.records).expect("chain");
            let per_epoch = plan.len().expect("finite epoch");
            let epochs = u64::try_from(*count).expect("finite repeat");
            let mut order = StepOrder::new(plan, per_epoch, Some(epochs));
            // Epochs out of order, as a restarted dispatcher may start anywhere.
            let mut by_epoch = vec![Vec::new(); usize::try_from(epochs).expect("epochs")];
            for epoch in (0..epochs).rev() {
                for step in 0..per_epoch {
                    let b = order.batch(epoch, step).expect("step in range");
                    by_epoch[usize::try_from(epoch).expect("epoch")].push(b);
                }
                assert_eq!(order.batch(epoch, per_epoch), None);
                assert_eq!(order.batch(epochs, 0), None);
            }
            let got = by_epoch.concat();
            assert!(
                got == case.elements,
                "{name} by epoch: {}",
                first_difference(&got, &case.elements)
            );
        }
    }
}

macro_rules! tensorflow_orders {
    ($($name:ident)*) => {
        $(
            #[test]
            fn $name() {
                check(stringify!($name));
            }
        )*

        /// Every case of the fixture has its test above.
        #[test]
        fn every_fixture_case_is_tested() {
            let names: Vec<&str> = vec![$(stringify!($name)),*];
            for case in orders()["cases"].as_array().expect("cases") {
                let name = case["name"].as_str().expect("name");
                assert!(names.contains(&name), "no test for fixture case {name}");
            }
        }
    };
}

mod tensorflow {
    use super::check;
    use super::orders;

    tensorflow_orders! {
        buf1_op_reshuffle buf1_op_fixed buf1_graph_reshuffle buf1_graph_fixed
        buf1_both_reshuffle buf1_both_fixed
        buf7_op_reshuffle buf7_op_fixed buf7_graph_reshuffle buf7_graph_fixed
        buf7_both_reshuffle buf7_both_fixed
        buf64_op_reshuffle buf64_op_fixed buf64_graph_reshuffle buf64_graph_fixed
        buf64_both_reshuffle buf64_both_fixed
        buf1000_op_reshuffle buf1000_op_fixed buf1000_graph_reshuffle buf1000_graph_fixed
        buf1000_both_reshuffle buf1000_both_fixed
        shuffle_batch shuffle_batch_drop shuffle_batch_fixed
        batch_shuffle batch_drop_shuffle batch_shuffle_fixed
        repeat_shuffle repeat_shuffle_buf64 repeat_shuffle_buf1000 repeat_shuffle_fixed
        repeat_shuffle_batch repeat_shuffle_batch_drop
        shuffle_repeat_batch shuffle_repeat_batch_drop
        skip_shuffle take_shuffle shuffle_skip shuffle_take
        skip_take_shuffle_batch shuffle_batch_skip_take repeat_shuffle_take shuffle_take_fixed
        shuffle_batch_shuffle batch_only repeat_batch
        shuffle_batch_graph_seed shuffle_batch_op_seed shuffle_zero_seeds
        v3_dummy_reshuffle v3_dummy_fixed v3_anonymous_reshuffle
        v2_anonymous_reshuffle v2_anonymous_fixed
        shuffle_and_repeat_reshuffle shuffle_and_repeat_fixed shuffle_and_repeat_v2_reshuffle
        shuffle_and_repeat_v2_anonymous_fixed shuffle_and_repeat_v2_forever_take
    }
}

/// A direct simulation of TensorFlow's shuffle, written apart from the walk: iterators are
/// boxed closures, a shuffle keeps TensorFlow's ring buffer of `buffer_size` slots with
/// absolute positions taken modulo its size, and inputs are made where TensorFlow makes them
/// (eagerly for skip, take and batch; lazily for repeat passes and a shuffle's input).
type Gens = Rc<RefCell<Vec<Option<SeedGenerator>>>>;

fn simulate(
    records: u64,
    ops: Rc<Vec<Op>>,
    level: usize,
    gens: Gens,
) -> Box<dyn Iterator<Item = Elem>> {
    let Some(op) = level.checked_sub(1).map(|i| ops[i]) else {
        return Box::new((0..records).map(Elem::Record));
    };
    let below = {
        let (ops, gens) = (ops.clone(), gens.clone());
        move || simulate(records, ops.clone(), level - 1, gens.clone())
    };
    let cap = |k: u64| usize::try_from(k).unwrap_or(usize::MAX);
    match op {
        Op::Skip(None) | Op::Take(Some(0)) | Op::Repeat(Some(0)) => Box::new(std::iter::empty()),
        Op::Skip(Some(k)) => Box::new(below().skip(cap(k))),
        Op::Take(k) => Box::new(below().take(k.map_or(usize::MAX, cap))),
        Op::Repeat(count) => {
            Box::new((0..count.expect("finite repeats only")).flat_map(move |_| below()))
        }
        Op::Shuffle { buffer, .. } => {
            let (seed, seed2) = gens.borrow_mut()[level - 1]
                .as_mut()
                .expect("generator")
                .generate();
            let mut rng = Samples::new(seed, seed2);
            let slots = cap(buffer).min(1 << 17);
            let mut ring: Vec<Option<Elem>> = vec![None; slots];
            let (mut start, mut end) = (0usize, 0usize);
            let mut input: Option<Box<dyn Iterator<Item = Elem>>> = None;
            let mut below = Some(below);
            Box::new(std::iter::from_fn(move || {
                let input = input.get_or_insert_with(|| (below.take().expect("made once"))());
                while end - start < cap(buffer) {
                    let Some(e) = input.next() else { break };
                    assert!(end - start < slots, "the ring is sized for the test's data");
                    ring[end % slots] = Some(e);
                    end += 1;
                }
                if start == end {
                    return None;
                }
                let len = u64::try_from(end - start).expect("len");
                let offset = usize::try_from(u64::from(rng.next_u32()) % len).expect("offset");
                let index = (start + offset) % slots;
                let out = ring[index].take();
                ring.swap(index, start % slots);
                start += 1;
                out
            }))
        }
        Op::Batch {
            size,
            drop_remainder,
        } => {
            let mut input = below();
            Box::new(std::iter::from_fn(move || {
                let batch: Vec<u64> = input
                    .by_ref()
                    .take(cap(size))
                    .flat_map(Elem::into_records)
                    .collect();
                let short = u64::try_from(batch.len()).expect("len") < size;
                (!batch.is_empty() && (!drop_remainder || !short))
                    .then(|| Elem::Batch(batch.into()))
            }))
        }
    }
}

#[test]
fn a_trailing_repeat_makes_the_epochs() {
    let batch = IndexOp::Batch {
        batch_size: 4,
        drop_remainder: false,
    };
    let repeat = |count| IndexOp::Repeat { count };
    let split = |ops: &[IndexOp], epochs| {
        let (chain, epochs) = IndexChain::from_program(ops, epochs);
        (chain.ops, epochs)
    };
    assert_eq!(
        split(&[batch.clone(), repeat(3)], None),
        (vec![batch.clone()], Some(3))
    );
    assert_eq!(
        split(&[batch.clone(), repeat(-1)], None),
        (vec![batch.clone()], None)
    );
    assert_eq!(
        split(&[batch.clone(), repeat(-1)], Some(2)),
        (vec![batch.clone()], Some(2))
    );
    assert_eq!(
        split(std::slice::from_ref(&batch), None),
        (vec![batch.clone()], Some(1))
    );
    assert_eq!(
        split(std::slice::from_ref(&batch), Some(5)),
        (vec![batch.clone()], Some(5))
    );
    // A repeat inside: one long epoch, whatever --epochs says.
    let inner = vec![repeat(2), batch.clone(), repeat(3)];
    assert_eq!(split(&inner, Some(5)), (inner.clone(), Some(1)));
}

/// A buffer large enough for the walk to read its slots ahead (`LOOKAHEAD`) keeps the order
/// of the direct simulation, through the end of the input where the buffer drains.
#[test]
fn reading_ahead_keeps_the_order() {
    let chain = IndexChain {
        ops: vec![
            IndexOp::Shuffle {
                buffer_size: 70_000,
                seed: 3,
                seed2: 4,
                reshuffle_each_iteration: true,
            },
            IndexOp::Batch {
                batch_size: 32,
                drop_remainder: false,
            },
        ],
        picked_seed: None,
    };
    let plan = chain.plan(150_000).expect("chain");
    let gens = Rc::new(RefCell::new(plan.generators(1)));
    let ops = Rc::new(plan.ops.clone());
    let want: Vec<Elem> = simulate(150_000, ops.clone(), ops.len(), gens).collect();
    let mut walk = plan.walk(1);
    let got: Vec<Elem> = std::iter::from_fn(|| walk.next_elem()).collect();
    assert_eq!(got.len(), want.len());
    assert!(got == want, "the orders differ");
}

fn op_strategy() -> impl Strategy<Value = IndexOp> {
    prop_oneof![
        (-1i64..30).prop_map(|count| IndexOp::Skip { count }),
        (-1i64..60).prop_map(|count| IndexOp::Take { count }),
        (0i64..4).prop_map(|count| IndexOp::Repeat { count }),
        (1i64..80, 0i64..3, 0i64..1000, any::<bool>()).prop_map(|(b, s, s2, r)| {
            IndexOp::Shuffle {
                buffer_size: b,
                seed: s,
                seed2: s2 + 1,
                reshuffle_each_iteration: r,
            }
        }),
        (1i64..12, any::<bool>()).prop_map(|(b, d)| IndexOp::Batch {
            batch_size: b,
            drop_remainder: d
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_walk_equals_a_direct_simulation(
        records in 0u64..120,
        ops in prop::collection::vec(op_strategy(), 0..6),
    ) {
        let chain = IndexChain { ops, picked_seed: None };
        let Ok(plan) = chain.plan(records) else {
            // A batch of batches: refused, nothing to compare.
            return Ok(());
        };
        let gens = Rc::new(RefCell::new(plan.generators(0)));
        let ops = Rc::new(plan.ops.clone());
        let want: Vec<Vec<u64>> = simulate(records, ops.clone(), ops.len(), gens)
            .map(Elem::into_records)
            .collect();
        let mut walk = plan.walk(0);
        let got: Vec<Vec<u64>> = std::iter::from_fn(|| walk.next_elem().map(Elem::into_records)).collect();
        prop_assert_eq!(u64::try_from(got.len()).ok(), plan.len());
        prop_assert_eq!(got, want);
    }
}
