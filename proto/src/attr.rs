//! Typed access to NodeDef attributes. Every error names the node, its op and the attribute,
//! so that a problem deep in a large graph can be found from the message alone.

use crate::error::{Error, Result};
use crate::tf::attr_value::attr_value::Value;
use crate::tf::attr_value::{AttrValue, NameAttrList};
use crate::tf::node_def::NodeDef;
use crate::tf::tensor::TensorProto;
use crate::tf::tensor_shape::TensorShapeProto;
use crate::tf::types::DataType;

/// Attribute accessors for [`NodeDef`].
pub trait NodeAttrs {
    fn attr_value(&self, attr: &str) -> Result<&AttrValue>;
    fn attr_int(&self, attr: &str) -> Result<i64>;
    fn attr_float(&self, attr: &str) -> Result<f32>;
    fn attr_bool(&self, attr: &str) -> Result<bool>;
    /// A string attribute; its bytes must be UTF-8.
    fn attr_str(&self, attr: &str) -> Result<&str>;
    /// A `type` attribute; a value this schema does not know is an error.
    fn attr_type(&self, attr: &str) -> Result<DataType>;
    fn attr_shape(&self, attr: &str) -> Result<&TensorShapeProto>;
    fn attr_tensor(&self, attr: &str) -> Result<&TensorProto>;
    fn attr_func(&self, attr: &str) -> Result<&NameAttrList>;
    fn attr_types(&self, attr: &str) -> Result<Vec<DataType>>;
    fn attr_ints(&self, attr: &str) -> Result<&[i64]>;
    fn attr_shapes(&self, attr: &str) -> Result<&[TensorShapeProto]>;
    /// The names of every function the node refers to, through `func` or `list(func)` values.
    fn referenced_functions(&self) -> Vec<(&str, &str)>;
}

fn kind(value: &AttrValue) -> &'static str {
    match &value.value {
        None => "nothing",
        Some(Value::List(_)) => "a list",
        Some(Value::S(_)) => "a string",
        Some(Value::I(_)) => "an int",
        Some(Value::F(_)) => "a float",
        Some(Value::B(_)) => "a bool",
        Some(Value::Type(_)) => "a type",
        Some(Value::Shape(_)) => "a shape",
        Some(Value::Tensor(_)) => "a tensor",
        Some(Value::Placeholder(_)) => "a placeholder",
        Some(Value::Func(_)) => "a function",
    }
}

impl NodeDef {
    fn attr_error(&self, attr: &str, expected: &'static str, found: &AttrValue) -> Error {
        Error::AttrType {
            node: self.name.clone(),
            op: self.op.clone(),
            attr: attr.to_owned(),
            expected,
            found: kind(found),
        }
    }

    fn list<'a>(
        &'a self,
        attr: &str,
        expected: &'static str,
    ) -> Result<&'a crate::tf::attr_value::attr_value::ListValue> {
        let value = self.attr_value(attr)?;
        match &value.value {
            Some(Value::List(list)) => Ok(list),
            _ => Err(self.attr_error(attr, expected, value)),
        }
    }
}

macro_rules! scalar {
    ($self:ident, $attr:ident, $variant:ident, $expected:literal) => {{
        let value = $self.attr_value($attr)?;
        match &value.value {
            Some(Value::$variant(v)) => Ok(v),
            _ => Err($self.attr_error($attr, $expected, value)),
        }
    }};
}

impl NodeAttrs for NodeDef {
    fn attr_value(&self, attr: &str) -> Result<&AttrValue> {
        self.attr.get(attr).ok_or_else(|| Error::MissingAttr {
            node: self.name.clone(),
            op: self.op.clone(),
            attr: attr.to_owned(),
        })
    }

    fn attr_int(&self, attr: &str) -> Result<i64> {
        scalar!(self, attr, I, "an int").copied()
    }

    fn attr_float(&self, attr: &str) -> Result<f32> {
        scalar!(self, attr, F, "a float").copied()
    }

    fn attr_bool(&self, attr: &str) -> Result<bool> {
        scalar!(self, attr, B, "a bool").copied()
    }

    fn attr_str(&self, attr: &str) -> Result<&str> {
        let bytes = scalar!(self, attr, S, "a string")?;
        std::str::from_utf8(bytes).map_err(|_| Error::AttrType {
            node: self.name.clone(),
            op: self.op.clone(),
            attr: attr.to_owned(),
            expected: "a UTF-8 string",
            found: "non-UTF-8 bytes",
        })
    }

    fn attr_type(&self, attr: &str) -> Result<DataType> {
        let value = self.attr_value(attr)?;
        match &value.value {
            Some(Value::Type(t)) => t.enum_value().map_err(|_| Error::AttrType {
                node: self.name.clone(),
                op: self.op.clone(),
                attr: attr.to_owned(),
                expected: "a known type",
                found: "an unknown type number",
            }),
            _ => Err(self.attr_error(attr, "a type", value)),
        }
    }

    fn attr_shape(&self, attr: &str) -> Result<&TensorShapeProto> {
        scalar!(self, attr, Shape, "a shape")
    }

    fn attr_tensor(&self, attr: &str) -> Result<&TensorProto> {
        scalar!(self, attr, Tensor, "a tensor")
    }

    fn attr_func(&self, attr: &str) -> Result<&NameAttrList> {
        scalar!(self, attr, Func, "a function")
    }

    fn attr_types(&self, attr: &str) -> Result<Vec<DataType>> {
        let list = self.list(attr, "a list of types")?;
        list.type_
            .iter()
            .map(|t| {
                t.enum_value().map_err(|_| Error::AttrType {
                    node: self.name.clone(),
                    op: self.op.clone(),
                    attr: attr.to_owned(),
                    expected: "a list of known types",
                    found: "an unknown type number",
                })
            })
            .collect()
    }

    fn attr_ints(&self, attr: &str) -> Result<&[i64]> {
        Ok(&self.list(attr, "a list of ints")?.i)
    }

    fn attr_shapes(&self, attr: &str) -> Result<&[TensorShapeProto]> {
        Ok(&self.list(attr, "a list of shapes")?.shape)
    }

    fn referenced_functions(&self) -> Vec<(&str, &str)> {
        let mut out = Vec::new();
        let mut keys: Vec<&String> = self.attr.keys().collect();
        keys.sort();
        for key in keys {
            match &self.attr[key].value {
                Some(Value::Func(f)) => out.push((key.as_str(), f.name.as_str())),
                Some(Value::List(list)) => {
                    out.extend(list.func.iter().map(|f| (key.as_str(), f.name.as_str())));
                }
                _ => {}
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> NodeDef {
        let mut n = NodeDef::new();
        n.name = "batch".into();
        n.op = "BatchDatasetV2".into();
        let mut drop = AttrValue::new();
        drop.set_b(true);
        n.attr.insert("drop_remainder".into(), drop);
        let mut t = AttrValue::new();
        t.set_type(DataType::DT_INT64);
        n.attr.insert("T".into(), t);
        let mut f = AttrValue::new();
        let mut func = NameAttrList::new();
        func.name = "__inference_map_12".into();
        f.set_func(func);
        n.attr.insert("f".into(), f);
        n
    }

    #[test]
    fn reads_typed_values() {
        let n = node();
        assert!(n.attr_bool("drop_remainder").expect("bool"));
        assert_eq!(n.attr_type("T").expect("type"), DataType::DT_INT64);
        assert_eq!(n.attr_func("f").expect("func").name, "__inference_map_12");
        assert_eq!(n.referenced_functions(), vec![("f", "__inference_map_12")]);
    }

    #[test]
    fn errors_name_node_op_and_attribute() {
        let n = node();
        let missing = n.attr_int("batch_size").expect_err("missing").to_string();
        assert_eq!(
            missing,
            "node 'batch' (BatchDatasetV2) has no attribute 'batch_size'"
        );
        let wrong = n.attr_int("T").expect_err("wrong type").to_string();
        assert_eq!(
            wrong,
            "node 'batch' (BatchDatasetV2): attribute 'T' holds a type, expected an int"
        );
    }
}
