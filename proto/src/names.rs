//! Tensor and input names as GraphDefs write them: `node`, `node:idx`, and `^node` for control
//! inputs. Function bodies also use `node:out_arg:idx`; those are out of scope here.

use std::fmt;

use crate::error::{Error, Result};

/// One output of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorRef<'a> {
    pub node: &'a str,
    pub index: u32,
}

impl<'a> TensorRef<'a> {
    /// Parses `node` or `node:idx`.
    pub fn parse(name: &'a str) -> Result<Self> {
        let bad = |reason| Error::TensorName {
            name: name.to_owned(),
            reason,
        };
        if name.starts_with('^') {
            return Err(bad("a control input is not a tensor"));
        }
        let (node, index) = match name.rsplit_once(':') {
            Some((node, index)) => {
                let index = index
                    .parse::<u32>()
                    .map_err(|_| bad("the part after ':' is not an output index"))?;
                (node, index)
            }
            None => (name, 0),
        };
        if node.is_empty() {
            return Err(bad("the node name is empty"));
        }
        Ok(TensorRef { node, index })
    }
}

impl fmt::Display for TensorRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.node, self.index)
    }
}

/// One entry of `NodeDef.input`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Input<'a> {
    Data(TensorRef<'a>),
    Control(&'a str),
}

impl<'a> Input<'a> {
    pub fn parse(input: &'a str) -> Result<Self> {
        match input.strip_prefix('^') {
            Some("") => Err(Error::TensorName {
                name: input.to_owned(),
                reason: "the control input names no node",
            }),
            Some(node) => Ok(Input::Control(node)),
            None => TensorRef::parse(input).map(Input::Data),
        }
    }

    /// The node this input comes from.
    pub fn node(&self) -> &'a str {
        match self {
            Input::Data(t) => t.node,
            Input::Control(node) => node,
        }
    }

    pub fn is_control(&self) -> bool {
        matches!(self, Input::Control(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_the_three_forms() {
        assert_eq!(
            Input::parse("a/b").expect("parses"),
            Input::Data(TensorRef {
                node: "a/b",
                index: 0
            })
        );
        assert_eq!(
            Input::parse("a/b:3").expect("parses"),
            Input::Data(TensorRef {
                node: "a/b",
                index: 3
            })
        );
        assert_eq!(
            Input::parse("^init").expect("parses"),
            Input::Control("init")
        );
        assert!(Input::parse("^").is_err());
        assert!(Input::parse(":1").is_err());
        assert!(Input::parse("a:x").is_err());
        assert!(TensorRef::parse("^a").is_err());
    }

    proptest! {
        #[test]
        fn display_round_trips(node in "[A-Za-z0-9_./-]{1,20}", index in 0u32..1000) {
            let text = TensorRef { node: &node, index }.to_string();
            let back = TensorRef::parse(&text).expect("display output parses");
            prop_assert_eq!(back, TensorRef { node: &node, index });
        }

        #[test]
        fn never_panics(s in ".*") {
            let _ = Input::parse(&s);
        }
    }
}
