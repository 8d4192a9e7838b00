//! Every library item the integration tests name; everything else they reach through the
//! binary. When the library's modules move, this is the file to follow them.

pub use loopflow::diag::Code;
pub use loopflow::node::{COMMON_KEYS, REGISTRY, kind_names};
pub use loopflow::template::vars::{ALWAYS, NODE_FIELDS};

/// The JSON schema `loopflow schema NAME` prints, parsed.
pub fn schema(name: &str) -> serde_json::Value {
    serde_json::from_str(loopflow::schema::get(name).expect("schema")).expect("JSON")
}
