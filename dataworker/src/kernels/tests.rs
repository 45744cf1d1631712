//! Golden tests: every case of `fixtures/golden/kernels/<op>.json`, written by TensorFlow
//! 2.18.1 through `fixtures/gen/golden_kernels.py`, run through the kernel and compared
//! exactly (floats by their bits).

use serde_json::Value;

use super::strings::{self, AsStringAttrs};
use super::Result;
use crate::tensor::{DType, Tensor, TensorData};

fn load(op: &str) -> Vec<Value> {
    let path = format!(
        "{}/../fixtures/golden/kernels/{op}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).expect("golden file is committed");
    let v: Value = serde_json::from_str(&text).expect("golden file is JSON");
    v["cases"].as_array().expect("cases").clone()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn dtype(name: &str) -> DType {
    DType::ALL
        .into_iter()
        .find(|d| d.name() == name)
        .expect("known dtype")
}

fn tensor(v: &Value) -> Tensor {
    let shape = v["shape"]
        .as_array()
        .expect("shape")
        .iter()
        .map(|d| usize::try_from(d.as_u64().expect("dim")).expect("dim"))
        .collect();
    let vals = v["values"].as_array().expect("values");
    let ints = || vals.iter().map(|x| x.as_i64().expect("int"));
    let data = match dtype(v["dtype"].as_str().expect("dtype")) {
        DType::String => TensorData::String(
            vals.iter()
                .map(|x| unhex(x.as_str().expect("hex")))
                .collect(),
        ),
        DType::Float32 => TensorData::Float32(
            vals.iter()
                .map(|x| {
                    f32::from_bits(u32::from_str_radix(x.as_str().expect("hex"), 16).expect("bits"))
                })
                .collect(),
        ),
        DType::Float64 => TensorData::Float64(
            vals.iter()
                .map(|x| {
                    f64::from_bits(u64::from_str_radix(x.as_str().expect("hex"), 16).expect("bits"))
                })
                .collect(),
        ),
        DType::Bool => TensorData::Bool(vals.iter().map(|x| x.as_bool().expect("bool")).collect()),
        DType::Int8 => TensorData::Int8(ints().map(|x| i8::try_from(x).expect("i8")).collect()),
        DType::Int16 => TensorData::Int16(ints().map(|x| i16::try_from(x).expect("i16")).collect()),
        DType::Int32 => TensorData::Int32(ints().map(|x| i32::try_from(x).expect("i32")).collect()),
        DType::Int64 => TensorData::Int64(ints().collect()),
        DType::UInt8 => TensorData::UInt8(ints().map(|x| u8::try_from(x).expect("u8")).collect()),
        DType::UInt16 => {
            TensorData::UInt16(ints().map(|x| u16::try_from(x).expect("u16")).collect())
        }
        DType::UInt32 => {
            TensorData::UInt32(ints().map(|x| u32::try_from(x).expect("u32")).collect())
        }
        DType::UInt64 => {
            TensorData::UInt64(vals.iter().map(|x| x.as_u64().expect("u64")).collect())
        }
        other => panic!("no golden dtype {other}"),
    };
    Tensor::new(shape, data).expect("golden tensor")
}

/// The first element where two tensors differ, for the failure message.
fn first_difference(got: &Tensor, want: &Tensor) -> String {
    if got.shape() != want.shape() || got.dtype() != want.dtype() {
        return format!(
            "got {} {:?}, want {} {:?}",
            got.dtype(),
            got.shape(),
            want.dtype(),
            want.shape()
        );
    }
    let n = got.num_elements();
    for i in 0..n {
        let g = Tensor::new(vec![1], slice(got.data(), i)).expect("one");
        let w = Tensor::new(vec![1], slice(want.data(), i)).expect("one");
        if !g.bitwise_eq(&w) {
            return format!("element {i}: got {:?}, want {:?}", g.data(), w.data());
        }
    }
    "equal".into()
}

fn slice(d: &TensorData, i: usize) -> TensorData {
    match d {
        TensorData::String(v) => TensorData::String(vec![v[i].clone()]),
        TensorData::Float32(v) => TensorData::Float32(vec![v[i]]),
        TensorData::Float64(v) => TensorData::Float64(vec![v[i]]),
        TensorData::Int32(v) => TensorData::Int32(vec![v[i]]),
        TensorData::Int64(v) => TensorData::Int64(vec![v[i]]),
        TensorData::Bool(v) => TensorData::Bool(vec![v[i]]),
        other => other.clone(),
    }
}

/// Runs every case of `op`'s golden file through `run` and checks outputs or errors.
fn check(op: &str, run: impl Fn(&[Tensor], &Value, &Value) -> Result<Vec<Tensor>>) -> usize {
    let cases = load(op);
    for case in &cases {
        let name = case["name"].as_str().expect("name");
        let inputs: Vec<Tensor> = case["inputs"]
            .as_array()
            .expect("inputs")
            .iter()
            .flat_map(|i| match i.as_array() {
                Some(list) => list.iter().map(tensor).collect::<Vec<_>>(),
                None => vec![tensor(i)],
            })
            .collect();
        let got = run(&inputs, &case["attrs"], case);
        if !case["divergence"].is_null() {
            // TensorFlow's answer depends on the tensor's length here (see the generator);
            // Lode gives its vectorized answer, checked by the longer cases.
            assert!(got.is_ok(), "{op}/{name}: {:?}", got.err());
            continue;
        }
        match (&case["error"], got) {
            (Value::Null, Ok(outs)) => {
                let want: Vec<Tensor> = case["outputs"]
                    .as_array()
                    .expect("outputs")
                    .iter()
                    .map(tensor)
                    .collect();
                assert_eq!(outs.len(), want.len(), "{op}/{name}: output count");
                for (k, (g, w)) in outs.iter().zip(&want).enumerate() {
                    assert!(
                        g.bitwise_eq(w),
                        "{op}/{name} output {k}: {}",
                        first_difference(g, w)
                    );
                }
            }
            (Value::Null, Err(e)) => panic!("{op}/{name}: TensorFlow succeeds, Lode fails: {e}"),
            (err, Ok(_)) => panic!("{op}/{name}: TensorFlow fails ({err}), Lode succeeds"),
            (_, Err(_)) => {}
        }
    }
    cases.len()
}

fn attr_i64(a: &Value, k: &str, default: i64) -> i64 {
    a[k].as_i64().unwrap_or(default)
}

#[test]
fn string_to_hash_bucket_fast() {
    check("StringToHashBucketFast", |i, a, _| {
        strings::string_to_hash_bucket_fast(&i[0], attr_i64(a, "num_buckets", 0))
    });
}

#[test]
fn string_to_hash_bucket_strong() {
    check("StringToHashBucketStrong", |i, a, _| {
        let key: Vec<i64> = a["key"]
            .as_array()
            .expect("key")
            .iter()
            .map(|k| k.as_i64().expect("i64"))
            .collect();
        strings::string_to_hash_bucket_strong(&i[0], attr_i64(a, "num_buckets", 0), &key)
    });
}

#[test]
fn string_lower_and_upper() {
    check("StringLower", |i, a, _| {
        strings::string_lower(&i[0], a["encoding"].as_str().expect("enc"))
    });
    check("StringUpper", |i, a, _| {
        strings::string_upper(&i[0], a["encoding"].as_str().expect("enc"))
    });
}

#[test]
fn string_join() {
    check("StringJoin", |i, a, _| {
        let refs: Vec<&Tensor> = i.iter().collect();
        strings::string_join(&refs, a["separator"].as_str().expect("sep").as_bytes())
    });
}

#[test]
fn substr() {
    check("Substr", |i, _, _| {
        strings::substr(&i[0], &i[1], &i[2], "BYTE")
    });
}

#[test]
fn string_to_number() {
    check("StringToNumber", |i, a, _| {
        strings::string_to_number(&i[0], dtype(a["out_type"].as_str().expect("type")))
    });
}

#[test]
fn as_string() {
    check("AsString", |i, a, _| {
        let attrs = AsStringAttrs {
            precision: attr_i64(a, "precision", -1),
            scientific: a["scientific"].as_bool().unwrap_or(false),
            shortest: a["shortest"].as_bool().unwrap_or(false),
            width: attr_i64(a, "width", -1),
            fill: a["fill"].as_str().unwrap_or("").to_string(),
        };
        strings::as_string(&i[0], &attrs)
    });
}

#[test]
fn string_split_v2() {
    check("StringSplitV2", |i, a, _| {
        strings::string_split_v2(&i[0], &i[1], attr_i64(a, "maxsplit", -1))
    });
}

/// lookup.json: each case is a program over one table; a step that TensorFlow refused must
/// fail here too, and ends the program.
#[test]
fn lookup_programs() {
    use super::lookup::{self, HashTable};
    let cases = load("lookup");
    let dir = tempfile::tempdir().expect("tempdir");
    for case in &cases {
        let name = case["name"].as_str().expect("name");
        let mut table = HashTable::new(
            dtype(case["key_dtype"].as_str().expect("kd")),
            dtype(case["value_dtype"].as_str().expect("vd")),
        )
        .expect("table");
        for (s, step) in case["steps"].as_array().expect("steps").iter().enumerate() {
            let inputs: Vec<Tensor> = step["inputs"]
                .as_array()
                .map(|a| a.iter().map(tensor).collect())
                .unwrap_or_default();
            let got = match step["kind"].as_str().expect("kind") {
                "import" => lookup::lookup_table_import_v2(&mut table, &inputs[0], &inputs[1]),
                "find" => lookup::lookup_table_find_v2(&table, &inputs[0], &inputs[1]),
                "size" => lookup::lookup_table_size_v2(&table),
                "init_text" => {
                    let path = dir.path().join(format!("{name}_{s}.txt"));
                    if let Some(hex) = step["content"].as_str() {
                        std::fs::write(&path, unhex(hex)).expect("write vocab");
                    }
                    let a = &step["attrs"];
                    let filename = Tensor::scalar(TensorData::String(vec![path
                        .to_string_lossy()
                        .as_bytes()
                        .to_vec()]))
                    .expect("name");
                    let got = lookup::initialize_table_from_text_file_v2(
                        &mut table,
                        &filename,
                        attr_i64(a, "key_index", 0),
                        attr_i64(a, "value_index", 0),
                        attr_i64(a, "vocab_size", -1),
                        a["delimiter"].as_str().expect("delim"),
                    );
                    if step["content"].is_null() {
                        let msg = got.as_ref().expect_err("missing file").to_string();
                        assert!(
                            msg.contains(&*path.to_string_lossy()),
                            "{name}: {msg} names the file"
                        );
                    }
                    got
                }
                other => panic!("unknown step {other}"),
            };
            match (&step["error"], got) {
                (Value::Null, Ok(outs)) => {
                    let want: Vec<Tensor> = step["outputs"]
                        .as_array()
                        .map(|a| a.iter().map(tensor).collect())
                        .unwrap_or_default();
                    assert_eq!(outs.len(), want.len(), "lookup/{name} step {s}");
                    for (g, w) in outs.iter().zip(&want) {
                        assert!(
                            g.bitwise_eq(w),
                            "lookup/{name} step {s}: {}",
                            first_difference(g, w)
                        );
                    }
                }
                (Value::Null, Err(e)) => {
                    panic!("lookup/{name} step {s}: TensorFlow succeeds, Lode fails: {e}")
                }
                (err, Ok(_)) => {
                    panic!("lookup/{name} step {s}: TensorFlow fails ({err}), Lode succeeds")
                }
                (_, Err(_)) => {}
            }
        }
    }
}

fn attr_list(a: &Value, k: &str) -> Vec<i64> {
    a[k].as_array()
        .map(|l| l.iter().map(|x| x.as_i64().expect("i64")).collect())
        .unwrap_or_default()
}

#[test]
fn cast() {
    check("Cast", |i, a, _| {
        super::cast::cast(
            &i[0],
            dtype(a["DstT"].as_str().expect("DstT")),
            a["Truncate"].as_bool().unwrap_or(false),
        )
    });
}

#[test]
fn array_ops() {
    use super::array;
    let mut n = 0;
    n += check("Identity", |i, _, _| array::identity(&i[0]));
    n += check("Reshape", |i, _, _| array::reshape(&i[0], &i[1]));
    n += check("ExpandDims", |i, _, _| array::expand_dims(&i[0], &i[1]));
    n += check("Squeeze", |i, a, _| {
        array::squeeze(&i[0], &attr_list(a, "axis"))
    });
    // ConcatV2's inputs are the list of values, then the axis.
    n += check("ConcatV2", |i, _, _| {
        let (axis, values) = i.split_last().expect("axis");
        array::concat_v2(&values.iter().collect::<Vec<_>>(), axis)
    });
    n += check("Pack", |i, a, _| {
        array::pack(&i.iter().collect::<Vec<_>>(), attr_i64(a, "axis", 0))
    });
    n += check("Unpack", |i, a, _| {
        array::unpack(&i[0], attr_i64(a, "num", 0), attr_i64(a, "axis", 0))
    });
    n += check("Fill", |i, _, _| array::fill(&i[0], &i[1]));
    n += check("Range", |i, _, _| array::range(&i[0], &i[1], &i[2]));
    n += check("Shape", |i, a, _| {
        array::shape(&i[0], dtype(a["out_type"].as_str().expect("type")))
    });
    n += check("Size", |i, a, _| {
        array::size(&i[0], dtype(a["out_type"].as_str().expect("type")))
    });
    assert!(n > 60, "{n} array cases");
}

/// Kernels return errors, never panic, whatever the inputs and attributes.
mod robustness {
    use proptest::prelude::*;

    use super::super::{array, cast, strings};
    use crate::tensor::{DType, Tensor, TensorData};

    fn strings_tensor() -> impl Strategy<Value = Tensor> {
        prop::collection::vec(prop::collection::vec(any::<u8>(), 0..12), 0..6).prop_map(|v| {
            let n = v.len();
            Tensor::new(vec![n], TensorData::String(v)).expect("vector")
        })
    }

    fn ints(len: std::ops::Range<usize>) -> impl Strategy<Value = Tensor> {
        prop::collection::vec(-20i64..20, len).prop_map(|v| {
            let n = v.len();
            Tensor::new(vec![n], TensorData::Int64(v)).expect("vector")
        })
    }

    proptest! {
        #[test]
        fn string_kernels_never_panic(
            s in strings_tensor(),
            pos in ints(0..4),
            sep in prop::collection::vec(any::<u8>(), 0..3),
            maxsplit in -2i64..3,
            precision in -2i64..30,
            width in -2i64..40,
            fill in prop::sample::select(vec!["", " ", "+", "-", "0", "#", "x"]),
            flags in 0u8..4,
            x in prop::collection::vec(any::<f64>(), 0..5),
        ) {
            let _ = strings::substr(&s, &pos, &pos, "BYTE");
            let sep = Tensor::scalar(TensorData::String(vec![sep])).expect("scalar");
            let _ = strings::string_split_v2(&s, &sep, maxsplit);
            for dtype in [DType::Float32, DType::Float64, DType::Int32, DType::Int64] {
                let _ = strings::string_to_number(&s, dtype);
            }
            let n = x.len();
            let floats = Tensor::new(vec![n], TensorData::Float64(x)).expect("vector");
            let attrs = strings::AsStringAttrs {
                precision,
                scientific: flags & 1 == 1,
                shortest: flags & 2 == 2,
                width,
                fill: fill.to_string(),
            };
            let _ = strings::as_string(&floats, &attrs);
            for dst in DType::ALL {
                let _ = cast::cast(&floats, dst, flags & 1 == 1);
            }
            let _ = strings::string_join(&[&s, &sep], b",");
        }

        #[test]
        fn array_kernels_never_panic(shape in ints(0..4), axis in -4i64..4, a in -50i64..50, b in -50i64..50, c in -5i64..5) {
            let t = Tensor::new(vec![2, 3], TensorData::Int32(vec![1, 2, 3, 4, 5, 6])).expect("2x3");
            let _ = array::reshape(&t, &shape);
            let ax = Tensor::scalar(TensorData::Int64(vec![axis])).expect("scalar");
            let _ = array::expand_dims(&t, &ax);
            let _ = array::squeeze(&t, &[axis]);
            let _ = array::concat_v2(&[&t, &t], &ax);
            let _ = array::pack(&[&t, &t], axis);
            let _ = array::unpack(&t, a, axis);
            let _ = array::fill(&shape, &ax);
            let sc = |v| Tensor::scalar(TensorData::Int64(vec![v])).expect("scalar");
            let _ = array::range(&sc(a), &sc(b), &sc(c));
        }
    }
}
