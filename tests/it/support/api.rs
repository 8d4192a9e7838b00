//! Every library item the integration tests name; everything else they reach through the
//! binary. When the library's modules move, this is the file to follow them.

pub use loopflow::testing::{
    ALWAYS, COMMON_KEYS, Code, NODE_FIELDS, REGISTRY, SOURCE, kind_names, template_names,
};

/// The JSON schema `loopflow schema NAME` prints, parsed.
pub fn schema(name: &str) -> serde_json::Value {
    serde_json::from_str(loopflow::testing::schema(name).expect("schema")).expect("JSON")
}
