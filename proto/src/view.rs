//! A zero-copy view of a binary GraphDef for work on large graphs.
//!
//! Decoding a whole GraphDef into generated structs costs about 20 bytes of memory per byte of
//! input (every `AttrValue` carries its largest oneof case inline, every node a hash map). Graph
//! partitioning needs only each node's name, op, device, inputs and a few attributes, and must
//! write most nodes back unchanged. A [`GraphView`] reads exactly that, pointing into the input
//! buffer, and keeps each node's encoded bytes so that an unchanged node is written back as the
//! very bytes it was read from (unknown fields included). Nodes that change are decoded fully
//! with [`NodeView::to_node_def`].

use protobuf::Message;

use crate::tf::attr_value::AttrValue;
use crate::tf::function::FunctionDefLibrary;
use crate::tf::node_def::NodeDef;
use crate::tf::versions::VersionDef;

/// A wire-format problem, with the byte offset where it was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at byte {offset}: {what}")]
pub struct WireError {
    pub offset: usize,
    pub what: &'static str,
}

type WireResult<T> = Result<T, WireError>;

/// A field as read from the wire.
#[derive(Debug, Clone, Copy)]
pub enum Field<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
}

/// Iterates over the fields of one encoded message.
#[derive(Debug, Clone)]
pub struct Fields<'a> {
    buf: &'a [u8],
    pos: usize,
    base: usize,
}

impl<'a> Fields<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Fields {
            buf,
            pos: 0,
            base: 0,
        }
    }

    fn err(&self, what: &'static str) -> WireError {
        WireError {
            offset: self.base + self.pos,
            what,
        }
    }

    fn varint(&mut self) -> WireResult<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(self.err("the data ends inside a varint"));
            };
            self.pos += 1;
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(self.err("a varint longer than 10 bytes"))
    }

    fn take(&mut self, n: usize) -> WireResult<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| self.err("a field runs past the end of its message"))?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    /// The next (field number, value, bytes of the whole field including its tag).
    pub fn next_field(&mut self) -> Option<WireResult<(u32, Field<'a>, &'a [u8])>> {
        if self.pos >= self.buf.len() {
            return None;
        }
        let start = self.pos;
        Some((|| {
            let tag = self.varint()?;
            let number =
                u32::try_from(tag >> 3).map_err(|_| self.err("a field number out of range"))?;
            if number == 0 {
                return Err(self.err("field number 0"));
            }
            let field = match tag & 7 {
                0 => Field::Varint(self.varint()?),
                1 => {
                    let b = self.take(8)?;
                    Field::Fixed64(u64::from_le_bytes(
                        b.try_into().map_err(|_| self.err("short fixed64"))?,
                    ))
                }
                2 => {
                    let len = usize::try_from(self.varint()?)
                        .map_err(|_| self.err("a length out of range"))?;
                    Field::Bytes(self.take(len)?)
                }
                5 => {
                    let b = self.take(4)?;
                    Field::Fixed32(u32::from_le_bytes(
                        b.try_into().map_err(|_| self.err("short fixed32"))?,
                    ))
                }
                _ => return Err(self.err("a wire type protobuf 3 does not use (groups)")),
            };
            Ok((number, field, &self.buf[start..self.pos]))
        })())
    }
}

fn utf8<'b>(bytes: &'b [u8], what: &'static str) -> WireResult<&'b str> {
    std::str::from_utf8(bytes).map_err(|_| WireError { offset: 0, what })
}

/// One node, pointing into the encoded graph.
#[derive(Debug, Clone)]
pub struct NodeView<'a> {
    /// The NodeDef's encoded bytes (without the enclosing tag and length).
    pub raw: &'a [u8],
    pub name: &'a str,
    pub op: &'a str,
    pub device: &'a str,
    pub inputs: Vec<&'a str>,
    /// Attribute names with their encoded AttrValue.
    pub attrs: Vec<(&'a str, &'a [u8])>,
}

impl<'a> NodeView<'a> {
    pub fn parse(raw: &'a [u8]) -> WireResult<Self> {
        let mut node = NodeView {
            raw,
            name: "",
            op: "",
            device: "",
            inputs: Vec::new(),
            attrs: Vec::new(),
        };
        let mut fields = Fields::new(raw);
        while let Some(field) = fields.next_field() {
            match field? {
                (1, Field::Bytes(b), _) => node.name = utf8(b, "a node name is not UTF-8")?,
                (2, Field::Bytes(b), _) => node.op = utf8(b, "an op name is not UTF-8")?,
                (3, Field::Bytes(b), _) => node.inputs.push(utf8(b, "an input name is not UTF-8")?),
                (4, Field::Bytes(b), _) => node.device = utf8(b, "a device is not UTF-8")?,
                (5, Field::Bytes(entry), _) => {
                    let mut key = "";
                    let mut value: &[u8] = &[];
                    let mut entry_fields = Fields::new(entry);
                    while let Some(f) = entry_fields.next_field() {
                        match f? {
                            (1, Field::Bytes(b), _) => {
                                key = utf8(b, "an attribute name is not UTF-8")?
                            }
                            (2, Field::Bytes(b), _) => value = b,
                            _ => {}
                        }
                    }
                    node.attrs.push((key, value));
                }
                _ => {}
            }
        }
        Ok(node)
    }

    pub fn attr(&self, key: &str) -> Option<&'a [u8]> {
        self.attrs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }

    /// The node decoded into the generated struct (for nodes that change).
    pub fn to_node_def(&self) -> protobuf::Result<NodeDef> {
        crate::io::decode_binary(self.raw)
    }
}

/// What an encoded AttrValue holds, as far as graph analysis needs it.
pub mod attr {
    use super::{Field, Fields};
    use crate::tf::types::DataType;
    use protobuf::Enum;

    fn scalar(bytes: &[u8], number: u32) -> Option<Field<'_>> {
        let mut fields = Fields::new(bytes);
        let mut found = None;
        while let Some(Ok((n, f, _))) = fields.next_field() {
            if n == number {
                found = Some(f);
            }
        }
        found
    }

    /// A `type` value (field 6); Err(number) for a number this schema does not know.
    pub fn type_(bytes: &[u8]) -> Option<Result<DataType, i32>> {
        match scalar(bytes, 6)? {
            Field::Varint(v) => {
                let v = i32::try_from(v).unwrap_or(-1);
                Some(DataType::from_i32(v).ok_or(v))
            }
            _ => None,
        }
    }

    /// An `int` value (field 3).
    pub fn int(bytes: &[u8]) -> Option<i64> {
        match scalar(bytes, 3)? {
            #[allow(clippy::cast_possible_wrap)]
            Field::Varint(v) => Some(v as i64), // int64 is two's complement on the wire
            _ => None,
        }
    }

    /// A `list(type)` value (field 1 → ListValue field 6, packed or not).
    pub fn types(bytes: &[u8]) -> Option<Vec<Result<DataType, i32>>> {
        let Field::Bytes(list) = scalar(bytes, 1)? else {
            return None;
        };
        let mut out = Vec::new();
        let mut fields = Fields::new(list);
        while let Some(Ok((n, f, _))) = fields.next_field() {
            if n != 6 {
                continue;
            }
            let mut push = |v: u64| {
                let v = i32::try_from(v).unwrap_or(-1);
                out.push(DataType::from_i32(v).ok_or(v));
            };
            match f {
                Field::Varint(v) => push(v),
                Field::Bytes(packed) => {
                    let mut p = super::Fields {
                        buf: packed,
                        pos: 0,
                        base: 0,
                    };
                    while p.pos < packed.len() {
                        match p.varint() {
                            Ok(v) => push(v),
                            Err(_) => return None,
                        }
                    }
                }
                _ => {}
            }
        }
        Some(out)
    }

    /// Function names a value refers to: `func` (field 10) or `list(func)` (field 1 → 9).
    pub fn functions(bytes: &[u8]) -> Vec<&str> {
        let mut out = Vec::new();
        let mut fields = Fields::new(bytes);
        while let Some(Ok((n, f, _))) = fields.next_field() {
            match (n, f) {
                (10, Field::Bytes(func)) => out.extend(name_of(func)),
                (1, Field::Bytes(list)) => {
                    let mut lf = Fields::new(list);
                    while let Some(Ok((9, Field::Bytes(func), _))) = lf.next_field() {
                        out.extend(name_of(func));
                    }
                }
                _ => {}
            }
        }
        out
    }

    fn name_of(name_attr_list: &[u8]) -> Option<&str> {
        let mut fields = Fields::new(name_attr_list);
        while let Some(Ok((n, f, _))) = fields.next_field() {
            if let (1, Field::Bytes(b)) = (n, f) {
                return std::str::from_utf8(b).ok();
            }
        }
        None
    }

    /// The strings of a `list(string)` value (field 1 → ListValue field 2).
    pub fn strings(bytes: &[u8]) -> Vec<&[u8]> {
        let mut out = Vec::new();
        if let Some(Field::Bytes(list)) = scalar(bytes, 1) {
            let mut fields = Fields::new(list);
            while let Some(Ok((n, f, _))) = fields.next_field() {
                if let (2, Field::Bytes(s)) = (n, f) {
                    out.push(s);
                }
            }
        }
        out
    }
}

/// A GraphDef read as views: nodes point into the buffer; the (small) library and versions
/// are decoded; any other top-level field is kept as its encoded bytes.
#[derive(Debug)]
pub struct GraphView<'a> {
    pub nodes: Vec<NodeView<'a>>,
    pub library: Option<FunctionDefLibrary>,
    pub versions: Option<VersionDef>,
    /// Other top-level fields (tag included), e.g. debug_info or fields Lode does not know.
    pub other: Vec<&'a [u8]>,
}

impl<'a> GraphView<'a> {
    pub fn parse(bytes: &'a [u8]) -> Result<Self, ViewError> {
        let mut graph = GraphView {
            nodes: Vec::new(),
            library: None,
            versions: None,
            other: Vec::new(),
        };
        let mut fields = Fields::new(bytes);
        while let Some(field) = fields.next_field() {
            let (number, value, whole) = field.map_err(ViewError::Wire)?;
            match (number, value) {
                (1, Field::Bytes(node)) => {
                    let offset = node.as_ptr() as usize - bytes.as_ptr() as usize;
                    let view = NodeView::parse(node).map_err(|e| {
                        ViewError::Wire(WireError {
                            offset: offset + e.offset,
                            what: e.what,
                        })
                    })?;
                    graph.nodes.push(view);
                }
                (2, Field::Bytes(lib)) => {
                    let mut library: FunctionDefLibrary =
                        crate::io::decode_binary(lib).map_err(ViewError::Decode)?;
                    if let Some(previous) = graph.library.take() {
                        // Repeated occurrences of a message field merge, as protobuf says.
                        let mut merged = previous;
                        merged.function.append(&mut library.function);
                        merged.gradient.append(&mut library.gradient);
                        merged
                            .registered_gradients
                            .append(&mut library.registered_gradients);
                        library = merged;
                    }
                    graph.library = Some(library);
                }
                (4, Field::Bytes(v)) => {
                    graph.versions = Some(crate::io::decode_binary(v).map_err(ViewError::Decode)?)
                }
                _ => graph.other.push(whole),
            }
        }
        Ok(graph)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error("{0}")]
    Wire(WireError),
    #[error("{0}")]
    Decode(protobuf::Error),
}

/// A node of an output graph: the bytes of an unchanged node, or a node built or changed.
#[derive(Debug, Clone)]
pub enum OutNode<'a> {
    Raw(&'a [u8]),
    /// A NodeDef already encoded (an original node with edited inputs).
    Encoded(Vec<u8>),
    Owned(NodeDef),
}

/// Re-encodes a node with a new input list and nothing else changed: every other field is
/// copied as it was encoded (attributes and unknown fields are not decoded), and the inputs
/// take the place of the first original input (or follow the op).
pub fn with_inputs(raw: &[u8], inputs: &[String]) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::with_capacity(raw.len() + 16 * inputs.len());
    let mut written = false;
    let put_inputs = |out: &mut Vec<u8>| {
        for input in inputs {
            put_len_field(out, 3, input.as_bytes());
        }
    };
    let mut fields = Fields::new(raw);
    while let Some(field) = fields.next_field() {
        let (number, _, whole) = field?;
        if number == 3 {
            if !written {
                put_inputs(&mut out);
                written = true;
            }
            continue;
        }
        if !written && number > 3 {
            put_inputs(&mut out);
            written = true;
        }
        out.extend_from_slice(whole);
    }
    if !written {
        put_inputs(&mut out);
    }
    Ok(out)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let byte = u8::try_from(v & 0x7f).unwrap_or(0);
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn put_len_field(out: &mut Vec<u8>, number: u32, bytes: &[u8]) {
    put_varint(out, u64::from(number) << 3 | 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Encodes a GraphDef from its parts, in field order (node, library, versions).
pub fn encode_graph(
    nodes: &[OutNode],
    library: Option<&FunctionDefLibrary>,
    versions: Option<&VersionDef>,
) -> protobuf::Result<Vec<u8>> {
    let mut out = Vec::new();
    for node in nodes {
        match node {
            OutNode::Raw(raw) => put_len_field(&mut out, 1, raw),
            OutNode::Encoded(bytes) => put_len_field(&mut out, 1, bytes),
            OutNode::Owned(def) => put_len_field(&mut out, 1, &def.write_to_bytes()?),
        }
    }
    if let Some(lib) = library {
        put_len_field(&mut out, 2, &lib.write_to_bytes()?);
    }
    if let Some(v) = versions {
        put_len_field(&mut out, 4, &v.write_to_bytes()?);
    }
    Ok(out)
}

/// The AttrValue of an encoded attribute (for the few attributes that need full decoding).
pub fn decode_attr(bytes: &[u8]) -> protobuf::Result<AttrValue> {
    crate::io::decode_binary(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tf::graph::GraphDef;
    use crate::tf::types::DataType;

    #[test]
    fn a_view_reads_what_the_generated_code_writes() {
        let mut g = GraphDef::new();
        for i in 0..3 {
            let mut n = NodeDef::new();
            n.name = format!("n{i}");
            n.op = "AddV2".into();
            n.device = "/device:GPU:0".into();
            n.input = vec!["a:1".into(), "^b".into()];
            let mut t = AttrValue::new();
            t.set_type(DataType::DT_INT64);
            n.attr.insert("T".into(), t);
            n.mut_unknown_fields().add_varint(99, 7);
            g.node.push(n);
        }
        g.versions.mut_or_insert_default().producer = 12;
        let bytes = g.write_to_bytes().expect("encodes");
        let view = GraphView::parse(&bytes).expect("parses");
        assert_eq!(view.nodes.len(), 3);
        let n = &view.nodes[1];
        assert_eq!((n.name, n.op, n.device), ("n1", "AddV2", "/device:GPU:0"));
        assert_eq!(n.inputs, vec!["a:1", "^b"]);
        assert_eq!(
            attr::type_(n.attr("T").expect("T")),
            Some(Ok(DataType::DT_INT64))
        );
        // Unchanged nodes re-encode to the same bytes, unknown fields included.
        let nodes: Vec<OutNode> = view.nodes.iter().map(|n| OutNode::Raw(n.raw)).collect();
        let again = encode_graph(&nodes, None, view.versions.as_ref()).expect("encodes");
        assert_eq!(again, bytes);
    }

    #[test]
    fn with_inputs_changes_only_the_inputs() {
        let mut n = NodeDef::new();
        n.name = "n".into();
        n.op = "AddV2".into();
        n.input = vec!["a".into(), "b:1".into(), "^c".into()];
        n.device = "/device:CPU:0".into();
        let mut t = AttrValue::new();
        t.set_type(DataType::DT_FLOAT);
        n.attr.insert("T".into(), t);
        n.mut_unknown_fields().add_varint(77, 1);
        let raw = n.write_to_bytes().expect("encodes");
        let new_inputs = vec!["x:0".to_owned(), "b:1".to_owned(), "^y".to_owned()];
        let edited: NodeDef =
            crate::io::decode_binary(&with_inputs(&raw, &new_inputs).expect("edits"))
                .expect("decodes");
        let mut want = n.clone();
        want.input = new_inputs;
        assert_eq!(edited, want);
    }

    #[test]
    fn truncated_input_is_an_error_not_a_panic() {
        let mut g = GraphDef::new();
        let mut n = NodeDef::new();
        n.name = "x".into();
        n.op = "NoOp".into();
        g.node.push(n);
        let bytes = g.write_to_bytes().expect("encodes");
        for cut in 0..bytes.len() {
            let _ = GraphView::parse(&bytes[..cut]);
        }
        assert!(GraphView::parse(&bytes[..bytes.len() - 1]).is_err());
    }
}
