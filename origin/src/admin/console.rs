//! The console: one web page (`origin/console/`) served by the admin
//! listener at `/admin/`, with its script, stylesheet and chart library
//! compiled into the binary (no file system or build step at run time).
//!
//! Invariants kept here: the page is static and carries no secret: it
//! asks the operator for an admin key, keeps it in the tab's
//! `sessionStorage` only, and sends it on every API call; a strict CSP
//! (scripts from this origin only, no inline script) means text from the
//! API (a message, a sale's name) can never run as code.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};

const PAGE: &str = include_str!("../../console/index.html");

/// The files under `/admin/assets/`: name, content type, body.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "console.js",
        "text/javascript; charset=utf-8",
        include_str!("../../console/console.js"),
    ),
    (
        "console.css",
        "text/css; charset=utf-8",
        include_str!("../../console/console.css"),
    ),
    // The chart library, vendored from npm by `origin/console/vendor.mjs`
    // (the version pinned in package.json).
    (
        "uPlot.iife.min.js",
        "text/javascript; charset=utf-8",
        include_str!("../../console/vendor/uPlot.iife.min.js"),
    ),
    (
        "uPlot.min.css",
        "text/css; charset=utf-8",
        include_str!("../../console/vendor/uPlot.min.css"),
    ),
];

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn secured(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// `GET /admin` → `/admin/`.
pub async fn redirect() -> Redirect {
    Redirect::permanent("/admin/")
}

/// `GET /admin/`: the console page.
pub async fn page() -> Response {
    secured(([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE).into_response())
}

/// `GET /admin/assets/{file}`.
pub async fn asset(axum::extract::Path(file): axum::extract::Path<String>) -> Response {
    match ASSETS.iter().find(|(name, _, _)| *name == file) {
        Some((_, kind, body)) => secured(([(header::CONTENT_TYPE, *kind)], *body).into_response()),
        None => (StatusCode::NOT_FOUND, "no such asset").into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_served_assets_and_nothing_inline() {
        let mut refs = 0;
        for part in PAGE.split("/admin/assets/").skip(1) {
            let name = part.split('"').next().unwrap_or_default();
            assert!(
                ASSETS.iter().any(|(n, _, _)| *n == name),
                "index.html loads {name:?}, which ASSETS does not serve"
            );
            refs += 1;
        }
        assert_eq!(refs, ASSETS.len(), "every asset is used by the page");
        // What the CSP would block anyway, caught here rather than in a browser.
        for inline in [
            "<script>",
            "<style",
            " style=",
            " onclick=",
            " onload=",
            "javascript:",
        ] {
            assert!(!PAGE.contains(inline), "index.html holds {inline:?}");
        }
        assert!(CSP.contains("script-src 'self';") && !CSP.contains("unsafe"));
    }
}
