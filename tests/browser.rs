//! The terminal page (PROTOCOL.md 12.5) in a real browser: Debian's `chromium`, headless,
//! driven over the DevTools protocol by `tests/sdk/browser.py` (no browser download), typing
//! and reading back the page's DOM text as a person would see it. Skipped, saying why,
//! where chromium is not installed (CI installs it: `.ci/run`).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::util::*;

#[test]
fn the_terminal_page_runs_a_session_in_a_real_browser() {
    // Debian's package and command (`have` skips, saying so, where it is missing).
    if !have(&["chromium"]) {
        return;
    }
    let browser = "chromium";
    let Some(python) = crate::util::venv::sdk_python() else {
        return;
    };
    let front = crate::http::start_front(&[]);
    let profile = TempDir::new();
    let url = format!(
        "http://127.0.0.1:{}/terminal#token={}",
        front.port,
        crate::http::TOKEN
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/browser.py");
    let out = crate::util::venv::run_bounded(
        Command::new(&python)
            .arg("-B")
            .arg(&script)
            .args(["--chromium", browser, "--url", &url, "--profile"])
            .arg(profile.path()),
        Duration::from_secs(240),
        &profile.path().join("browser.log"),
    );
    assert!(
        out.status.success(),
        "browser.py failed ({}):\n{}\n{}\ndaemon log:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        front.daemon.log()
    );
    // Every line the person ran was judged and audited as the browser's own.
    let log = front.daemon.log();
    assert!(log.contains("watches shell session"), "{log}");
    assert_no_panic(&front.daemon);
}
