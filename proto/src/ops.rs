//! TensorFlow's op registry, embedded: the signature of every op TensorFlow 2.18.1 registers
//! (written by `fixtures/gen/ops.py` through TensorFlow's C API, prose stripped). A GraphDef
//! does not record the dtypes of its tensors; they follow from each op's signature and the
//! node's attributes, which is what [`OpRegistry::output_types`] works out.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::error::{Error, Result};
use crate::tf::attr_value::attr_value::Value;
use crate::tf::function::FunctionDef;
use crate::tf::node_def::NodeDef;
use crate::tf::op_def::{op_def, OpDef};
use crate::tf::types::DataType;

static TENSORFLOW_OPS: &[u8] = include_bytes!("../data/tf_ops.pb");

/// The functions of a library by name (the lookup every pass over function calls needs).
pub fn function_index(
    library: Option<&crate::tf::function::FunctionDefLibrary>,
) -> HashMap<&str, &FunctionDef> {
    library
        .map(|l| {
            l.function
                .iter()
                .filter_map(|f| f.signature.as_ref().map(|s| (s.name.as_str(), f)))
                .collect()
        })
        .unwrap_or_default()
}

/// Op signatures by op name.
#[derive(Debug)]
pub struct OpRegistry {
    ops: HashMap<String, OpDef>,
}

impl OpRegistry {
    /// The ops of TensorFlow 2.18.1.
    pub fn tensorflow() -> &'static OpRegistry {
        static REGISTRY: OnceLock<OpRegistry> = OnceLock::new();
        REGISTRY.get_or_init(|| {
            let list: crate::tf::op_def::OpList = crate::io::decode_binary(TENSORFLOW_OPS)
                .expect("the embedded op registry is valid (checked by its unit test)");
            OpRegistry {
                ops: list
                    .op
                    .into_iter()
                    .map(|op| (op.name.clone(), op))
                    .collect(),
            }
        })
    }

    pub fn get(&self, op: &str) -> Option<&OpDef> {
        self.ops.get(op)
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The dtypes of `node`'s outputs, in output order. Ops not in the registry are looked up
    /// as functions of `library` (a node whose op names a function calls it).
    pub fn output_types<N: AttrSource + ?Sized>(
        &self,
        node: &N,
        library: &HashMap<&str, &FunctionDef>,
    ) -> Result<Vec<DataType>> {
        let signature = self.signature(node, library)?;
        let mut types = Vec::new();
        for arg in &signature.output_arg {
            arg_types(node, signature, arg, &mut types)?;
        }
        Ok(types)
    }

    /// Where each output arg of `node` sits among its flat outputs, in signature order: (arg
    /// name, range). Function bodies name tensors `node:arg:i`; a graph names the same tensor
    /// `node:<range.start + i>`. Looked up like [`Self::output_types`].
    pub fn output_args<N: AttrSource + ?Sized>(
        &self,
        node: &N,
        library: &HashMap<&str, &FunctionDef>,
    ) -> Result<Vec<(String, std::ops::Range<usize>)>> {
        let signature = self.signature(node, library)?;
        let mut types = Vec::new();
        let mut args = Vec::with_capacity(signature.output_arg.len());
        for arg in &signature.output_arg {
            let start = types.len();
            arg_types(node, signature, arg, &mut types)?;
            args.push((arg.name.clone(), start..types.len()));
        }
        Ok(args)
    }

    /// The op's signature, or the called function's.
    fn signature<'s, N: AttrSource + ?Sized>(
        &'s self,
        node: &N,
        library: &HashMap<&str, &'s FunctionDef>,
    ) -> Result<&'s OpDef> {
        match self.ops.get(node.op_name()) {
            Some(op) => Ok(op),
            None => library
                .get(node.op_name())
                .and_then(|f| f.signature.as_ref())
                .ok_or_else(|| Error::UnknownOp {
                    node: node.node_name().to_owned(),
                    op: node.op_name().to_owned(),
                }),
        }
    }

    /// Whether TensorFlow marks the op stateful (unknown ops count as stateful).
    pub fn is_stateful(&self, op: &str) -> bool {
        self.ops.get(op).is_none_or(|o| o.is_stateful)
    }
}

/// What type inference needs of a node's attributes, whatever holds them.
pub trait AttrSource {
    fn node_name(&self) -> &str;
    fn op_name(&self) -> &str;
    /// None when the node has no such attribute; Err(number) for an unknown type number;
    /// Some(Err(-1)) when the attribute holds something other than a type.
    fn type_attr(&self, name: &str) -> Option<std::result::Result<DataType, i32>>;
    fn int_attr(&self, name: &str) -> Option<Option<i64>>;
    fn types_attr(&self, name: &str) -> Option<Option<Vec<std::result::Result<DataType, i32>>>>;
}

impl AttrSource for NodeDef {
    fn node_name(&self) -> &str {
        &self.name
    }
    fn op_name(&self) -> &str {
        &self.op
    }
    fn type_attr(&self, name: &str) -> Option<std::result::Result<DataType, i32>> {
        Some(match &self.attr.get(name)?.value {
            Some(Value::Type(t)) => t.enum_value(),
            _ => Err(-1),
        })
    }
    fn int_attr(&self, name: &str) -> Option<Option<i64>> {
        Some(match &self.attr.get(name)?.value {
            Some(Value::I(i)) => Some(*i),
            _ => None,
        })
    }
    fn types_attr(&self, name: &str) -> Option<Option<Vec<std::result::Result<DataType, i32>>>> {
        Some(match &self.attr.get(name)?.value {
            Some(Value::List(list)) => Some(list.type_.iter().map(|t| t.enum_value()).collect()),
            _ => None,
        })
    }
}

impl AttrSource for crate::view::NodeView<'_> {
    fn node_name(&self) -> &str {
        self.name
    }
    fn op_name(&self) -> &str {
        self.op
    }
    fn type_attr(&self, name: &str) -> Option<std::result::Result<DataType, i32>> {
        let bytes = self.attr(name)?;
        Some(crate::view::attr::type_(bytes).unwrap_or(Err(-1)))
    }
    fn int_attr(&self, name: &str) -> Option<Option<i64>> {
        Some(crate::view::attr::int(self.attr(name)?))
    }
    fn types_attr(&self, name: &str) -> Option<Option<Vec<std::result::Result<DataType, i32>>>> {
        Some(crate::view::attr::types(self.attr(name)?))
    }
}

fn default_of<'a>(op: &'a OpDef, name: &str) -> Option<&'a crate::tf::attr_value::AttrValue> {
    op.attr
        .iter()
        .find(|a| a.name == name)
        .and_then(|a| a.default_value.as_ref())
}

fn arg_types<N: AttrSource + ?Sized>(
    node: &N,
    op: &OpDef,
    arg: &op_def::ArgDef,
    out: &mut Vec<DataType>,
) -> Result<()> {
    let missing = |attr: &str| Error::MissingAttr {
        node: node.node_name().to_owned(),
        op: node.op_name().to_owned(),
        attr: attr.to_owned(),
    };
    let wrong = |attr: &str, expected: &'static str| Error::AttrType {
        node: node.node_name().to_owned(),
        op: node.op_name().to_owned(),
        attr: attr.to_owned(),
        expected,
        found: "something else",
    };
    let known = |attr: &str, t: std::result::Result<DataType, i32>| {
        t.map_err(|n| {
            if n == -1 {
                wrong(attr, "a type")
            } else {
                wrong(attr, "a known type")
            }
        })
    };
    let mut types = Vec::new();
    if !arg.type_list_attr.is_empty() {
        let name = arg.type_list_attr.as_str();
        let list = match node.types_attr(name) {
            Some(Some(list)) => list,
            Some(None) => return Err(wrong(name, "a list of types")),
            None => match default_of(op, name).map(|d| &d.value) {
                Some(Some(Value::List(l))) => l.type_.iter().map(|t| t.enum_value()).collect(),
                _ => return Err(missing(name)),
            },
        };
        for t in list {
            types.push(known(name, t)?);
        }
    } else {
        let single = if !arg.type_attr.is_empty() {
            let name = arg.type_attr.as_str();
            match node.type_attr(name) {
                Some(t) => known(name, t)?,
                None => match default_of(op, name).map(|d| &d.value) {
                    Some(Some(Value::Type(t))) => known(name, t.enum_value())?,
                    _ => return Err(missing(name)),
                },
            }
        } else {
            known(&arg.name, arg.type_.enum_value())?
        };
        let count = if arg.number_attr.is_empty() {
            1
        } else {
            let name = arg.number_attr.as_str();
            let n = match node.int_attr(name) {
                Some(Some(n)) => n,
                Some(None) => return Err(wrong(name, "an int")),
                None => match default_of(op, name).map(|d| &d.value) {
                    Some(Some(Value::I(n))) => *n,
                    _ => return Err(missing(name)),
                },
            };
            usize::try_from(n).map_err(|_| wrong(name, "a count >= 0"))?
        };
        types.extend(std::iter::repeat_n(single, count));
    }
    for t in types {
        out.push(if arg.is_ref { ref_type(t) } else { t });
    }
    Ok(())
}

/// The `_REF` variant of a type (TensorFlow numbers them plain + 100).
pub fn ref_type(t: DataType) -> DataType {
    use protobuf::Enum;
    let value = t.value();
    if value > 100 {
        return t;
    }
    DataType::from_i32(value + 100).unwrap_or(t)
}

/// The plain type of a `_REF` type.
pub fn base_type(t: DataType) -> DataType {
    use protobuf::Enum;
    let value = t.value();
    if value > 100 {
        DataType::from_i32(value - 100).unwrap_or(t)
    } else {
        t
    }
}

/// Number of bytes one element of `t` takes in a dense tensor, when fixed.
pub fn element_size(t: DataType) -> Option<u64> {
    use DataType::*;
    Some(match base_type(t) {
        DT_BOOL | DT_INT8 | DT_UINT8 | DT_QINT8 | DT_QUINT8 | DT_FLOAT8_E5M2 | DT_FLOAT8_E4M3FN => {
            1
        }
        DT_INT16 | DT_UINT16 | DT_HALF | DT_BFLOAT16 | DT_QINT16 | DT_QUINT16 => 2,
        DT_INT32 | DT_UINT32 | DT_FLOAT | DT_QINT32 => 4,
        DT_INT64 | DT_UINT64 | DT_DOUBLE | DT_COMPLEX64 => 8,
        DT_COMPLEX128 => 16,
        _ => return None,
    })
}

/// Whether tensors of `t` are plain data that can be shipped between processes.
pub fn is_plain(t: DataType) -> bool {
    !matches!(
        base_type(t),
        DataType::DT_RESOURCE | DataType::DT_VARIANT | DataType::DT_INVALID
    ) && (t as i32) < 100
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tf::attr_value::AttrValue;
    use protobuf::EnumOrUnknown;

    fn node(op: &str, attrs: &[(&str, AttrValue)]) -> NodeDef {
        let mut n = NodeDef::new();
        n.name = "n".into();
        n.op = op.into();
        for (k, v) in attrs {
            n.attr.insert((*k).into(), v.clone());
        }
        n
    }

    fn ty(t: DataType) -> AttrValue {
        let mut v = AttrValue::new();
        v.set_type(t);
        v
    }

    #[test]
    fn registry_has_tensorflow_ops() {
        let r = OpRegistry::tensorflow();
        assert!(r.len() > 1500, "{}", r.len());
        assert!(r.get("ParseExampleV2").is_some());
        assert!(r.is_stateful("VarHandleOp"));
        assert!(!r.is_stateful("AddV2"));
    }

    #[test]
    fn infers_output_types_from_signatures() {
        let r = OpRegistry::tensorflow();
        let lib = HashMap::new();
        let unique = node("Unique", &[("T", ty(DataType::DT_INT64))]);
        // out_idx has a default (int32) in the registry.
        assert_eq!(
            r.output_types(&unique, &lib).expect("types"),
            vec![DataType::DT_INT64, DataType::DT_INT32]
        );
        let var = node("VariableV2", &[("dtype", ty(DataType::DT_FLOAT))]);
        assert_eq!(
            r.output_types(&var, &lib).expect("types"),
            vec![DataType::DT_FLOAT_REF]
        );
        let mut types = AttrValue::new();
        types.mut_list().type_ = vec![
            EnumOrUnknown::new(DataType::DT_STRING),
            EnumOrUnknown::new(DataType::DT_VARIANT),
        ];
        let get_next = node("IteratorGetNext", &[("output_types", types)]);
        assert_eq!(
            r.output_types(&get_next, &lib).expect("types"),
            vec![DataType::DT_STRING, DataType::DT_VARIANT]
        );
        let unknown = node("NoSuchOp", &[]);
        assert!(r.output_types(&unknown, &lib).is_err());
    }

    #[test]
    fn output_args_lay_out_lists_and_numbered_args() {
        let r = OpRegistry::tensorflow();
        let lib = HashMap::new();
        // Unique: y (T) then idx (out_idx, defaulted).
        let unique = node("Unique", &[("T", ty(DataType::DT_INT64))]);
        assert_eq!(
            r.output_args(&unique, &lib).expect("layout"),
            vec![("y".to_owned(), 0..1), ("idx".to_owned(), 1..2)]
        );
        // Split: `output` has num_split elements.
        let mut n = AttrValue::new();
        n.set_i(3);
        let split = node("Split", &[("T", ty(DataType::DT_FLOAT)), ("num_split", n)]);
        assert_eq!(
            r.output_args(&split, &lib).expect("layout"),
            vec![("output".to_owned(), 0..3)]
        );
        assert!(r.output_args(&node("NoSuchOp", &[]), &lib).is_err());
    }
}
