//! The README's examples, run as written (so the documentation cannot drift).

mod common;

use std::process::Command;

use common::*;

/// The fenced block of `README.md` whose first line is `first`.
fn block(first: &str) -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let mut lines = readme.lines();
    while let Some(l) = lines.next() {
        if l.starts_with("```") {
            let body: Vec<&str> = lines
                .by_ref()
                .take_while(|l| !l.starts_with("```"))
                .collect();
            if body.first() == Some(&first) {
                return body.join("\n") + "\n";
            }
        }
    }
    panic!("no block starting with {first:?} in README.md");
}

/// The unit files pass `systemd-analyze verify` (with `ExecStart` pointing at the binary
/// this build made, since /usr/local/bin/execd is not installed here). CI installs
/// systemd-analyze; elsewhere the test says it skipped.
#[test]
fn the_readme_unit_files_pass_systemd_analyze_verify() {
    let available = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !available {
        assert!(
            std::env::var_os("CI").is_none(),
            "systemd-analyze is missing in CI: .ci/run must install it"
        );
        eprintln!("skipped: systemd-analyze is not installed");
        return;
    }
    let dir = TempDir::new();
    let service = block("# /etc/systemd/system/execd.service")
        .replace("/usr/local/bin/execd", env!("CARGO_BIN_EXE_execd"));
    assert!(service.contains("Type=notify") && service.contains("Delegate=yes"));
    assert!(service.contains("ExecReload="));
    std::fs::write(dir.path().join("execd.service"), service).expect("write");
    std::fs::write(
        dir.path().join("execd.socket"),
        block("# /etc/systemd/system/execd.socket"),
    )
    .expect("write");
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no", "execd.socket", "execd.service"])
        .current_dir(dir.path())
        .output()
        .expect("run systemd-analyze");
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "systemd-analyze verify: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
