//! The Prometheus text exposition format (0.0.4), written and read once for the whole
//! runtime: the agent renders the guest's families, the shim renders its own and reads the
//! guest's back (bounded: the guest is not trusted), kata-monitor reads every shim's and
//! renders them merged.
//!
//! - [`Exposition`] ([`model`]): families of samples in the order they were first named,
//!   each rendered once (`# HELP`, `# TYPE`, then its samples together).
//! - [`parse`] ([`text`]): the text back into an [`Exposition`], strictly (the first bad
//!   line is an error) within [`Limits`].
//! - [`parse_filtered`] ([`filter`]): the text of a source that is not trusted, line by
//!   line, dropping what is malformed or outside a [`Filter`] (the shim reading the guest).

pub mod filter;
pub mod model;
pub mod text;

pub use filter::{parse_filtered, Filter, Filtered};
pub use model::{Conflict, Exposition, Family, Kind, Sample};
pub use text::{
    format_value, parse, parse_line, valid_label_name, valid_metric_name, Limits, Line, ParseError,
};

/// The `Content-Type` of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
