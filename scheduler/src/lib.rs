//! lode-scheduler: see ../shared/DESIGN.md for its place in Lode. This crate is built by issue 6;
//! until then it only reserves its place in the workspace and its dependency direction
//! (it may depend on lode-proto and on nothing else of Lode's).
