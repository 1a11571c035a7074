//! The set of `event_id`s seen, for de-duplication across the whole history.
//!
//! Every push probes it at a random place, so it is a [`StrTable`]: the
//! caller prefetches the probe before the rest of the push's work.

pub(crate) use crate::strtab::StrTable as EventIds;
