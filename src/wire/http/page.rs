//! `GET /terminal` (PROTOCOL 12.5): one self-contained page that shows a shell session as
//! a terminal in a browser. Its script (`terminal.js`, written for execd) opens
//! `/v1/shell/ws?render=screen` and draws the screen frames the daemon's own emulator
//! computes, as DOM text; it fetches nothing else. The page is served with a
//! Content-Security-Policy that allows that one script by its SHA-256 and nothing else.

use std::sync::OnceLock;

use super::route::typed_response;
use crate::wire::encode::base64_encode;

/// The page's script, inlined in it.
const SCRIPT: &str = include_str!("terminal.js");
/// The page around the script.
const HTML_BEFORE: &str = include_str!("terminal.html");
/// Where the script goes in `HTML_BEFORE`.
const SLOT: &str = "<!--script-->";

/// The page, whole: its HTML with the script in its `<script>` element.
pub fn body() -> &'static [u8] {
    static BODY: OnceLock<Vec<u8>> = OnceLock::new();
    BODY.get_or_init(|| {
        HTML_BEFORE
            .replacen(SLOT, &format!("<script>{SCRIPT}</script>"), 1)
            .into_bytes()
    })
}

/// `Content-Security-Policy` of the page: nothing may load but its own script (by hash),
/// its inline styles, and connections back to where it came from; no page may frame it.
pub fn policy() -> &'static str {
    static POLICY: OnceLock<String> = OnceLock::new();
    POLICY.get_or_init(|| {
        let mut hash = Vec::new();
        base64_encode(&mut hash, &crate::wire::sha256::digest(SCRIPT.as_bytes()));
        format!(
            "default-src 'none'; script-src 'sha256-{}'; style-src 'unsafe-inline'; \
             connect-src 'self'; frame-ancestors 'none'",
            String::from_utf8_lossy(&hash)
        )
    })
}

/// The page's entity tag: its SHA-256, so a page kept by a browser is checked again and
/// a new build's is fetched.
fn etag() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| format!("\"{}\"", crate::wire::sha256::hex(body())))
}

/// The answer to `GET /terminal`.
pub fn response(keep_alive: bool) -> Vec<u8> {
    typed_response(
        200,
        "text/html; charset=utf-8",
        body(),
        keep_alive,
        &[
            ("Content-Security-Policy", policy()),
            ("Cache-Control", "no-cache"),
            ("ETag", etag()),
            // A `?token=` in the address must not travel in a Referer.
            ("Referrer-Policy", "no-referrer"),
            ("X-Content-Type-Options", "nosniff"),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_holds_its_script_whole_and_the_policy_names_it() {
        let page = String::from_utf8(body().to_vec()).unwrap();
        let start = page.find("<script>").unwrap() + "<script>".len();
        let end = page.rfind("</script>").unwrap();
        assert_eq!(&page[start..end], SCRIPT);
        assert_eq!(page.matches("<script").count(), 1, "one script, inline");
        assert!(
            !SCRIPT.contains("</script"),
            "the script cannot end its element early"
        );
        assert!(page.len() < 40 << 10, "under 40 KiB: {}", page.len());
        let mut hash = Vec::new();
        base64_encode(&mut hash, &crate::wire::sha256::digest(SCRIPT.as_bytes()));
        let hash = String::from_utf8(hash).unwrap();
        assert_eq!(
            policy(),
            format!(
                "default-src 'none'; script-src 'sha256-{hash}'; style-src 'unsafe-inline'; \
                 connect-src 'self'; frame-ancestors 'none'"
            )
        );
        for external in ["src=", "href=", "@import", "url("] {
            assert!(!page.contains(external), "fetches nothing: {external}");
        }
    }
}
