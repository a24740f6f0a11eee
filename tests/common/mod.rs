//! The test harness for benches/overhead.rs, which includes it by this path
//! (`#[path = "../tests/common/mod.rs"]`); it lives in tests/util/. The bench uses a few
//! of its helpers, hence the allow, which covers only this inclusion: in the test binary
//! (tests/tests.rs, `mod util`) an unused helper is an error.
#[allow(dead_code)]
#[path = "../util/mod.rs"]
mod util;
pub use util::*;
