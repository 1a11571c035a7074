//! Fuzzes the strict decoder: any bytes must either decode to an event that
//! obeys the contract, goes into an Arrow batch and survives a JSON
//! re-encoding, or be refused with a reason and land in a reject batch.
//! Never a panic, never a hang.

#![no_main]

use libfuzzer_sys::fuzz_target;

// The same checks as schema/tests/fuzz_regressions.rs, so a crash found here
// replays there as a plain test.
#[path = "../../schema/tests/support/roundtrip.rs"]
mod roundtrip;

fuzz_target!(|data: &[u8]| {
    roundtrip::check(data);
});
