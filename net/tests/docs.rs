//! The curl examples of `docs/api.md`, run in order against a real server and compared
//! with the output the page shows.

mod common;

use common::{Nova, Store, have_curl, shell};
use serde_json::Value;

/// Whether `actual` has the shape and values of `expected`, where the string `"..."`
/// stands for any value.
fn matches(expected: &Value, actual: &Value) -> bool {
    match (expected, actual) {
        (Value::String(s), _) if s == "..." => true,
        (Value::Object(e), Value::Object(a)) => {
            e.len() == a.len() && e.iter().all(|(k, v)| a.get(k).is_some_and(|got| matches(v, got)))
        }
        (Value::Array(e), Value::Array(a)) => {
            e.len() == a.len() && e.iter().zip(a).all(|(e, a)| matches(e, a))
        }
        _ => expected == actual,
    }
}

/// The fenced blocks of a markdown page: (language, text).
fn blocks(page: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in page.lines() {
        match (&mut current, line.strip_prefix("```")) {
            (None, Some(lang)) => current = Some((lang.trim().to_owned(), String::new())),
            (Some(_), Some(_)) => out.extend(current.take()),
            (Some((_, text)), None) => {
                text.push_str(line);
                text.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}

#[test]
fn the_curl_examples_of_docs_api_md_work() {
    curl_examples(Store::Local, "api.md", false, 10);
}

#[test]
fn s3_the_curl_examples_of_docs_api_md_work() {
    curl_examples(Store::s3(), "api.md", false, 10);
}

#[test]
fn the_curl_examples_of_docs_auth_md_work() {
    curl_examples(Store::Local, "auth.md", true, 6);
}

/// The root token of docs/auth.md's server, in `$NOVA_ROOT_TOKEN` for its examples.
const ROOT_TOKEN: &str = "docs-root-token-0123456789abcdef";

/// Runs the `sh` blocks of `docs/<page>` in order against a fresh server (with auth on
/// when `auth`), each compared with the block after it; at least `examples_min` run.
fn curl_examples(store: Store, page: &str, auth: bool, examples_min: usize) {
    if !have_curl() {
        eprintln!("curl is not installed: docs/{page}'s examples are not run");
        return;
    }
    let path = format!("{}/../docs/{page}", env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(&path).expect("the page");
    let dir = tempfile::tempdir().expect("tempdir");
    let root_file = dir.path().join("root-token");
    std::fs::write(&root_file, ROOT_TOKEN).expect("write the root token");
    let root_file = root_file.to_str().expect("a UTF-8 path").to_owned();
    let flags: &[&str] = if auth { &["--root-token-file", &root_file] } else { &[] };
    let nova = Nova::start_in(store, &dir.path().join("data"), flags, &[]);
    let prelude = if auth { format!("NOVA_ROOT_TOKEN={ROOT_TOKEN}\n") } else { String::new() };
    let blocks = blocks(&page);
    let mut ran = 0;
    for (i, (lang, text)) in blocks.iter().enumerate() {
        if lang != "sh" {
            continue;
        }
        let output =
            shell(&format!("{prelude}{}", text.replace("localhost:8080", &nova.server.authority)));
        ran += 1;
        match blocks.get(i + 1) {
            Some((lang, expected)) if lang == "json" => {
                let expected: Value =
                    serde_json::from_str(expected).expect("the page's json is json");
                let actual: Value = serde_json::from_str(&output)
                    .unwrap_or_else(|e| panic!("{text}: output is not json ({e}): {output}"));
                assert!(matches(&expected, &actual), "{text}\nexpected {expected}\ngot {actual}");
            }
            Some((lang, expected)) if lang == "text" => {
                let pattern: Vec<&str> = expected.trim_end().split("...").collect();
                let mut rest = output.as_str();
                for part in pattern {
                    let at = rest
                        .find(part)
                        .unwrap_or_else(|| panic!("{text}\nexpected {expected}\ngot {output}"));
                    rest = &rest[at + part.len()..];
                }
            }
            _ => {}
        }
    }
    assert!(ran >= examples_min, "the page has its examples ({ran} run)");
}
