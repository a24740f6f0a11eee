//! The test harness for benches/overhead.rs, which includes it by this path
//! (`#[path = "../tests/common/mod.rs"]`); it lives in tests/util/.
#[path = "../util/mod.rs"]
mod util;
pub use util::*;
