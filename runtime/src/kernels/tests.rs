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
        DType::Float16 | DType::BFloat16 => {
            let bits = vals
                .iter()
                .map(|x| u16::from_str_radix(x.as_str().expect("hex"), 16).expect("bits"))
                .collect();
            if v["dtype"] == "half" {
                TensorData::Float16(bits)
            } else {
                TensorData::BFloat16(bits)
            }
        }
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
        TensorData::Int8(v) => TensorData::Int8(vec![v[i]]),
        TensorData::Int16(v) => TensorData::Int16(vec![v[i]]),
        TensorData::UInt8(v) => TensorData::UInt8(vec![v[i]]),
        TensorData::UInt16(v) => TensorData::UInt16(vec![v[i]]),
        TensorData::UInt32(v) => TensorData::UInt32(vec![v[i]]),
        TensorData::UInt64(v) => TensorData::UInt64(vec![v[i]]),
        TensorData::Float16(v) => TensorData::Float16(vec![v[i]]),
        TensorData::BFloat16(v) => TensorData::BFloat16(vec![v[i]]),
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

fn attr_dtype(a: &Value, k: &str) -> DType {
    dtype(a[k].as_str().expect("dtype attr"))
}

fn attr_bool(a: &Value, k: &str) -> bool {
    a[k].as_bool().expect("bool attr")
}

#[test]
fn sparse_ops() {
    use super::sparse;
    let mut n = 0;
    n += check("Unique", |i, a, _| {
        sparse::unique(&i[0], attr_dtype(a, "out_idx"))
    });
    n += check("UniqueWithCounts", |i, a, _| {
        sparse::unique_with_counts(&i[0], attr_dtype(a, "out_idx"))
    });
    n += check("Bucketize", |i, a, _| {
        let boundaries: Vec<f32> = a["boundaries"]
            .as_array()
            .expect("boundaries")
            .iter()
            .map(|b| match b.as_f64() {
                #[allow(clippy::cast_possible_truncation)]
                Some(x) => x as f32,
                // JSON has no infinities: the generator's are written as strings.
                None => b.as_str().expect("float").parse().expect("float"),
            })
            .collect();
        sparse::bucketize(&i[0], &boundaries)
    });
    n += check("SparseFillEmptyRows", |i, _, _| {
        sparse::sparse_fill_empty_rows(&i[0], &i[1], &i[2], &i[3])
    });
    n += check("SparseReshape", |i, _, _| {
        sparse::sparse_reshape(&i[0], &i[1], &i[2])
    });
    n += check("SparseToDense", |i, a, _| {
        sparse::sparse_to_dense(&i[0], &i[1], &i[2], &i[3], attr_bool(a, "validate_indices"))
    });
    n += check("DenseBincount", |i, a, _| {
        sparse::dense_bincount(&i[0], &i[1], &i[2], attr_bool(a, "binary_output"))
    });
    assert!(n > 100, "{n} sparse cases");
}

/// The parsing kernels return their own error type; the golden runner only needs to know that
/// they failed, and prints the message if TensorFlow did not.
fn parsing_result(r: super::parsing::Result<Vec<Tensor>>) -> Result<Vec<Tensor>> {
    r.map_err(|e| super::KernelError::InvalidAttr {
        op: "parsing",
        attr: "-",
        value: e.to_string(),
        reason: "see the value",
    })
}

fn parsing_dtypes(a: &Value, k: &str) -> Vec<DType> {
    a[k].as_array()
        .map(|l| {
            l.iter()
                .map(|x| dtype(x.as_str().expect("dtype")))
                .collect()
        })
        .unwrap_or_default()
}

fn parsing_shapes(a: &Value) -> Vec<Vec<i64>> {
    a["dense_shapes"]
        .as_array()
        .expect("dense_shapes")
        .iter()
        .map(|s| {
            s.as_array()
                .expect("shape")
                .iter()
                .map(|d| d.as_i64().expect("dim"))
                .collect()
        })
        .collect()
}

fn parsing_keys(a: &Value, k: &str) -> Vec<Vec<u8>> {
    a[k].as_array()
        .expect("keys")
        .iter()
        .map(|x| x.as_str().expect("key").as_bytes().to_vec())
        .collect()
}

#[test]
fn decode_csv() {
    use super::parsing::{self, DecodeCsvAttrs};
    let n = check("DecodeCSV", |i, a, _| {
        let attrs = DecodeCsvAttrs {
            field_delim: a["field_delim"]
                .as_str()
                .expect("delim")
                .as_bytes()
                .to_vec(),
            use_quote_delim: a["use_quote_delim"].as_bool().expect("quote"),
            na_value: a["na_value"].as_str().expect("na").as_bytes().to_vec(),
            select_cols: attr_list(a, "select_cols"),
        };
        let defaults: Vec<&Tensor> = i[1..].iter().collect();
        parsing_result(parsing::decode_csv(&i[0], &defaults, &attrs))
    });
    assert!(n > 100, "{n} DecodeCSV cases");
}

#[test]
fn parse_example() {
    use super::parsing::{self, ParseExampleAttrs, ParseSingleExampleAttrs};
    let n = check("ParseExampleV2", |i, a, _| {
        let attrs = ParseExampleAttrs {
            num_sparse: attr_i64(a, "num_sparse", 0),
            sparse_types: parsing_dtypes(a, "sparse_types"),
            ragged_value_types: parsing_dtypes(a, "ragged_value_types"),
            ragged_split_types: parsing_dtypes(a, "ragged_split_types"),
            dense_shapes: parsing_shapes(a),
        };
        let defaults: Vec<&Tensor> = i[5..].iter().collect();
        parsing_result(parsing::parse_example_v2(
            &i[0], &i[1], &i[2], &i[3], &i[4], &defaults, &attrs,
        ))
    });
    assert!(n > 150, "{n} ParseExampleV2 cases");
    let n = check("ParseSingleExample", |i, a, _| {
        let attrs = ParseSingleExampleAttrs {
            num_sparse: attr_i64(a, "num_sparse", 0),
            sparse_keys: parsing_keys(a, "sparse_keys"),
            dense_keys: parsing_keys(a, "dense_keys"),
            sparse_types: parsing_dtypes(a, "sparse_types"),
            dense_shapes: parsing_shapes(a),
        };
        let defaults: Vec<&Tensor> = i[1..].iter().collect();
        parsing_result(parsing::parse_single_example(&i[0], &defaults, &attrs))
    });
    assert!(n > 100, "{n} ParseSingleExample cases");
}

/// The parsing kernels return errors, never panic, on arbitrary records and Example bytes.
mod parsing_robustness {
    use proptest::prelude::*;

    use super::super::parsing::{self, DecodeCsvAttrs, ParseExampleAttrs};
    use crate::tensor::{DType, Tensor, TensorData};

    fn strings(v: Vec<Vec<u8>>) -> Tensor {
        let n = v.len();
        Tensor::new(vec![n], TensorData::String(v)).expect("vector")
    }

    /// A valid Example with int64 "i", float "f" and bytes "s" features.
    const EXAMPLE: &[u8] = b"\x0a\x2c\x0a\x0c\x0a\x01i\x12\x07\x1a\x05\x0a\x03\x01\x02\x03\
\x0a\x10\x0a\x01f\x12\x0b\x12\x09\x0a\x07\x00\x00\x80\x3f\x00\x00\x00\
\x0a\x0c\x0a\x01s\x12\x07\x0a\x05\x0a\x03abc";

    proptest! {
        #[test]
        fn decode_csv_never_panics(
            records in prop::collection::vec(
                prop::collection::vec(prop::sample::select(b"ab1.,\"\n\r -".to_vec()), 0..10), 0..4),
            quote in any::<bool>(),
            select in prop::collection::vec(-1i64..5, 0..4),
            na in prop::sample::select(vec!["", "a", "1"]),
        ) {
            let records = strings(records);
            let defaults = [
                Tensor::new(vec![1], TensorData::Int32(vec![0])).expect("d"),
                Tensor::new(vec![0], TensorData::Float64(vec![])).expect("d"),
                Tensor::new(vec![1], TensorData::String(vec![b"x".to_vec()])).expect("d"),
            ];
            let refs: Vec<&Tensor> = defaults.iter().collect();
            for k in 1..=refs.len() {
                let attrs = DecodeCsvAttrs {
                    field_delim: b",".to_vec(),
                    use_quote_delim: quote,
                    na_value: na.as_bytes().to_vec(),
                    select_cols: select.iter().copied().take(k).collect(),
                };
                let _ = parsing::decode_csv(&records, &refs[..k], &attrs);
            }
        }

        #[test]
        fn parse_example_never_panics(
            garbage in prop::collection::vec(any::<u8>(), 0..40),
            flips in prop::collection::vec((0..EXAMPLE.len(), any::<u8>()), 0..3),
            cut in 0..=EXAMPLE.len(),
            shape in prop::sample::select(vec![vec![], vec![1], vec![3], vec![-1], vec![-1, 2], vec![-2]]),
        ) {
            let mut mutated = EXAMPLE.to_vec();
            for (i, b) in flips {
                mutated[i] = b;
            }
            let serialized = strings(vec![garbage, mutated, EXAMPLE[..cut].to_vec(), EXAMPLE.to_vec()]);
            let keys = |k: &[&[u8]]| strings(k.iter().map(|x| x.to_vec()).collect());
            let no_names = strings(vec![]);
            let n: i64 = shape.iter().product();
            let default = if shape.first() == Some(&-1) {
                Tensor::scalar(TensorData::Int64(vec![7])).expect("d")
            } else {
                let dims: Vec<usize> = shape.iter().map(|&d| usize::try_from(d).unwrap_or(0)).collect();
                Tensor::new(dims, TensorData::Int64(vec![5; usize::try_from(n).unwrap_or(0)])).expect("d")
            };
            let attrs = ParseExampleAttrs {
                num_sparse: 2,
                sparse_types: vec![DType::Float32, DType::String],
                ragged_value_types: vec![DType::Int64],
                ragged_split_types: vec![DType::Int32],
                dense_shapes: vec![shape],
            };
            let _ = parsing::parse_example_v2(
                &serialized, &no_names, &keys(&[b"f", b"s"]), &keys(&[b"i"]), &keys(&[b"i"]),
                &[&default], &attrs,
            );
            for one in [&EXAMPLE[..cut], EXAMPLE] {
                let scalar = Tensor::scalar(TensorData::String(vec![one.to_vec()])).expect("s");
                let _ = parsing::parse_example_v2(
                    &scalar, &no_names, &keys(&[b"f", b"s"]), &keys(&[b"i"]), &keys(&[b"i"]),
                    &[&default], &attrs,
                );
            }
        }
    }
}

#[test]
fn sparse_cross_ops() {
    use super::sparse::{self, SparseCrossAttrs};
    // The list inputs are flattened: n_sparse indices, values and shapes, then n_dense.
    fn split(i: &[Tensor], a: &Value) -> [Vec<Tensor>; 4] {
        let s = usize::try_from(attr_i64(a, "n_sparse", 0)).expect("n_sparse");
        [
            i[..s].to_vec(),
            i[s..2 * s].to_vec(),
            i[2 * s..3 * s].to_vec(),
            i[3 * s..].to_vec(),
        ]
    }
    fn refs(v: &[Tensor]) -> Vec<&Tensor> {
        v.iter().collect()
    }
    let mut n = check("SparseCross", |i, a, _| {
        let [ind, val, sh, dense] = split(i, a);
        let attrs = SparseCrossAttrs {
            hashed_output: attr_bool(a, "hashed_output"),
            num_buckets: attr_i64(a, "num_buckets", 0),
            hash_key: attr_i64(a, "hash_key", 0),
        };
        sparse::sparse_cross(&refs(&ind), &refs(&val), &refs(&sh), &refs(&dense), attrs)
    });
    n += check("SparseCrossHashed", |i, a, _| {
        let [ind, val, sh, dense] = split(i, a);
        let scalar = |d| Tensor::scalar(d).expect("scalar");
        let salt = attr_list(a, "salt");
        let salt = Tensor::new(vec![salt.len()], TensorData::Int64(salt)).expect("salt");
        sparse::sparse_cross_hashed(
            &refs(&ind),
            &refs(&val),
            &refs(&sh),
            &refs(&dense),
            &scalar(TensorData::Int64(vec![attr_i64(a, "num_buckets", 0)])),
            &scalar(TensorData::Bool(vec![attr_bool(a, "strong_hash")])),
            &salt,
        )
    });
    assert!(n > 30, "{n} cross cases");
}

/// DeserializeSparse.json: the inputs are the (indices, values, shape) of each element.
#[test]
fn deserialize_sparse() {
    use super::parsing::{self, SparseParts};
    let n = check("DeserializeSparse", |i, a, _| {
        let batch_shape: Vec<usize> = attr_list(a, "batch_shape")
            .into_iter()
            .map(|d| usize::try_from(d).expect("dim"))
            .collect();
        let parts: Vec<SparseParts<'_>> = i
            .chunks_exact(3)
            .map(|c| SparseParts {
                indices: &c[0],
                values: &c[1],
                shape: &c[2],
            })
            .collect();
        parsing_result(parsing::deserialize_sparse(
            &batch_shape,
            &parts,
            dtype(a["dtype"].as_str().expect("dtype")),
        ))
    });
    assert!(n > 25, "{n} DeserializeSparse cases");
}

/// DeserializeSparse returns errors, never panics, on inconsistent parts.
mod deserialize_sparse_robustness {
    use proptest::prelude::*;

    use super::super::parsing::{deserialize_sparse, SparseParts};
    use crate::tensor::{DType, Tensor, TensorData};

    fn part() -> impl Strategy<Value = (Tensor, Tensor, Tensor)> {
        (0usize..3, 0usize..3, 0usize..3, any::<bool>()).prop_map(|(rows, cols, rank, float)| {
            let indices = Tensor::new(vec![rows, cols], TensorData::Int64(vec![9; rows * cols]))
                .expect("indices");
            let values = if float {
                Tensor::new(vec![rows], TensorData::Float32(vec![1.0; rows])).expect("values")
            } else {
                Tensor::new(vec![rows], TensorData::Int64(vec![1; rows])).expect("values")
            };
            let shape = Tensor::new(vec![rank], TensorData::Int64(vec![2; rank])).expect("shape");
            (indices, values, shape)
        })
    }

    proptest! {
        #[test]
        fn never_panics(parts in prop::collection::vec(part(), 0..4), two_d in any::<bool>()) {
            let refs: Vec<SparseParts<'_>> = parts
                .iter()
                .map(|(indices, values, shape)| SparseParts { indices, values, shape })
                .collect();
            let n = refs.len();
            let _ = deserialize_sparse(&[n], &refs, DType::Float32);
            let _ = deserialize_sparse(&[], &refs, DType::Int64);
            if two_d {
                let _ = deserialize_sparse(&[1, n], &refs, DType::Float32);
                let _ = deserialize_sparse(&[2, 2], &refs, DType::Float32);
            }
        }
    }
}

#[test]
fn math_ops() {
    use super::math::segment::{self, SegmentOp};
    use super::math::{self, BinaryOp, Comparison};
    let mut n = 0;
    for (name, op) in [
        ("Add", BinaryOp::Add),
        ("AddV2", BinaryOp::AddV2),
        ("Sub", BinaryOp::Sub),
        ("Mul", BinaryOp::Mul),
        ("RealDiv", BinaryOp::RealDiv),
        ("FloorMod", BinaryOp::FloorMod),
        ("Maximum", BinaryOp::Maximum),
        ("Minimum", BinaryOp::Minimum),
    ] {
        n += check(name, |i, _, _| math::binary(op, &i[0], &i[1]));
    }
    for (name, op) in [
        ("Equal", Comparison::Equal),
        ("NotEqual", Comparison::NotEqual),
        ("Less", Comparison::Less),
        ("LessEqual", Comparison::LessEqual),
        ("Greater", Comparison::Greater),
        ("GreaterEqual", Comparison::GreaterEqual),
    ] {
        n += check(name, |i, _, _| math::compare(op, &i[0], &i[1]));
    }
    n += check("LogicalAnd", |i, _, _| math::logical_and(&i[0], &i[1]));
    n += check("LogicalOr", |i, _, _| math::logical_or(&i[0], &i[1]));
    n += check("LogicalNot", |i, _, _| math::logical_not(&i[0]));
    n += check("Select", |i, _, _| math::select(&i[0], &i[1], &i[2]));
    n += check("SelectV2", |i, _, _| math::select_v2(&i[0], &i[1], &i[2]));
    n += check("Where", |i, _, _| math::where_(&i[0]));
    n += float_reductions();
    for (name, op) in [
        ("Max", math::Reduction::Max),
        ("Min", math::Reduction::Min),
        ("All", math::Reduction::All),
        ("Any", math::Reduction::Any),
    ] {
        n += check(name, |i, a, _| {
            math::reduce(op, &i[0], &i[1], attr_bool(a, "keep_dims"))
        });
    }
    for (name, op) in [
        ("SegmentSum", SegmentOp::Sum),
        ("SegmentProd", SegmentOp::Prod),
        ("SegmentMax", SegmentOp::Max),
        ("SegmentMin", SegmentOp::Min),
        ("SegmentMean", SegmentOp::Mean),
    ] {
        n += check(name, |i, _, _| segment::segment(op, &i[0], &i[1]));
    }
    for (name, op) in [
        ("UnsortedSegmentSum", SegmentOp::Sum),
        ("UnsortedSegmentProd", SegmentOp::Prod),
        ("UnsortedSegmentMax", SegmentOp::Max),
        ("UnsortedSegmentMin", SegmentOp::Min),
    ] {
        n += check(name, |i, _, _| {
            segment::unsorted_segment(op, &i[0], &i[1], &i[2])
        });
    }
    n += check("Log1p", |i, _, _| math::log1p(&i[0]));
    n += check("Cumprod", |i, a, _| {
        math::cumprod(
            &i[0],
            &i[1],
            attr_bool(a, "exclusive"),
            attr_bool(a, "reverse"),
        )
    });
    n += check("Cumsum", |i, a, _| {
        math::cumsum(
            &i[0],
            &i[1],
            attr_bool(a, "exclusive"),
            attr_bool(a, "reverse"),
        )
    });
    assert!(n > 200, "{n} math cases");
}

/// Sum, Prod and Mean: every case must match TensorFlow exactly except the float
/// reductions listed here, whose order inside Eigen's vectorized reducer is not reproduced
/// yet (see math.rs); those must still succeed, and the list must stay exact.
fn float_reductions() -> usize {
    use super::math::{self, Reduction};
    // Last-bit differences (1-2 ulps), except the 9000-element cancelling sums (4 ulps
    // since Eigen's tree split of runs over 1024 packets is reproduced; 32 before): the
    // order inside the leaves is not identified yet.
    const INEXACT: &[&str] = &[
        "Sum/full_9000",
        "Sum/alternating_13",
        "Prod/full_123",
        "Mean/full_9000",
        "Mean/alternating_13",
    ];
    let mut n = 0;
    let mut inexact = Vec::new();
    for (name, op) in [
        ("Sum", Reduction::Sum),
        ("Prod", Reduction::Prod),
        ("Mean", Reduction::Mean),
    ] {
        for case in load(name) {
            let inputs: Vec<Tensor> = case["inputs"]
                .as_array()
                .expect("inputs")
                .iter()
                .map(tensor)
                .collect();
            let case_name = case["name"].as_str().expect("name");
            let got = math::reduce(
                op,
                &inputs[0],
                &inputs[1],
                attr_bool(&case["attrs"], "keep_dims"),
            );
            n += 1;
            match (&case["error"], got) {
                (Value::Null, Ok(outs)) => {
                    let want = tensor(&case["outputs"][0]);
                    if !outs[0].bitwise_eq(&want) {
                        inexact.push(format!(
                            "{name}/{case_name}: {}",
                            first_difference(&outs[0], &want)
                        ));
                    }
                }
                (Value::Null, Err(e)) => {
                    panic!("{name}/{case_name}: TensorFlow succeeds, Lode fails: {e}")
                }
                (err, Ok(_)) => {
                    panic!("{name}/{case_name}: TensorFlow fails ({err}), Lode succeeds")
                }
                (_, Err(_)) => {}
            }
        }
    }
    let names: Vec<&str> = inexact
        .iter()
        .map(|s| s.split(':').next().unwrap_or(""))
        .collect();
    assert_eq!(names, INEXACT, "{inexact:#?}");
    n
}

/// The sparse and math kernels return errors, never panic, whatever the inputs.
mod robustness_sparse_math {
    use proptest::prelude::*;

    use super::super::math::segment::{self, SegmentOp};
    use super::super::math::{self, BinaryOp, Comparison, Reduction};
    use super::super::sparse::{self, SparseCrossAttrs};
    use crate::tensor::{DType, Tensor, TensorData};

    fn i64s(shape: Vec<usize>, v: Vec<i64>) -> Tensor {
        let n: usize = shape.iter().product();
        let mut v = v;
        v.resize(n, 0);
        Tensor::new(shape, TensorData::Int64(v)).expect("sized")
    }

    fn shape() -> impl Strategy<Value = Vec<usize>> {
        prop::collection::vec(0usize..4, 0..4)
    }

    proptest! {
        #[test]
        fn sparse_kernels_never_panic(
            s1 in shape(), s2 in shape(), s3 in shape(),
            v in prop::collection::vec(-6i64..8, 0..40),
            flag in any::<bool>(),
            bounds in prop::collection::vec(-3.0f32..3.0, 0..4),
        ) {
            let a = i64s(s1.clone(), v.clone());
            let b = i64s(s2.clone(), v.iter().rev().copied().collect());
            let c = i64s(s3, v.clone());
            let f = Tensor::new(s1.clone(), TensorData::Float32(
                v.iter().map(|&x| x as f32 / 2.0).chain(std::iter::repeat(0.0)).take(s1.iter().product()).collect(),
            )).expect("sized");
            let _ = sparse::unique(&a, DType::Int32);
            let _ = sparse::unique_with_counts(&f, DType::Int64);
            let _ = sparse::bucketize(&f, &bounds);
            let _ = sparse::sparse_fill_empty_rows(&a, &b, &c, &i64s(vec![], vec![1]));
            let _ = sparse::sparse_reshape(&a, &b, &c);
            let _ = sparse::sparse_to_dense(&a, &b, &c, &i64s(vec![], vec![0]), flag);
            let _ = sparse::sparse_to_dense(&a, &b, &i64s(vec![], vec![3]), &i64s(vec![], vec![0]), flag);
            let _ = sparse::dense_bincount(&a, &i64s(vec![], vec![v.first().copied().unwrap_or(3)]), &f, flag);
            let strings = Tensor::new(vec![b.num_elements()], TensorData::String(vec![b"x".to_vec(); b.num_elements()])).expect("vector");
            let attrs = SparseCrossAttrs { hashed_output: flag, num_buckets: v.len() as i64 - 5, hash_key: 7 };
            let _ = sparse::sparse_cross(&[&a], &[&strings], &[&c], &[&b], attrs);
            let _ = sparse::sparse_cross(&[&a, &b], &[&b, &a], &[&c, &c], &[], attrs);
            let _ = sparse::sparse_cross_hashed(&[&a], &[&strings], &[&c], &[&b], &i64s(vec![], vec![5]),
                &Tensor::scalar(TensorData::Bool(vec![flag])).expect("scalar"), &b);
        }

        #[test]
        fn math_kernels_never_panic(
            s1 in shape(), s2 in shape(),
            v in prop::collection::vec(-6i64..8, 0..40),
            axes in prop::collection::vec(-5i64..5, 0..3),
            flag in any::<bool>(),
        ) {
            let a = i64s(s1.clone(), v.clone());
            let b = i64s(s2.clone(), v.iter().rev().copied().collect());
            let fa = Tensor::new(s1.clone(), TensorData::Float64(
                v.iter().map(|&x| x as f64 / 3.0).chain(std::iter::repeat(0.0)).take(s1.iter().product()).collect(),
            )).expect("sized");
            let ba = Tensor::new(s2.clone(), TensorData::Bool(
                v.iter().map(|&x| x > 0).chain(std::iter::repeat(false)).take(s2.iter().product()).collect(),
            )).expect("sized");
            for op in [BinaryOp::Add, BinaryOp::AddV2, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::RealDiv,
                       BinaryOp::FloorMod, BinaryOp::Maximum, BinaryOp::Minimum] {
                let _ = math::binary(op, &a, &b);
                let _ = math::binary(op, &fa, &fa);
            }
            for op in [Comparison::Equal, Comparison::Less] {
                let _ = math::compare(op, &a, &b);
            }
            let _ = math::logical_and(&ba, &ba);
            let _ = math::logical_not(&ba);
            let _ = math::select(&ba, &a, &b);
            let _ = math::select_v2(&ba, &a, &b);
            let _ = math::where_(&a);
            let ax = i64s(vec![axes.len()], axes.clone());
            for op in [Reduction::Sum, Reduction::Prod, Reduction::Mean, Reduction::Max,
                       Reduction::Min, Reduction::All, Reduction::Any] {
                let _ = math::reduce(op, &a, &ax, flag);
                let _ = math::reduce(op, &fa, &ax, flag);
                let _ = math::reduce(op, &ba, &ax, flag);
            }
            for op in [SegmentOp::Sum, SegmentOp::Prod, SegmentOp::Max, SegmentOp::Min, SegmentOp::Mean] {
                let _ = segment::segment(op, &fa, &b);
                let _ = segment::segment(op, &a, &i64s(vec![s1.first().copied().unwrap_or(0)], v.clone()));
                let _ = segment::unsorted_segment(op, &fa, &b, &i64s(vec![], vec![axes.first().copied().unwrap_or(3)]));
                let _ = segment::unsorted_segment(op, &a, &a, &i64s(vec![], vec![v.len() as i64]));
            }
            let _ = math::cumsum(&fa, &i64s(vec![], vec![axes.first().copied().unwrap_or(0)]), flag, !flag);
            let _ = math::cumprod(&a, &i64s(vec![], vec![axes.first().copied().unwrap_or(0)]), !flag, flag);
            let _ = math::log1p(&fa);
        }
    }
}

#[test]
fn slicing_ops() {
    use super::slicing::{self, StridedSliceMasks};
    let mut n = check("Slice", |i, _, _| slicing::slice(&i[0], &i[1], &i[2]));
    assert!(n > 100, "{n} Slice cases");
    let strided = check("StridedSlice", |i, a, _| {
        let masks = StridedSliceMasks {
            begin_mask: attr_i64(a, "begin_mask", 0),
            end_mask: attr_i64(a, "end_mask", 0),
            ellipsis_mask: attr_i64(a, "ellipsis_mask", 0),
            new_axis_mask: attr_i64(a, "new_axis_mask", 0),
            shrink_axis_mask: attr_i64(a, "shrink_axis_mask", 0),
        };
        slicing::strided_slice(&i[0], &i[1], &i[2], &i[3], &masks)
    });
    assert!(strided > 300, "{strided} StridedSlice cases");
    n += strided;
    n += check("GatherV2", |i, a, _| {
        slicing::gather_v2(&i[0], &i[1], &i[2], attr_i64(a, "batch_dims", 0))
    });
    n += check("Tile", |i, _, _| slicing::tile(&i[0], &i[1]));
    n += check("Transpose", |i, _, _| slicing::transpose(&i[0], &i[1]));
    n += check("OneHot", |i, a, _| {
        slicing::one_hot(&i[0], &i[1], &i[2], &i[3], attr_i64(a, "axis", -1))
    });
    n += check("IdentityN", |i, _, _| {
        slicing::identity_n(&i.iter().collect::<Vec<_>>())
    });
    assert!(n > 700, "{n} slicing cases");
}

#[test]
fn neg() {
    let n = check("Neg", |i, _, _| super::math::neg(&i[0]));
    assert!(n > 20, "{n} Neg cases");
}

#[test]
fn regex_replace() {
    let n = check("RegexReplace", |i, a, _| {
        strings::regex_replace(&i[0], &i[1], &i[2], attr_bool(a, "replace_global"))
    });
    assert!(n > 200, "{n} RegexReplace cases");
    let attr_bytes = |a: &Value, k: &str| a[k].as_str().expect("string attr").as_bytes().to_vec();
    let n = check("StaticRegexReplace", |i, a, _| {
        strings::static_regex_replace(
            "StaticRegexReplace",
            &i[0],
            &attr_bytes(a, "pattern"),
            &attr_bytes(a, "rewrite"),
            attr_bool(a, "replace_global"),
        )
    });
    let n = n + check("StaticRegexFullMatch", |i, a, _| {
        strings::regex_full_match("StaticRegexFullMatch", &i[0], &attr_bytes(a, "pattern"))
    });
    let n = n + check("RegexFullMatch", |i, _, _| {
        let pattern = strings::scalar_string("RegexFullMatch", "pattern", &i[1])?;
        strings::regex_full_match("RegexFullMatch", &i[0], pattern)
    });
    assert!(n > 150, "{n} full-match and static cases");
}

#[test]
fn string_length_and_strip() {
    use super::strings;
    let n = check("StringLength", |i, a, _| {
        strings::string_length(&i[0], a["unit"].as_str().expect("unit"))
    });
    let n = n + check("StringStrip", |i, _, _| strings::string_strip(&i[0]));
    assert_eq!(n, 9, "StringLength and StringStrip cases");
}

/// The slicing kernels, `Neg` and `RegexReplace` return errors, never panic, whatever the
/// inputs and attributes.
mod slicing_robustness {
    use proptest::prelude::*;

    use super::super::slicing::{self, StridedSliceMasks};
    use super::super::{math, strings};
    use crate::tensor::{Tensor, TensorData};

    fn shape() -> impl Strategy<Value = Vec<usize>> {
        prop::collection::vec(0usize..4, 0..5)
    }

    fn input(shape: &[usize], strings: bool) -> Tensor {
        let n: usize = shape.iter().product();
        let data = if strings {
            TensorData::String((0..n).map(|i| vec![b'a'; i % 3]).collect())
        } else {
            TensorData::Int32((0..n).map(|i| i32::try_from(i).unwrap_or(0)).collect())
        };
        Tensor::new(shape.to_vec(), data).expect("sized")
    }

    fn vector(v: &[i64], int32: bool) -> Tensor {
        let data = if int32 {
            TensorData::Int32(v.iter().map(|&x| i32::try_from(x).unwrap_or(0)).collect())
        } else {
            TensorData::Int64(v.to_vec())
        };
        Tensor::new(vec![v.len()], data).expect("vector")
    }

    fn index() -> impl Strategy<Value = i64> {
        prop_oneof![8 => -6i64..7, 1 => Just(i64::MIN), 1 => Just(i64::MAX)]
    }

    fn mask() -> impl Strategy<Value = i64> {
        prop_oneof![8 => 0i64..64, 1 => Just(-1i64), 1 => Just(1i64 << 40)]
    }

    proptest! {
        #[test]
        fn slicing_kernels_never_panic(
            s in shape(),
            strs in any::<bool>(),
            int32 in any::<bool>(),
            b in prop::collection::vec(index(), 0..6),
            e in prop::collection::vec(index(), 0..6),
            st in prop::collection::vec(index(), 0..6),
            masks in prop::collection::vec(mask(), 5),
            axis in -6i64..6,
            batch_dims in -3i64..3,
        ) {
            let x = input(&s, strs);
            let n = b.len().min(e.len()).min(st.len());
            let (bv, ev, sv) = (vector(&b[..n], int32), vector(&e[..n], int32), vector(&st[..n], int32));
            let masks = StridedSliceMasks {
                begin_mask: masks[0],
                end_mask: masks[1],
                ellipsis_mask: masks[2],
                new_axis_mask: masks[3],
                shrink_axis_mask: masks[4],
            };
            let _ = slicing::strided_slice(&x, &bv, &ev, &sv, &masks);
            let _ = slicing::strided_slice(&x, &bv, &vector(&e, int32), &sv, &masks);
            let _ = slicing::slice(&x, &vector(&b, int32), &vector(&e, int32));
            let _ = slicing::slice(&x, &bv, &ev);
            let ax = Tensor::scalar(TensorData::Int64(vec![axis])).expect("scalar");
            let _ = slicing::gather_v2(&x, &vector(&b, int32), &ax, batch_dims);
            let _ = slicing::gather_v2(&x, &input(&s, false), &ax, batch_dims);
            let small: Vec<i64> = b.iter().map(|v| v.rem_euclid(4) - 1).collect();
            let _ = slicing::tile(&x, &vector(&small, int32));
            let _ = slicing::transpose(&x, &vector(&small, int32));
            let _ = slicing::transpose(&x, &vector(&b, int32));
            let depth = Tensor::scalar(TensorData::Int32(vec![i32::try_from(axis).unwrap_or(0) + 2])).expect("scalar");
            let on = Tensor::scalar(TensorData::String(vec![b"on".to_vec()])).expect("scalar");
            let off = Tensor::scalar(TensorData::String(vec![b"off".to_vec()])).expect("scalar");
            let _ = slicing::one_hot(&vector(&b, int32), &depth, &on, &off, batch_dims);
            let _ = slicing::one_hot(&input(&s, false), &depth, &on, &off, axis);
            let _ = slicing::identity_n(&[&x, &bv]);
            let _ = math::neg(&x);
            let _ = math::neg(&vector(&b, int32));
        }

        #[test]
        fn regex_replace_never_panics(
            pattern in prop::collection::vec(prop::sample::select(vec![
                "a", "b", "é", "(", ")", "[", "]", "{", "}", "*", "+", "?", "|", "^", "$", ".",
                "\\", "d", "w", "s", "b", "p", "P", "Q", "E", "x", "0", "1", "7", "9", ",", "-",
                ":", "<", ">", "=", "!", "i", "m", "U", "^", "{2}", "{1000}", "[:alpha:]", "\\p{L}",
            ]), 0..10),
            rewrite in prop::collection::vec(prop::sample::select(vec![
                b'\\', b'0', b'1', b'9', b'$', b'a', b'{', b'}',
            ]), 0..6),
            texts in prop::collection::vec(prop::collection::vec(
                prop::sample::select(vec![b'a', b'b', b' ', b'\n', 0xc3, 0xa9, 0xff, 0x80, 0xe6]), 0..10), 0..4),
            global in any::<bool>(),
        ) {
            let n = texts.len();
            let input = Tensor::new(vec![n], TensorData::String(texts)).expect("vector");
            let scalar = |b: Vec<u8>| Tensor::scalar(TensorData::String(vec![b])).expect("scalar");
            let _ = strings::regex_replace(&input, &scalar(pattern.concat().into_bytes()), &scalar(rewrite), global);
        }
    }
}

/// The kernels the construct graphs needed (issue 14, item 2): outputs against
/// `golden_kernels.py`'s `gen_feature_kernels`, and for the ops whose refusals a pipeline
/// meets on bad data (indices, segment ids, splits, sizes), TensorFlow's own message.
mod feature_kernels {
    use serde_json::Value;

    use super::super::indexing;
    use super::super::math::sparse_segment::{self, SparseSegmentOp};
    use super::super::math::{self, BinaryOp, UnaryOp};
    use super::super::ragged::{self, NGramAttrs};
    use super::super::unicode::{self, DecodeAttrs, Errors};
    use super::super::{cast, sparse, strings, Result};
    use super::{check, dtype, load, tensor};
    use crate::tensor::{DType, Tensor};

    type Run = dyn Fn(&[Tensor], &Value) -> Result<Vec<Tensor>>;

    /// Outputs as `check` compares them, then every refusal's message: Lode's ends with
    /// TensorFlow's (its `, node name: …` suffix aside, as Lode names the node itself).
    fn check_with_messages(op: &str, run: &Run) {
        let n = check(op, |i, a, _| run(i, a));
        assert!(n > 0, "{op}: no cases");
        for case in load(op) {
            let Some(msg) = case["error"]["message"].as_str() else {
                continue;
            };
            let inputs: Vec<Tensor> = case["inputs"]
                .as_array()
                .expect("inputs")
                .iter()
                .flat_map(|i| match i.as_array() {
                    Some(list) => list.iter().map(tensor).collect::<Vec<_>>(),
                    None => vec![tensor(i)],
                })
                .collect();
            let want = msg.split(", node name: ").next().expect("message");
            let got = run(&inputs, &case["attrs"]).expect_err("TensorFlow refuses");
            assert!(
                got.to_string().ends_with(want),
                "{op}/{}: Lode says {got:?}, TensorFlow {want:?}",
                case["name"]
            );
        }
    }

    #[test]
    fn sparse_segment_reductions() {
        for (name, op) in [
            ("SparseSegmentSum", SparseSegmentOp::Sum),
            ("SparseSegmentMean", SparseSegmentOp::Mean),
            ("SparseSegmentSqrtN", SparseSegmentOp::SqrtN),
        ] {
            check_with_messages(name, &move |i, _| {
                sparse_segment::sparse_segment(op, &i[0], &i[1], &i[2], None)
            });
            check_with_messages(&format!("{name}WithNumSegments"), &move |i, _| {
                sparse_segment::sparse_segment(op, &i[0], &i[1], &i[2], Some(&i[3]))
            });
        }
    }

    #[test]
    fn index_ops() {
        check_with_messages("GatherNd", &|i, _| indexing::gather_nd(&i[0], &i[1]));
        check_with_messages("ScatterNd", &|i, _| {
            indexing::scatter_nd(&i[0], &i[1], &i[2])
        });
        check_with_messages("BroadcastTo", &|i, _| indexing::broadcast_to(&i[0], &i[1]));
        check_with_messages("Bincount", &|i, _| sparse::bincount_op(&i[0], &i[1], &i[2]));
        check_with_messages("SparseReorder", &|i, _| {
            sparse::sparse_reorder(&i[0], &i[1], &i[2])
        });
        check_with_messages("SparseSlice", &|i, _| {
            sparse::sparse_slice(&i[0], &i[1], &i[2], &i[3], &i[4])
        });
        check_with_messages("SparseCountSparseOutput", &|i, a| {
            sparse::sparse_count_sparse_output(
                &i[0],
                &i[1],
                &i[2],
                &i[3],
                a["binary_output"].as_bool().expect("binary"),
                a["minlength"].as_i64().expect("min"),
                a["maxlength"].as_i64().expect("max"),
            )
        });
    }

    #[test]
    fn element_wise_math_and_half_casts() {
        check_with_messages("FloorDiv", &|i, _| {
            math::binary(BinaryOp::FloorDiv, &i[0], &i[1])
        });
        for (name, op) in [
            ("Ceil", UnaryOp::Ceil),
            ("Floor", UnaryOp::Floor),
            ("Sqrt", UnaryOp::Sqrt),
        ] {
            check_with_messages(name, &move |i, _| math::unary(op, &i[0]));
        }
        check_with_messages("Abs", &|i, _| math::abs(&i[0]));
        check_with_messages("CastHalf", &|i, a| {
            let dst = match a["DstT"].as_str().expect("DstT") {
                "float16" => DType::Float16,
                "float32" => DType::Float32,
                "float64" => DType::Float64,
                other => dtype(other),
            };
            cast::cast(&i[0], dst, false)
        });
    }

    #[test]
    fn strings_ngrams_and_unicode() {
        check_with_messages("StringNGrams", &|i, a| {
            let s = |k: &str| a[k].as_str().expect("str").as_bytes().to_vec();
            let attrs = NGramAttrs {
                separator: s("separator"),
                ngram_widths: a["ngram_widths"]
                    .as_array()
                    .expect("widths")
                    .iter()
                    .map(|w| w.as_i64().expect("width"))
                    .collect(),
                left_pad: s("left_pad"),
                right_pad: s("right_pad"),
                pad_width: a["pad_width"].as_i64().expect("pad"),
                preserve_short_sequences: a["preserve_short_sequences"].as_bool().expect("b"),
            };
            ragged::string_ngrams(&i[0], &i[1], &attrs)
        });
        check_with_messages("ReduceJoin", &|i, a| {
            strings::reduce_join(
                &i[0],
                &i[1],
                a["keep_dims"].as_bool().expect("keep"),
                a["separator"].as_str().expect("sep").as_bytes(),
            )
        });
        let attrs = |a: &Value| DecodeAttrs {
            input_encoding: "UTF-8".into(),
            errors: Errors::parse("UnicodeDecode", a["errors"].as_str().expect("errors"))
                .expect("errors"),
            replacement_char: a["replacement_char"].as_i64().expect("char"),
            replace_control_characters: a["replace_control_characters"].as_bool().expect("b"),
        };
        check_with_messages("UnicodeDecode", &move |i, a| {
            unicode::unicode_decode(&i[0], &attrs(a), DType::Int64)
        });
        check_with_messages("UnicodeTranscode", &move |i, a| {
            unicode::unicode_transcode(
                &i[0],
                &attrs(a),
                a["output_encoding"].as_str().expect("enc"),
            )
        });
        check("SubstrUtf8Char", |i, _, _| {
            strings::substr(&i[0], &i[1], &i[2], "UTF8_CHAR")
        });
    }

    #[test]
    fn ragged_conversions() {
        check_with_messages("RaggedTensorToTensor", &|i, a| {
            let types: Vec<String> = a["row_partition_types"]
                .as_array()
                .expect("types")
                .iter()
                .map(|t| t.as_str().expect("type").to_owned())
                .collect();
            let parts: Vec<&Tensor> = i[3..].iter().collect();
            ragged::ragged_tensor_to_tensor(&i[0], &i[1], &i[2], &parts, &types)
        });
        check_with_messages("RaggedTensorToSparse", &|i, _| {
            let (values, splits) = i.split_last().expect("inputs");
            let splits: Vec<&Tensor> = splits.iter().collect();
            ragged::ragged_tensor_to_sparse(&splits, values)
        });
    }
}

/// The kernels added for the construct graphs return errors, never panic, whatever the
/// inputs (shapes, indices, splits and attributes drawn at random).
mod robustness_feature_kernels {
    use proptest::prelude::*;

    use super::super::indexing;
    use super::super::math::sparse_segment::{self, SparseSegmentOp};
    use super::super::ragged::{self, NGramAttrs};
    use super::super::unicode::{self, DecodeAttrs, Errors};
    use super::super::{sparse, strings};
    use crate::tensor::{DType, Tensor, TensorData};

    fn i64s(shape: Vec<usize>, v: &[i64]) -> Tensor {
        let n: usize = shape.iter().product();
        let mut v = v.to_vec();
        v.resize(n, 0);
        Tensor::new(shape, TensorData::Int64(v)).expect("sized")
    }

    fn shape() -> impl Strategy<Value = Vec<usize>> {
        prop::collection::vec(0usize..4, 0..4)
    }

    proptest! {
        #[test]
        fn feature_kernels_never_panic(
            s1 in shape(), s2 in shape(), s3 in shape(),
            v in prop::collection::vec(-6i64..9, 0..40),
            bytes in prop::collection::vec(any::<u8>(), 0..24),
            width in -2i64..5, pad in -2i64..4, flag in any::<bool>(),
        ) {
            let a = i64s(s1.clone(), &v);
            let b = i64s(s2.clone(), &v.iter().rev().copied().collect::<Vec<_>>());
            let c = i64s(s3.clone(), &v);
            let f = Tensor::new(s1.clone(), TensorData::Float32(
                v.iter().map(|&x| x as f32 / 2.0).chain(std::iter::repeat(0.0)).take(s1.iter().product()).collect(),
            )).expect("sized");
            let scalar = |x: i64| i64s(vec![], &[x]);
            for op in [SparseSegmentOp::Sum, SparseSegmentOp::Mean, SparseSegmentOp::SqrtN] {
                let _ = sparse_segment::sparse_segment(op, &f, &b, &c, None);
                let _ = sparse_segment::sparse_segment(op, &a, &b, &b, Some(&scalar(width)));
            }
            let _ = indexing::gather_nd(&a, &b);
            let _ = indexing::gather_nd(&f, &c);
            let _ = indexing::scatter_nd(&a, &b, &c);
            let _ = indexing::scatter_nd(&b, &f, &i64s(vec![s1.len()], &s1.iter().map(|&d| d as i64).collect::<Vec<_>>()));
            let _ = indexing::broadcast_to(&a, &b);
            let _ = sparse::bincount_op(&a, &scalar(width), &f);
            let _ = sparse::sparse_reorder(&a, &b, &c);
            let _ = sparse::sparse_slice(&a, &b, &c, &b, &c);
            let _ = sparse::sparse_count_sparse_output(&a, &b, &c, &f, flag, width, pad);
            let strs: Vec<Vec<u8>> = bytes.chunks(3).map(<[u8]>::to_vec).collect();
            let st = Tensor::new(vec![strs.len()], TensorData::String(strs)).expect("strings");
            let attrs = NGramAttrs {
                separator: b" ".to_vec(),
                ngram_widths: vec![width, 2],
                left_pad: b"<".to_vec(),
                right_pad: b">".to_vec(),
                pad_width: pad,
                preserve_short_sequences: flag,
            };
            let _ = ragged::string_ngrams(&st, &a, &attrs);
            let _ = ragged::string_ngrams(&st, &i64s(vec![2], &[0, st.num_elements() as i64]), &attrs);
            let types = vec!["FIRST_DIM_SIZE".to_owned(), "VALUE_ROWIDS".to_owned()];
            let _ = ragged::ragged_tensor_to_tensor(&b, &a, &scalar(0), &[&scalar(width), &c], &types);
            let _ = ragged::ragged_tensor_to_tensor(&scalar(-1), &st, &st, &[&a], &["ROW_SPLITS".to_owned()]);
            let _ = ragged::ragged_tensor_to_sparse(&[&a], &f);
            let _ = strings::reduce_join(&st, &a, flag, b",");
            let decode = DecodeAttrs {
                input_encoding: "UTF-8".into(),
                errors: if flag { Errors::Replace } else { Errors::Ignore },
                replacement_char: 0xfffd,
                replace_control_characters: flag,
            };
            let _ = unicode::unicode_decode(&st, &decode, DType::Int32);
            let _ = unicode::unicode_transcode(&st, &decode, "UTF-16-BE");
        }
    }
}
