//! Serialising shared strings without serde's `rc` feature (which would
//! change serde for the whole workspace) and the schema's `Source`.

use std::sync::Arc;

use leaseline_schema::Source;
use serde::Serializer;

pub(crate) fn arc<S: Serializer>(s: &Arc<str>, ser: S) -> Result<S::Ok, S::Error> {
    ser.serialize_str(s)
}

pub(crate) fn opt_arc<S: Serializer>(s: &Option<Arc<str>>, ser: S) -> Result<S::Ok, S::Error> {
    match s {
        Some(s) => ser.serialize_some(&**s),
        None => ser.serialize_none(),
    }
}

pub(crate) fn source<S: Serializer>(s: &Source, ser: S) -> Result<S::Ok, S::Error> {
    ser.serialize_str(s.as_str())
}
