//! The HTTP API of http-api.md over real sockets against a real `nova serve` child, once
//! on the local object directory (a server per case) and once on a real S3-protocol
//! server (one moto and one server for every case, in order).

#[macro_use]
mod common;

use std::io::BufRead;
use std::time::{Duration, Instant};

use common::{Nova, Store, have_curl, shell, wait_until};
use net::api::RECORDS_MEDIA_TYPE;
use net::client::{self, next_event};
use serde_json::{Value, json};

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("a temporary directory")
}

fn bodies(page: &Value) -> Vec<String> {
    page["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| r["body"].as_str().expect("a text body").to_owned())
        .collect()
}

fn seed_examples_work_verbatim_with_curl(nova: &Nova) {
    if !have_curl() {
        eprintln!("curl is not installed: the seed examples are covered by the other tests only");
        return;
    }
    let host = nova.server.authority.clone();
    let run = |command: &str| shell(&command.replace("localhost:8080", &host));
    // seeds/buckets.md
    let bucket: Value = serde_json::from_str(&run(
        r#"curl -s -X POST localhost:8080/v1/buckets/apps -d '{"create_stream_on_append":true}'"#,
    ))
    .expect("json");
    assert_eq!(bucket["name"], "apps");
    assert_eq!(bucket["create_stream_on_append"], true);
    let ack: Value = serde_json::from_str(&run(
        "curl -s -X POST localhost:8080/v1/streams/apps/orders%2Feu/records \\\n  -d '{\"records\":[{\"body\":\"hi\"}]}'",
    ))
    .expect("json");
    assert_eq!(ack["start"]["seq_num"], 0);
    assert_eq!(ack["end"]["seq_num"], 1);
    let list: Value =
        serde_json::from_str(&run("curl -s 'localhost:8080/v1/buckets?limit=50'")).expect("json");
    assert!(
        list["buckets"].as_array().expect("buckets").iter().any(|b| b["name"] == "apps"),
        "{list}"
    );
    // seeds/retention.md, with the buckets they assume.
    nova.ok("POST", "/v1/buckets/logs", None, 201);
    let stream: Value = serde_json::from_str(&run(
        r#"curl -s -X POST localhost:8080/v1/streams/logs/api -d '{"retention_max_age_ms":604800000}'"#,
    ))
    .expect("json");
    assert_eq!(stream["retention_max_age_ms"], 604_800_000);
    nova.ok("POST", "/v1/buckets/demo", None, 201);
    nova.ok("POST", "/v1/streams/demo/events", None, 201);
    assert_eq!(run("curl -s -X DELETE localhost:8080/v1/streams/demo/events"), "");
    nova.err("GET", "/v1/streams/demo/events", None, 404, "not_found");
    // The record the seed appended reads back.
    let page = nova.ok("GET", "/v1/streams/apps/orders%2Feu/records", None, 200);
    assert_eq!(bodies(&page), ["hi"]);
}

fn bucket_verbs_and_their_errors(nova: &Nova) {
    let created = nova.ok(
        "POST",
        "/v1/buckets/bv-alpha",
        Some(r#"{"creation_token":"t1","default_class":"express","location":"here"}"#),
        201,
    );
    assert_eq!(created["default_class"], "express");
    assert_eq!(created["location"], "here");
    assert_eq!(created["default_batch_max_bytes"], 8 << 20, "defaults are concrete");
    for field in [
        "name",
        "create_stream_on_read",
        "default_producer_policy",
        "default_timestamping_mode",
        "default_timestamping_uncapped",
        "default_retention_max_age_ms",
        "default_retention_max_bytes",
        "default_batch_max_records",
        "default_batch_max_delay_ms",
        "default_throughput_max_bytes_per_second",
        "created_at_ms",
    ] {
        assert!(created.get(field).is_some(), "bucket record lacks {field}: {created}");
    }
    // Same token and config converge; anything else is already_exists.
    let again = nova.ok(
        "POST",
        "/v1/buckets/bv-alpha",
        Some(r#"{"creation_token":"t1","default_class":"express","location":"here"}"#),
        200,
    );
    assert_eq!(again["created_at_ms"], created["created_at_ms"]);
    nova.err(
        "POST",
        "/v1/buckets/bv-alpha",
        Some(r#"{"creation_token":"t2"}"#),
        409,
        "already_exists",
    );
    nova.err("POST", "/v1/buckets/bv-alpha", None, 409, "already_exists");
    assert_eq!(nova.ok("GET", "/v1/buckets/bv-alpha", None, 200), created);
    // Update replaces the config; omitted defaults go back to the domain default.
    let updated =
        nova.ok("PUT", "/v1/buckets/bv-alpha", Some(r#"{"create_stream_on_read":true}"#), 200);
    assert_eq!(updated["create_stream_on_read"], true);
    assert_eq!(updated["default_class"], "standard");
    nova.ok("POST", "/v1/buckets/bv-beta", Some(""), 201);
    nova.ok("POST", "/v1/buckets/bv-gamma", None, 201);
    let page = nova.ok("GET", "/v1/buckets?limit=2&start_after=bv", None, 200);
    let names: Vec<&str> = page["buckets"]
        .as_array()
        .expect("buckets")
        .iter()
        .map(|b| b["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["bv-alpha", "bv-beta"]);
    assert_eq!(page["next"], "bv-beta");
    // A bucket after these, so the next page is never the last.
    nova.ok("POST", "/v1/buckets/zz-last", None, 201);
    let page = nova.ok("GET", "/v1/buckets?limit=1&start_after=bv-beta", None, 200);
    assert_eq!(page["buckets"][0]["name"], "bv-gamma");
    assert_eq!(page["next"], "bv-gamma");
    // The last page says so.
    let page = nova.ok("GET", "/v1/buckets?start_after=zz-last", None, 200);
    assert_eq!((page["buckets"].clone(), page["next"].clone()), (json!([]), json!("")));
    let page = nova.ok("GET", "/v1/buckets?start_after=zz", None, 200);
    assert_eq!(
        (page["buckets"][0]["name"].clone(), page["next"].clone()),
        (json!("zz-last"), json!(""))
    );
    // Errors name the field and the value.
    let bad = nova.err("POST", "/v1/buckets/Bad_Name", None, 400, "invalid_argument");
    assert!(bad["message"].as_str().expect("message").contains("Bad_Name"), "{bad}");
    let bad = nova.err(
        "POST",
        "/v1/buckets/bv-delta",
        Some(r#"{"default_clas":"express"}"#),
        400,
        "invalid_argument",
    );
    assert!(bad["message"].as_str().expect("message").contains("default_clas"), "{bad}");
    let bad = nova.err(
        "POST",
        "/v1/buckets/bv-delta",
        Some(r#"{"default_class":"fast"}"#),
        400,
        "invalid_argument",
    );
    assert!(bad["message"].as_str().expect("message").contains("default_class"), "{bad}");
    let bad = nova.err(
        "POST",
        "/v1/buckets/bv-delta",
        Some(r#"{"create_stream_on_append":"yes"}"#),
        400,
        "invalid_argument",
    );
    assert!(bad["message"].as_str().expect("message").contains("create_stream_on_append"), "{bad}");
    nova.err("POST", "/v1/buckets/bv-delta", Some("{not json"), 400, "invalid_argument");
    nova.err("POST", "/v1/buckets/bv-delta", Some("[1]"), 400, "invalid_argument");
    let bad = nova.err("GET", "/v1/buckets?limit=0", None, 400, "invalid_argument");
    assert!(bad["message"].as_str().expect("message").contains("limit"), "{bad}");
    let bad = nova.err("GET", "/v1/buckets?limt=3", None, 400, "invalid_argument");
    assert!(bad["message"].as_str().expect("message").contains("limt"), "{bad}");
    nova.err("GET", "/v1/buckets?limit=x", None, 400, "invalid_argument");
    nova.err("GET", "/v1/buckets/nope", None, 404, "not_found");
    // A bucket with a stream cannot be deleted.
    nova.ok("POST", "/v1/streams/bv-alpha/s", None, 201);
    nova.err("DELETE", "/v1/buckets/bv-alpha", None, 412, "failed_precondition");
    assert_eq!(nova.call("DELETE", "/v1/streams/bv-alpha/s", None).status, 204);
    let deleted = nova.call("DELETE", "/v1/buckets/bv-alpha", None);
    assert_eq!(deleted.status, 204);
    assert!(deleted.body.is_empty());
    nova.err("GET", "/v1/buckets/bv-alpha", None, 404, "not_found");
    nova.err("DELETE", "/v1/buckets/bv-alpha", None, 404, "not_found");
}

fn stream_verbs_and_their_errors(nova: &Nova) {
    nova.ok("POST", "/v1/buckets/shop", Some(r#"{"default_retention_max_age_ms":60000}"#), 201);
    let created = nova.ok(
        "POST",
        "/v1/streams/shop/orders%2Feu",
        Some(r#"{"class":"express","creation_token":"c1"}"#),
        201,
    );
    assert_eq!(created["key"], "orders/eu");
    assert_eq!(created["bucket"], "shop");
    assert_eq!(created["class"], "express");
    assert_eq!(created["retention_max_age_ms"], 60000, "copied from the bucket");
    let id = created["id"].as_str().expect("id");
    assert_eq!(id.len(), 32);
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
    nova.ok(
        "POST",
        "/v1/streams/shop/orders%2Feu",
        Some(r#"{"class":"express","creation_token":"c1"}"#),
        200,
    );
    nova.err("POST", "/v1/streams/shop/orders%2Feu", None, 409, "already_exists");
    let got = nova.ok("GET", "/v1/streams/shop/orders%2Feu", None, 200);
    assert_eq!(got["tail"], json!({"seq_num": 0, "timestamp": 0}));
    assert_eq!(got["trim_seq_num"], 0);
    assert_eq!(got["id"], created["id"]);
    // Reconfigure: present fields are set, 0 included.
    let patched = nova.ok(
        "PATCH",
        "/v1/streams/shop/orders%2Feu",
        Some(r#"{"class":"standard","retention_max_age_ms":0}"#),
        200,
    );
    assert_eq!(patched["class"], "standard");
    assert_eq!(patched["retention_max_age_ms"], 0);
    let bad = nova.err(
        "PATCH",
        "/v1/streams/shop/orders%2Feu",
        Some(r#"{"timestamping_mode":"arrival"}"#),
        400,
        "invalid_argument",
    );
    assert!(bad["message"].as_str().expect("message").contains("timestamping_mode"), "{bad}");
    nova.err(
        "PATCH",
        "/v1/streams/shop/orders%2Feu",
        Some(r#"{"klass":"x"}"#),
        400,
        "invalid_argument",
    );
    // Listing by prefix, in key order, with paging.
    nova.ok("POST", "/v1/streams/shop/orders%2Fus", None, 201);
    nova.ok("POST", "/v1/streams/shop/returns", None, 201);
    let page = nova.ok("GET", "/v1/streams/shop?prefix=orders%2F&limit=1", None, 200);
    assert_eq!(page["streams"][0]["key"], "orders/eu");
    assert_eq!(page["next"], "orders/eu");
    let page = nova.ok("GET", "/v1/streams/shop?prefix=orders/&start_after=orders%2Feu", None, 200);
    assert_eq!(page["streams"].as_array().expect("streams").len(), 1);
    assert_eq!(page["streams"][0]["key"], "orders/us");
    assert_eq!(page["next"], "");
    nova.err("GET", "/v1/streams/nobucket", None, 404, "not_found");
    // Delete: 204, again 204, never existed 404.
    let deleted = nova.call("DELETE", "/v1/streams/shop/returns", None);
    assert_eq!((deleted.status, deleted.body.len()), (204, 0));
    assert_eq!(nova.call("DELETE", "/v1/streams/shop/returns", None).status, 204);
    nova.err("DELETE", "/v1/streams/shop/never", None, 404, "not_found");
    nova.err("GET", "/v1/streams/shop/returns", None, 404, "not_found");
    // Observing verbs never create.
    nova.err("GET", "/v1/streams/shop/ghost/tail", None, 404, "not_found");
    nova.err("POST", "/v1/streams/shop/ghost/trim", Some(r#"{"seq_num":1}"#), 404, "not_found");
    nova.err(
        "POST",
        "/v1/streams/shop/ghost/fence",
        Some(r#"{"fencing_token":"a"}"#),
        404,
        "not_found",
    );
    // Bad keys, routes and methods.
    let bad = nova.err("GET", "/v1/streams/shop/%FF", None, 400, "invalid_argument");
    assert!(bad["message"].as_str().expect("message").contains("UTF-8"), "{bad}");
    nova.err("GET", "/v1/streams/shop/a%01b", None, 400, "invalid_argument");
    nova.err("GET", "/v1/nothing", None, 404, "not_found");
    let wrong = nova.call("PUT", "/v1/streams/shop/orders%2Feu", None);
    assert_eq!(wrong.status, 405);
    assert!(wrong.header("allow").is_some_and(|a| a.contains("PATCH")));
    nova.err("GET", "/v1/streams/shop/ghost/plan?seq_num=0", None, 404, "not_found");
}

fn append_read_and_their_conditions(nova: &Nova) {
    nova.ok("POST", "/v1/buckets/bb1", Some(r#"{"default_class":"express"}"#), 201);
    nova.ok("POST", "/v1/streams/bb1/s", None, 201);
    let ack = nova.ok(
        "POST",
        "/v1/streams/bb1/s/records",
        Some(r#"{"records":[{"body":"a","headers":[["k","v"],["k","w"]],"timestamp":5},{"body":""}]}"#),
        200,
    );
    assert_eq!(ack["start"]["seq_num"], 0);
    assert_eq!(ack["end"]["seq_num"], 2);
    assert_eq!(ack["tail"]["seq_num"], 2);
    let stamp = ack["start"]["timestamp"].clone();
    assert_eq!(stamp, 5, "the offered stamp is below arrival, so it is kept");
    let page = nova.ok("GET", "/v1/streams/bb1/s/records?seq_num=0", None, 200);
    assert_eq!(
        page["records"][0],
        json!({"seq_num": 0, "timestamp": 5, "headers": [["k", "v"], ["k", "w"]], "body": "a"})
    );
    assert_eq!(page["records"][1]["body"], "");
    assert_eq!(page["next_seq_num"], 2);
    assert_eq!(page["tail"]["seq_num"], 2);
    for i in 2..10 {
        nova.ok(
            "POST",
            "/v1/streams/bb1/s/records",
            Some(&format!(r#"{{"records":[{{"body":"r{i}"}}]}}"#)),
            200,
        );
    }
    // Bounds and starts.
    let page = nova.ok("GET", "/v1/streams/bb1/s/records?seq_num=2&count=3", None, 200);
    assert_eq!(bodies(&page), ["r2", "r3", "r4"]);
    assert_eq!(page["next_seq_num"], 5);
    let page = nova.ok("GET", "/v1/streams/bb1/s/records?seq_num=2&bytes=5", None, 200);
    assert_eq!(bodies(&page), ["r2", "r3"]);
    let page = nova.ok("GET", "/v1/streams/bb1/s/records?seq_num=2&bytes=1", None, 200);
    assert_eq!(bodies(&page), ["r2"], "the first record is returned even when larger");
    let page = nova.ok("GET", "/v1/streams/bb1/s/records?tail_offset=2", None, 200);
    assert_eq!(bodies(&page), ["r8", "r9"]);
    let page = nova.ok("GET", "/v1/streams/bb1/s/records?tail_offset=100&count=1", None, 200);
    assert_eq!(page["records"][0]["seq_num"], 0);
    let page = nova.ok("GET", "/v1/streams/bb1/s/records?timestamp=6&count=1", None, 200);
    assert_eq!(page["records"][0]["seq_num"], 2);
    let page = nova.ok("GET", "/v1/streams/bb1/s/records?seq_num=0&until=6", None, 200);
    assert_eq!(page["records"].as_array().expect("records").len(), 2);
    // Timestamps are int64: stored stamps are never below 0, so a negative start is the
    // first record and a negative until reaches nothing.
    let page = nova.ok("GET", "/v1/streams/bb1/s/records?timestamp=-5&count=1", None, 200);
    assert_eq!(page["records"][0]["seq_num"], 0);
    let page = nova.ok("GET", "/v1/streams/bb1/s/records?seq_num=0&until=-1", None, 200);
    assert_eq!(page["records"], json!([]));
    let bad =
        nova.err("GET", "/v1/streams/bb1/s/records?timestamp=1.5", None, 400, "invalid_argument");
    let message = bad["message"].as_str().expect("message");
    assert!(message.contains("timestamp") && message.contains(&i64::MAX.to_string()), "{bad}");
    let page = nova.ok("GET", "/v1/streams/bb1/s/records?seq_num=10", None, 200);
    assert_eq!(page["records"], json!([]), "a start at the tail is an empty page");
    let past = nova.err("GET", "/v1/streams/bb1/s/records?seq_num=11", None, 416, "out_of_range");
    assert_eq!(past["tail"]["seq_num"], 10);
    let page = nova.ok("GET", "/v1/streams/bb1/s/records?seq_num=11&clamp=true", None, 200);
    assert_eq!((page["records"].clone(), page["next_seq_num"].clone()), (json!([]), json!(10)));
    nova.err("GET", "/v1/streams/bb1/s/records?count=0", None, 400, "invalid_argument");
    nova.err("GET", "/v1/streams/bb1/s/records?bytes=0", None, 400, "invalid_argument");
    let bad = nova.err("GET", "/v1/streams/bb1/s/records?wait=61", None, 400, "invalid_argument");
    assert!(bad["message"].as_str().expect("message").contains("wait"), "{bad}");
    // Not a whole number: the message names wait's own range, not a u64's.
    let bad = nova.err("GET", "/v1/streams/bb1/s/records?wait=1.5", None, 400, "invalid_argument");
    let message = bad["message"].as_str().expect("message");
    assert!(message.contains("wait") && message.contains("0 to 60"), "{bad}");
    nova.err(
        "GET",
        "/v1/streams/bb1/s/records?seq_num=1&timestamp=1",
        None,
        400,
        "invalid_argument",
    );
    nova.err("GET", "/v1/streams/bb1/s/records?seq_num=-1", None, 400, "invalid_argument");
    // Numbers are digits (a minus sign only for times): not "+5", " 5" or empty.
    for query in ["count=%2B5", "count=%205", "count=", "seq_num=0x1", "timestamp=%2B5", "until=-"]
    {
        nova.err(
            "GET",
            &format!("/v1/streams/bb1/s/records?{query}"),
            None,
            400,
            "invalid_argument",
        );
    }
    nova.err("GET", "/v1/streams/bb1/s/records?sequence=1", None, 400, "invalid_argument");
    // Appends: malformed, unknown fields, conditions.
    nova.err(
        "POST",
        "/v1/streams/bb1/s/records",
        Some(r#"{"records":[]}"#),
        400,
        "invalid_argument",
    );
    nova.err("POST", "/v1/streams/bb1/s/records", Some(r#"{}"#), 400, "invalid_argument");
    let bad = nova.err(
        "POST",
        "/v1/streams/bb1/s/records",
        Some(r#"{"records":[{"body":1}]}"#),
        400,
        "invalid_argument",
    );
    assert!(bad["message"].as_str().expect("message").contains("records[0].body"), "{bad}");
    let bad = nova.err(
        "POST",
        "/v1/streams/bb1/s/records",
        Some(r#"{"records":[{"body":"x","headers":[["","v"]]}]}"#),
        400,
        "invalid_argument",
    );
    assert!(bad["message"].as_str().expect("message").contains("name"), "{bad}");
    // A condition named twice is refused, not read as its last value (which would pass).
    let bad = nova.err(
        "POST",
        "/v1/streams/bb1/s/records",
        Some(r#"{"records":[{"body":"x"}],"match_seq_num":10,"match_seq_num":3}"#),
        400,
        "invalid_argument",
    );
    assert!(bad["message"].as_str().expect("message").contains("\"match_seq_num\" twice"), "{bad}");
    let mismatch = nova.err(
        "POST",
        "/v1/streams/bb1/s/records",
        Some(r#"{"records":[{"body":"x"}],"match_seq_num":3}"#),
        412,
        "failed_precondition",
    );
    assert_eq!(mismatch["next_seq_num"], 10);
    nova.ok(
        "POST",
        "/v1/streams/bb1/s/records",
        Some(r#"{"records":[{"body":"x"}],"match_seq_num":10}"#),
        200,
    );
    // Fencing.
    let fenced = nova.ok("POST", "/v1/streams/bb1/s/fence", Some(r#"{"fencing_token":"f1"}"#), 200);
    assert_eq!(fenced["tail"]["seq_num"], 11);
    let refused = nova.err(
        "POST",
        "/v1/streams/bb1/s/records",
        Some(r#"{"records":[{"body":"x"}],"fencing_token":"f0"}"#),
        412,
        "failed_precondition",
    );
    assert_eq!(refused["fencing_token"], "f1");
    nova.ok(
        "POST",
        "/v1/streams/bb1/s/records",
        Some(r#"{"records":[{"body":"x"}],"fencing_token":"f1"}"#),
        200,
    );
    let refused = nova.err(
        "POST",
        "/v1/streams/bb1/s/fence",
        Some(r#"{"fencing_token":"f2","expected":"nope"}"#),
        412,
        "failed_precondition",
    );
    assert_eq!(refused["fencing_token"], "f1");
    nova.ok(
        "POST",
        "/v1/streams/bb1/s/fence",
        Some(r#"{"fencing_token":"f2","expected":"f1"}"#),
        200,
    );
    let long = "t".repeat(37);
    let bad = nova.err(
        "POST",
        "/v1/streams/bb1/s/records",
        Some(&format!(r#"{{"records":[{{"body":"x"}}],"fencing_token":"{long}"}}"#)),
        400,
        "invalid_argument",
    );
    assert!(bad["message"].as_str().expect("message").contains("36"), "{bad}");
    nova.err("POST", "/v1/streams/bb1/s/fence", Some("{}"), 400, "invalid_argument");
    // Tail and trim.
    let tail = nova.ok("GET", "/v1/streams/bb1/s/tail", None, 200);
    assert_eq!(tail["tail"]["seq_num"], 12);
    let before_every_record = Some(r#"{"timestamp":-5}"#);
    assert_eq!(
        nova.ok("POST", "/v1/streams/bb1/s/trim", before_every_record, 200)["trim_seq_num"],
        0,
        "nothing is older than a negative timestamp"
    );
    assert_eq!(
        nova.ok("POST", "/v1/streams/bb1/s/trim", Some(r#"{"seq_num":3}"#), 200)["trim_seq_num"],
        3
    );
    assert_eq!(
        nova.ok("POST", "/v1/streams/bb1/s/trim", Some(r#"{"seq_num":1}"#), 200)["trim_seq_num"],
        3,
        "only forward"
    );
    let page = nova.ok("GET", "/v1/streams/bb1/s/records?seq_num=0&count=1", None, 200);
    assert_eq!(page["records"][0]["seq_num"], 3, "a start below the watermark begins at it");
    assert_eq!(
        nova.ok("POST", "/v1/streams/bb1/s/trim", Some(r#"{"seq_num":99}"#), 200)["trim_seq_num"],
        12,
        "clamped to the tail"
    );
    nova.err(
        "POST",
        "/v1/streams/bb1/s/trim",
        Some(r#"{"seq_num":1,"timestamp":1}"#),
        400,
        "invalid_argument",
    );
    assert_eq!(nova.ok("GET", "/v1/streams/bb1/s", None, 200)["trim_seq_num"], 12);
    // Autocreate on append only when the bucket says so.
    nova.err(
        "POST",
        "/v1/streams/bb1/new/records",
        Some(r#"{"records":[{"body":"x"}]}"#),
        404,
        "not_found",
    );
}

fn throughput_cap_answers_resource_exhausted_with_retry_after(nova: &Nova) {
    nova.ok("POST", "/v1/buckets/slow", None, 201);
    nova.ok(
        "POST",
        "/v1/streams/slow/s",
        Some(r#"{"throughput_max_bytes_per_second":1000,"class":"express"}"#),
        201,
    );
    let record = "x".repeat(900);
    let body = format!(r#"{{"records":[{{"body":"{record}"}},{{"body":"{record}"}}]}}"#);
    let mut refused = None;
    for _ in 0..10 {
        let response = nova.call("POST", "/v1/streams/slow/s/records", Some(&body));
        if response.status == 429 {
            refused = Some(response);
            break;
        }
        assert_eq!(response.status, 200, "{}", response.text());
    }
    let refused = refused.expect("the cap refuses within 10 batches of 1.8 KB at 1 KB/s");
    assert_eq!(refused.json()["code"], "resource_exhausted");
    let retry: u64 = refused.header("retry-after").expect("Retry-After").parse().expect("seconds");
    assert!(retry >= 1);
}

/// The shared servers run with `--http-body-bytes-max 1MiB` (the binary framing) and
/// `--http-json-body-bytes-max 4MiB`.
fn request_bodies_over_the_limit_are_refused_before_they_are_read(nova: &Nova) {
    nova.ok("POST", "/v1/buckets/big", Some(r#"{"create_stream_on_append":true}"#), 201);
    // Refused from Content-Length, before any byte of the body is sent.
    let refused_from_length = |content_type: &str, len: u64| -> String {
        use std::io::{Read as _, Write as _};
        let address = nova.url.trim_start_matches("http://");
        let mut stream = std::net::TcpStream::connect(address).expect("connect");
        let head = format!(
            "POST /v1/streams/big/s/records HTTP/1.1\r\nhost: nova\r\nconnection: close\r\n\
             content-type: {content_type}\r\ncontent-length: {len}\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).expect("send the head");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).expect("an answer");
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        answer
    };
    let answer = refused_from_length("application/json", (4 << 20) + 1);
    assert!(
        answer.contains("4194304") && answer.contains("--http-json-body-bytes-max"),
        "{answer}"
    );
    let answer = refused_from_length("application/x-nova-records", (1 << 20) + 1);
    assert!(answer.contains("1048576") && answer.contains("--http-body-bytes-max"), "{answer}");
    // Encoding overhead never counts (limits.md): 600 KiB of content written as \u0001
    // escapes is 3.6 MiB of JSON, over the binary framing's limit, and a valid batch.
    let escaped = format!(r#"{{"records":[{{"body":"{}"}}]}}"#, "\\u0001".repeat(600 << 10));
    assert!(escaped.len() > 3 << 20);
    let ack = nova.ok("POST", "/v1/streams/big/e/records", Some(&escaped), 200);
    assert_eq!(ack["end"]["seq_num"], 1, "{ack}");
    let page =
        nova.call_with("GET", "/v1/streams/big/e/records", &[("nova-encoding", "base64")], None);
    assert_eq!(page.status, 200);
    let encoded = page.json()["records"][0]["body"].as_str().expect("a body").to_owned();
    use base64::Engine as _;
    let content = base64::engine::general_purpose::STANDARD.decode(encoded).expect("base64");
    assert_eq!(content, vec![1u8; 600 << 10]);
    // Chunked, so no Content-Length says it up front.
    if have_curl() {
        let body = format!(r#"{{"records":[{{"body":"{}"}}]}}"#, "x".repeat((4 << 20) + 1));
        let dir = tempdir();
        let path = dir.path().join("body.json");
        std::fs::write(&path, &body).expect("write body");
        let out = shell(&format!(
            "curl -s -H 'Transfer-Encoding: chunked' --data-binary @{} {}/v1/streams/big/s/records",
            path.display(),
            nova.url
        ));
        let refused: Value = serde_json::from_str(&out).expect("json");
        assert_eq!(refused["code"], "invalid_argument", "{out}");
    }
    nova.ok("POST", "/v1/streams/big/s/records", Some(r#"{"records":[{"body":"small"}]}"#), 200);
}

fn base64_round_trips_all_256_byte_values(nova: &Nova) {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    nova.ok("POST", "/v1/buckets/bin", Some(r#"{"create_stream_on_append":true}"#), 201);
    let all: Vec<u8> = (0..=255).collect();
    let body = json!({"records": [{"body": b64.encode(&all), "headers": [[b64.encode(&all[1..]), b64.encode(&all)]]}]});
    let encoded = [("nova-encoding", "base64")];
    let ack = nova.call_with(
        "POST",
        "/v1/streams/bin/s/records",
        &encoded,
        Some(body.to_string().as_bytes()),
    );
    assert_eq!(ack.status, 200, "{}", ack.text());
    let page = nova.call_with("GET", "/v1/streams/bin/s/records", &encoded, None);
    assert_eq!(page.status, 200, "{}", page.text());
    let record = &page.json()["records"][0];
    assert_eq!(b64.decode(record["body"].as_str().expect("body")).expect("base64"), all);
    assert_eq!(
        b64.decode(record["headers"][0][0].as_str().expect("name")).expect("base64"),
        &all[1..]
    );
    assert_eq!(b64.decode(record["headers"][0][1].as_str().expect("value")).expect("base64"), all);
    // Without base64, the page is refused, not mangled.
    let refused = nova.err("GET", "/v1/streams/bin/s/records", None, 400, "invalid_argument");
    assert!(refused["message"].as_str().expect("message").contains("base64"), "{refused}");
    // Records before one that is not UTF-8 are read: the page ends before it, and the
    // read from it is refused, naming it. A subscription likewise delivers them, then
    // ends with the error.
    nova.ok("POST", "/v1/buckets/bint", Some(r#"{"create_stream_on_append":true}"#), 201);
    for (i, body) in ["t0", "t1"].iter().enumerate() {
        let append = json!({"records": [{"body": b64.encode(body)}]}).to_string();
        let ack =
            nova.call_with("POST", "/v1/streams/bint/s/records", &encoded, Some(append.as_bytes()));
        assert_eq!(ack.json()["start"]["seq_num"], i, "{}", ack.text());
    }
    let ack = nova.call_with(
        "POST",
        "/v1/streams/bint/s/records",
        &encoded,
        Some(body.to_string().as_bytes()),
    );
    assert_eq!(ack.json()["start"]["seq_num"], 2, "{}", ack.text());
    let page = nova.ok("GET", "/v1/streams/bint/s/records?seq_num=0", None, 200);
    assert_eq!(
        (bodies(&page), &page["next_seq_num"]),
        (vec!["t0".to_owned(), "t1".to_owned()], &json!(2))
    );
    let refused =
        nova.err("GET", "/v1/streams/bint/s/records?seq_num=2", None, 400, "invalid_argument");
    assert!(
        refused["message"].as_str().expect("message").contains("record 2 (a header name)"),
        "{refused}"
    );
    let mut stream = subscribe(nova, "bint", "seq_num=0", &[]);
    let batch = event(&mut stream);
    assert_eq!(batch.event, "batch");
    assert_eq!(bodies(&serde_json::from_str(&batch.data).expect("json")), ["t0", "t1"]);
    let error = event(&mut stream);
    assert_eq!(error.event, "error");
    assert!(error.data.contains("record 2 (a header name)"), "{}", error.data);
    let bad = nova.call_with(
        "POST",
        "/v1/streams/bin/s/records",
        &encoded,
        Some(br#"{"records":[{"body":"***"}]}"#),
    );
    assert_eq!(bad.status, 400);
    assert!(bad.json()["message"].as_str().expect("message").contains("records[0].body"));
    let bad = nova.call_with("GET", "/v1/streams/bin/s/records", &[("nova-encoding", "hex")], None);
    assert_eq!(bad.status, 400);
}

fn concurrent_producers_batches_stay_contiguous(nova: &Nova) {
    nova.express_bucket("cop");
    const PRODUCERS: usize = 4;
    const BATCHES: usize = 15;
    const BATCH: usize = 5;
    let acks: Vec<Vec<(u64, u64, usize, usize)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let nova = &nova;
                scope.spawn(move || {
                    (0..BATCHES)
                        .map(|b| {
                            let records: Vec<Value> = (0..BATCH)
                                .map(|r| json!({"body": format!("{p}-{b}-{r}")}))
                                .collect();
                            let ack = nova.ok(
                                "POST",
                                "/v1/streams/cop/s/records",
                                Some(&json!({"records": records}).to_string()),
                                200,
                            );
                            let start = ack["start"]["seq_num"].as_u64().expect("start");
                            let end = ack["end"]["seq_num"].as_u64().expect("end");
                            (start, end, p, b)
                        })
                        .collect()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("producer")).collect()
    });
    let mut all: Vec<(u64, u64, usize, usize)> = acks.into_iter().flatten().collect();
    all.sort();
    let mut next = 0;
    for (start, end, ..) in &all {
        assert_eq!((*start, *end), (next, next + BATCH as u64), "acks tile the stream");
        next = *end;
    }
    let mut read = Vec::new();
    while read.len() < PRODUCERS * BATCHES * BATCH {
        let page =
            nova.ok("GET", &format!("/v1/streams/cop/s/records?seq_num={}", read.len()), None, 200);
        read.extend(bodies(&page));
    }
    for (start, _, p, b) in &all {
        for r in 0..BATCH {
            assert_eq!(
                read[*start as usize + r],
                format!("{p}-{b}-{r}"),
                "batch {p}-{b} is contiguous"
            );
        }
    }
}

fn long_poll_returns_when_records_arrive(nova: &Nova) {
    nova.ok("POST", "/v1/buckets/lpo", Some(r#"{"default_class":"express"}"#), 201);
    nova.ok("POST", "/v1/streams/lpo/s", None, 201);
    // An empty wait holds at least its time, then answers empty.
    let started = Instant::now();
    let page = nova.ok("GET", "/v1/streams/lpo/s/records?seq_num=0&wait=1", None, 200);
    assert!(started.elapsed() >= Duration::from_millis(950), "{:?}", started.elapsed());
    assert_eq!(page["records"], json!([]));
    let started = Instant::now();
    let page = std::thread::scope(|scope| {
        let poll = scope
            .spawn(|| nova.ok("GET", "/v1/streams/lpo/s/records?seq_num=0&wait=30", None, 200));
        nova.ok("POST", "/v1/streams/lpo/s/records", Some(r#"{"records":[{"body":"late"}]}"#), 200);
        poll.join().expect("poll")
    });
    assert_eq!(bodies(&page), ["late"]);
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
    // A poll from the tail (a tail offset, or a start past it with clamp) gets what arrives
    // while it waits, though the tail then moves past where it began.
    for (query, body) in [("tail_offset=0", "from-tail"), ("seq_num=1000&clamp=true", "clamped")] {
        let waiting = nova.metric("nova_shard_reads_waiting");
        let page = std::thread::scope(|scope| {
            let path = format!("/v1/streams/lpo/s/records?{query}&wait=30");
            let poll = scope.spawn(move || nova.ok("GET", &path, None, 200));
            while nova.metric("nova_shard_reads_waiting") <= waiting {
                std::thread::yield_now();
            }
            let append = format!(r#"{{"records":[{{"body":"{body}"}}]}}"#);
            nova.ok("POST", "/v1/streams/lpo/s/records", Some(&append), 200);
            poll.join().expect("poll")
        });
        assert_eq!(bodies(&page), [body], "{query}");
    }
}

/// A read from the tail bounded by an `until` at or below the last stamp is complete at
/// once: stamps never decrease, so every record still to come is stamped at or after it.
fn a_read_from_the_tail_until_its_last_stamp_is_complete_at_once(nova: &Nova) {
    use engine::framing::Frame;
    nova.ok("POST", "/v1/buckets/lpu", Some(r#"{"default_class":"express"}"#), 201);
    nova.ok("POST", "/v1/streams/lpu/s", None, 201);
    let ack =
        nova.ok("POST", "/v1/streams/lpu/s/records", Some(r#"{"records":[{"body":"a"}]}"#), 200);
    let stamp = ack["end"]["timestamp"].as_u64().expect("a stamp");
    let started = Instant::now();
    let query = format!("tail_offset=0&until={stamp}");
    let page = nova.ok("GET", &format!("/v1/streams/lpu/s/records?{query}&wait=60"), None, 200);
    assert_eq!((page["records"].clone(), page["next_seq_num"].clone()), (json!([]), json!(1)));
    assert!(started.elapsed() < Duration::from_secs(30), "waited {:?}", started.elapsed());
    // A subscription ends before its first heartbeat (every 200 ms here), in both wires.
    let mut stream = subscribe(nova, "lpu", &query, &[]);
    assert_eq!(event(&mut stream).event, "end");
    let mut stream = subscribe_binary(nova, "lpu", &query);
    assert_eq!(binary_frame(&mut stream), Frame::End);
    // An `until` above the last stamp is not reached: a record may still be stamped below it.
    let later = format!("tail_offset=0&until={}", stamp + 1);
    let mut stream = subscribe(nova, "lpu", &later, &[]);
    assert_eq!(event(&mut stream).event, "ping");
}

/// An SSE subscription to stream `s` of `bucket`.
fn subscribe(
    nova: &Nova,
    bucket: &str,
    query: &str,
    headers: &[(&str, &str)],
) -> client::Streaming {
    open_subscription(nova, bucket, query, "text/event-stream", headers)
}

/// A subscription to stream `s` of `bucket` that accepts `accept`, checked to answer 200
/// with that media type.
fn open_subscription(
    nova: &Nova,
    bucket: &str,
    query: &str,
    accept: &str,
    headers: &[(&str, &str)],
) -> client::Streaming {
    let mut all = vec![("accept", accept)];
    all.extend_from_slice(headers);
    let stream = client::open(
        &nova.server,
        "GET",
        &format!("/v1/streams/{bucket}/s/records?{query}"),
        &all,
        None,
        Some(Duration::from_secs(30)),
    )
    .expect("subscribe");
    assert_eq!(stream.status, 200);
    let media_type = accept.split(';').next().expect("a media type");
    assert_eq!(stream.header("content-type"), Some(media_type));
    stream
}

fn event(stream: &mut client::Streaming) -> client::Event {
    next_event(&mut stream.body).expect("read an event").expect("an event before the end")
}

/// The shared servers send a heartbeat every 200 ms.
fn subscription_delivers_history_then_live_records_and_ends(nova: &Nova) {
    nova.ok("POST", "/v1/buckets/sub1", Some(r#"{"default_class":"express"}"#), 201);
    nova.ok("POST", "/v1/streams/sub1/s", None, 201);
    let append = |bodies: &[&str]| {
        let records: Vec<Value> = bodies.iter().map(|b| json!({"body": b})).collect();
        nova.ok(
            "POST",
            "/v1/streams/sub1/s/records",
            Some(&json!({"records": records}).to_string()),
            200,
        );
    };
    append(&["h0", "h1", "h2"]);
    let mut stream = subscribe(nova, "sub1", "seq_num=0", &[]);
    let first = event(&mut stream);
    assert_eq!((first.event.as_str(), first.id.as_deref()), ("batch", Some("2")));
    let data: Value = serde_json::from_str(&first.data).expect("json");
    assert_eq!(bodies(&data), ["h0", "h1", "h2"]);
    assert_eq!(data["tail"]["seq_num"], 3);
    // Idle: a ping with the tail.
    let ping = event(&mut stream);
    assert_eq!(ping.event, "ping");
    assert_eq!(serde_json::from_str::<Value>(&ping.data).expect("json")["tail"]["seq_num"], 3);
    // Live records follow with no gap and no duplicate.
    append(&["l3", "l4"]);
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let next = event(&mut stream);
        if next.event == "batch" {
            let data: Value = serde_json::from_str(&next.data).expect("json");
            seen.extend(bodies(&data));
            assert_eq!(next.id.as_deref(), Some((2 + seen.len()).to_string().as_str()));
        }
    }
    assert_eq!(seen, ["l3", "l4"]);
    // Deleting the stream ends the subscription with not_found.
    assert_eq!(nova.call("DELETE", "/v1/streams/sub1/s", None).status, 204);
    let end = loop {
        let next = event(&mut stream);
        if next.event != "ping" {
            break next;
        }
    };
    assert_eq!(end.event, "error");
    assert_eq!(serde_json::from_str::<Value>(&end.data).expect("json")["code"], "not_found");
    assert!(next_event(&mut stream.body).expect("read").is_none(), "the stream closes");
}

fn subscription_resumes_after_last_event_id_and_ends_at_a_bound(nova: &Nova) {
    nova.ok("POST", "/v1/buckets/sub2", Some(r#"{"default_class":"express"}"#), 201);
    nova.ok("POST", "/v1/streams/sub2/s", None, 201);
    for i in 0..6 {
        nova.ok(
            "POST",
            "/v1/streams/sub2/s/records",
            Some(&format!(r#"{{"records":[{{"body":"r{i}"}}]}}"#)),
            200,
        );
    }
    // Last-Event-ID wins over seq_num; count bounds the whole subscription.
    let mut stream = subscribe(nova, "sub2", "seq_num=0&count=2", &[("last-event-id", "2")]);
    let batch = event(&mut stream);
    assert_eq!(batch.event, "batch");
    let data: Value = serde_json::from_str(&batch.data).expect("json");
    assert_eq!(bodies(&data), ["r3", "r4"]);
    assert_eq!(batch.id.as_deref(), Some("4"));
    assert_eq!(event(&mut stream).event, "end");
    assert!(next_event(&mut stream.body).expect("read").is_none());
    // A start past the tail is an HTTP error before any event.
    let past = client::open(
        &nova.server,
        "GET",
        "/v1/streams/sub2/s/records?seq_num=99",
        &[("accept", "text/event-stream")],
        None,
        None,
    )
    .expect("request");
    assert_eq!(past.status, 416);
    let past = past.finish().expect("body");
    assert_eq!(past.json()["tail"]["seq_num"], 6);
    // Resuming after the last sequence number there can be is past the tail too: the
    // position after it does not wrap to 0, in either wire.
    for accept in ["text/event-stream", "application/x-nova-records; subscribe=true"] {
        let last = u64::MAX.to_string();
        let headers = [("accept", accept), ("last-event-id", last.as_str())];
        let path = "/v1/streams/sub2/s/records?seq_num=0";
        let past = client::open(&nova.server, "GET", path, &headers, None, None).expect("request");
        assert_eq!(past.status, 416, "{accept}");
        let past = past.finish().expect("body").json();
        assert_eq!((&past["code"], &past["tail"]["seq_num"]), (&json!("out_of_range"), &json!(6)));
    }
    let mut body = String::new();
    let mut stream = subscribe(nova, "sub2", "seq_num=5&count=1", &[]);
    while stream.body.read_line(&mut body).expect("read") > 0 {}
    assert!(body.contains("event: batch\nid: 5\n"), "{body}");
    assert!(body.ends_with("\n\n") && body.contains("event: end"), "{body}");
}

/// Creates the express stream `<bucket>/s` holding `aaa`, `bbb`, `ccc` appended as one
/// batch, then `ddd` and `eee` each alone: 3 content bytes a record.
fn create_three_then_two(nova: &Nova, bucket: &str) {
    nova.ok("POST", &format!("/v1/buckets/{bucket}"), Some(r#"{"default_class":"express"}"#), 201);
    nova.ok("POST", &format!("/v1/streams/{bucket}/s"), None, 201);
    for batch in [&["aaa", "bbb", "ccc"][..], &["ddd"], &["eee"]] {
        append_bodies(nova, bucket, batch);
    }
}

fn append_bodies(nova: &Nova, bucket: &str, bodies: &[&str]) {
    let records: Vec<Value> = bodies.iter().map(|b| json!({"body": b})).collect();
    let body = json!({"records": records}).to_string();
    nova.ok("POST", &format!("/v1/streams/{bucket}/s/records"), Some(&body), 200);
}

fn owned(records: &[(u64, &str)]) -> Vec<(u64, String)> {
    records.iter().map(|&(seq_num, body)| (seq_num, body.to_owned())).collect()
}

/// Reads an SSE subscription to its end: the records of its `batch` events (pings are
/// skipped), and the data of the `end` event, after which the stream must close.
fn sse_records_then_end(stream: &mut client::Streaming) -> (Vec<(u64, String)>, Value) {
    let mut seen = Vec::new();
    loop {
        let next = event(stream);
        let data: Value = serde_json::from_str(&next.data).expect("json");
        match next.event.as_str() {
            "batch" => seen.extend(data["records"].as_array().expect("records").iter().map(|r| {
                let seq_num = r["seq_num"].as_u64().expect("a seq_num");
                (seq_num, r["body"].as_str().expect("a text body").to_owned())
            })),
            "ping" => {}
            "end" => {
                assert!(next_event(&mut stream.body).expect("read").is_none(), "closes at end");
                return (seen, data);
            }
            other => panic!("unexpected event {other}: {data}"),
        }
    }
}

/// `bytes` bounds the whole subscription (decisions.md), not each page: only its first
/// record may alone exceed the budget, and a record that does not fit what is left ends
/// the subscription before it, in history and at the live tail alike.
fn subscription_bytes_bound_the_whole_subscription(nova: &Nova) {
    create_three_then_two(nova, "subb");
    // aaa fits 4; bbb does not fit the 1 left.
    let mut stream = subscribe(nova, "subb", "seq_num=0&bytes=4", &[]);
    let (seen, end) = sse_records_then_end(&mut stream);
    assert_eq!(seen, owned(&[(0, "aaa")]));
    assert_eq!((end["next_seq_num"].as_u64(), end["tail"]["seq_num"].as_u64()), (Some(1), Some(5)));
    // ccc, then ddd (another chunk), fit 7; eee does not fit the 1 left.
    let mut stream = subscribe(nova, "subb", "seq_num=2&bytes=7", &[]);
    let (seen, end) = sse_records_then_end(&mut stream);
    assert_eq!(seen, owned(&[(2, "ccc"), (3, "ddd")]));
    assert_eq!(end["next_seq_num"], 4);
    // The first record is delivered though alone it exceeds the budget.
    let mut stream = subscribe(nova, "subb", "seq_num=0&bytes=2", &[]);
    let (seen, end) = sse_records_then_end(&mut stream);
    assert_eq!(seen, owned(&[(0, "aaa")]));
    assert_eq!(end["next_seq_num"], 1);
    // At the live tail: fff fits 4; ggg does not fit the 1 left.
    let mut stream = subscribe(nova, "subb", "seq_num=5&bytes=4", &[]);
    assert_eq!(event(&mut stream).event, "ping", "idle at the tail");
    append_bodies(nova, "subb", &["fff"]);
    let batch = loop {
        let next = event(&mut stream);
        if next.event != "ping" {
            break next;
        }
    };
    assert_eq!((batch.event.as_str(), batch.id.as_deref()), ("batch", Some("5")));
    append_bodies(nova, "subb", &["ggg"]);
    let (seen, end) = sse_records_then_end(&mut stream);
    assert_eq!(seen, []);
    assert_eq!((end["next_seq_num"].as_u64(), end["tail"]["seq_num"].as_u64()), (Some(6), Some(7)));
    // At the live tail, a first record larger than the budget is delivered, then it ends.
    let mut stream = subscribe(nova, "subb", "seq_num=7&bytes=2", &[]);
    assert_eq!(event(&mut stream).event, "ping", "idle at the tail");
    append_bodies(nova, "subb", &["hhh"]);
    let (seen, end) = sse_records_then_end(&mut stream);
    assert_eq!(seen, owned(&[(7, "hhh")]));
    assert_eq!(end["next_seq_num"], 8);
}

/// What an append session's answer said, frame by frame.
#[derive(Debug, PartialEq)]
enum Said {
    Ack { start: u64, end: u64 },
    Error(Value),
    End,
}

/// The request `Content-Type` (and the answer's) of an append session.
const SESSION_MEDIA: &str = "application/x-nova-records; session=true";

/// The frames of an append session's answer body, and the tail each ack carried.
fn session_said(body: &[u8]) -> (Vec<Said>, Vec<u64>) {
    use engine::framing::{Frame, decode_frame};
    let (mut said, mut tails) = (Vec::new(), Vec::new());
    let mut at = 0;
    while at < body.len() {
        let (frame, used) = decode_frame(&body[at..]).expect("a valid frame").expect("whole");
        said.push(match frame {
            Frame::Ack { start, end, tail } => {
                assert!(tail.seq_num >= end.seq_num, "the tail is at or past the batch");
                tails.push(tail.seq_num);
                Said::Ack { start: start.seq_num, end: end.seq_num }
            }
            Frame::Error(text) => Said::Error(serde_json::from_str(text).expect("JSON")),
            Frame::End => Said::End,
            other => panic!("a session answered with {other:?}"),
        });
        at += used;
    }
    (said, tails)
}

/// One batch of an append session's body: its length, then its append body.
fn session_batch(bodies: &[&str], match_seq_num: Option<u64>) -> Vec<u8> {
    use engine::framing::{AppendBuilder, AppendConditions, session_batch_prefix};
    let mut builder = AppendBuilder::new();
    for body in bodies {
        builder.push::<&[u8], &[u8]>(&[], body.as_bytes()).expect("fits");
    }
    let framed = builder.finish(&AppendConditions { match_seq_num, ..Default::default() });
    let mut out = session_batch_prefix(framed.len()).expect("small").to_vec();
    out.extend_from_slice(&framed);
    out
}

/// Append sessions: a body of batches, each acknowledged in order by an ack frame, the
/// answer closed by an end frame. A refused batch ends the session with an error frame
/// after the acks of the batches before it, and nothing after it is appended. Every way
/// a session's body can be wrong is refused by name, as the error frame that ends it.
fn append_sessions_ack_in_order_and_end_at_a_refusal(nova: &Nova) {
    nova.express_bucket("ses");
    let path = "/v1/streams/ses/s/records";
    let media = [("content-type", SESSION_MEDIA)];
    let session = |body: &[u8]| {
        let answer = nova.call_with("POST", path, &media, Some(body));
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.header("content-type"), Some(SESSION_MEDIA));
        session_said(&answer.body).0
    };
    let body = [
        session_batch(&["a"], None),
        session_batch(&["b"], Some(1)),
        session_batch(&["c", "d"], None),
    ]
    .concat();
    let ack = |start, end| Said::Ack { start, end };
    assert_eq!(session(&body), [ack(0, 1), ack(1, 2), ack(2, 4), Said::End]);
    assert_eq!(session(b""), [Said::End], "a session of no batch");
    let refusal = |said: &Said, code: &str, names: &[&str]| {
        let Said::Error(error) = said else { panic!("{said:?} is no error") };
        assert_eq!(error["code"], code, "{error}");
        let message = error["message"].as_str().expect("a message");
        for name in names {
            assert!(message.contains(name), "{message:?} does not name {name:?}");
        }
    };
    // A refused batch ends it; the one behind is not appended.
    let body = [
        session_batch(&["e"], None),
        session_batch(&["x"], Some(0)),
        session_batch(&["behind"], None),
    ]
    .concat();
    let said = session(&body);
    assert_eq!(said.len(), 2, "{said:?}");
    assert_eq!(said[0], ack(4, 5));
    refusal(&said[1], "failed_precondition", &[]);
    let Said::Error(error) = &said[1] else { unreachable!() };
    assert_eq!(error["next_seq_num"], 5);
    let tail = nova.ok("GET", "/v1/streams/ses/s/tail", None, 200);
    assert_eq!(tail["tail"]["seq_num"], 5, "nothing after the refused batch");
    // A batch past --http-body-bytes-max (1 MiB here), refused from its length.
    let said = session(&(2u32 << 20).to_le_bytes());
    refusal(&said[0], "invalid_argument", &["batch 0", "--http-body-bytes-max"]);
    // A body that ends inside a batch, or inside a length.
    let cut = [session_batch(&["f"], None), 100u32.to_le_bytes().to_vec(), vec![0; 10]].concat();
    let said = session(&cut);
    assert_eq!(said[0], ack(5, 6));
    refusal(&said[1], "invalid_argument", &["ended inside batch 1"]);
    let said = session(&[1, 0]);
    refusal(&said[0], "invalid_argument", &["ended inside batch 0"]);
    // A batch whose framing is wrong.
    let nonsense = [9u32.to_le_bytes().as_slice(), b"\x07nonsense"].concat();
    let said = session(&nonsense);
    refusal(&said[0], "invalid_argument", &["framed body"]);
    let tail = nova.ok("GET", "/v1/streams/ses/s/tail", None, 200);
    assert_eq!(tail["tail"]["seq_num"], 6);
}

fn binary_framing_appends_and_reads(nova: &Nova) {
    use engine::framing::{AppendBuilder, AppendConditions, Frame, decode_frame};
    nova.express_bucket("frm");
    let mut builder = AppendBuilder::new();
    builder.push(&[(b"k".as_slice(), b"\xff".as_slice())], b"\x00bin").expect("fits");
    builder.push::<&[u8], &[u8]>(&[], b"two").expect("fits");
    let framed = builder.finish(&AppendConditions { match_seq_num: Some(0), ..Default::default() });
    let media = [("content-type", "application/x-nova-records")];
    let ack = nova.call_with("POST", "/v1/streams/frm/s/records", &media, Some(&framed));
    assert_eq!(ack.status, 200, "{}", ack.text());
    assert_eq!(ack.json()["end"]["seq_num"], 2);
    // The condition in the prefix is checked.
    let again = nova.call_with("POST", "/v1/streams/frm/s/records", &media, Some(&framed));
    assert_eq!(again.status, 412);
    assert_eq!(again.json()["next_seq_num"], 2);
    let garbage =
        nova.call_with("POST", "/v1/streams/frm/s/records", &media, Some(b"\x07nonsense"));
    assert_eq!(garbage.status, 400, "{}", garbage.text());
    let page = nova.call_with(
        "GET",
        "/v1/streams/frm/s/records?seq_num=0",
        &[("accept", "application/x-nova-records")],
        None,
    );
    assert_eq!(page.status, 200);
    assert_eq!(page.header("content-type"), Some("application/x-nova-records"));
    let mut at = 0;
    let mut records = Vec::new();
    let mut end = None;
    while let Some((frame, used)) = decode_frame(&page.body[at..]).expect("valid frames") {
        match frame {
            Frame::Records(run) => {
                for (seq_num, _, stored) in run.iter() {
                    let record = engine::record::decode(stored).expect("a record");
                    let headers: Vec<(Vec<u8>, Vec<u8>)> =
                        record.headers().map(|(n, v)| (n.to_vec(), v.to_vec())).collect();
                    records.push((seq_num, headers, record.body().to_vec()));
                }
            }
            Frame::PageEnd { next_seq_num, tail } => end = Some((next_seq_num, tail.seq_num)),
            other => panic!("unexpected frame {other:?}"),
        }
        at += used;
    }
    assert_eq!(at, page.body.len());
    assert_eq!(records[0], (0, vec![(b"k".to_vec(), b"\xff".to_vec())], b"\x00bin".to_vec()));
    assert_eq!(records[1], (1, vec![], b"two".to_vec()));
    assert_eq!(end, Some((2, 2)));
}

/// A binary body in pieces (chunked transfer encoding: hyper hands each chunk over as a
/// piece) cut inside the prefix, inside the lengths and inside records, and byte by byte
/// for a stretch: appended whole, every record as sent.
fn a_binary_body_in_pieces_is_appended_whole(nova: &Nova) {
    use engine::framing::{AppendBuilder, AppendConditions};
    use std::io::{Read as _, Write as _};
    nova.ok("POST", "/v1/buckets/pcs", Some(r#"{"create_stream_on_append":true}"#), 201);
    let bodies: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; usize::from(i) * 37]).collect();
    let mut builder = AppendBuilder::new();
    for body in &bodies {
        let len = body.len().to_string();
        builder.push(&[(b"n".as_slice(), len.as_bytes())], body).expect("fits");
    }
    let framed = builder.finish(&AppendConditions::default());
    let mut cuts = vec![0, 5, 30, 200, 1000];
    cuts.extend(1001..1040);
    cuts.extend([framed.len() / 2, framed.len() - 3, framed.len()]);
    let mut request = b"POST /v1/streams/pcs/s/records HTTP/1.1\r\nHost: nova\r\n\
        Content-Type: application/x-nova-records\r\nTransfer-Encoding: chunked\r\n\
        Connection: close\r\n\r\n"
        .to_vec();
    for piece in cuts.windows(2).map(|w| &framed[w[0]..w[1]]) {
        request.extend(format!("{:x}\r\n", piece.len()).bytes());
        request.extend_from_slice(piece);
        request.extend(b"\r\n");
    }
    request.extend(b"0\r\n\r\n");
    let mut socket =
        std::net::TcpStream::connect(nova.url.trim_start_matches("http://")).expect("connect");
    socket.write_all(&request).expect("send");
    let mut response = String::new();
    socket.read_to_string(&mut response).expect("the answer");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains(r#""end":{"seq_num":40"#), "{response}");

    let read = nova.ok("GET", "/v1/streams/pcs/s/records?seq_num=0&count=40", None, 200);
    let records = read["records"].as_array().expect("records");
    assert_eq!(records.len(), 40);
    for (record, body) in records.iter().zip(&bodies) {
        assert_eq!(record["body"].as_str().map(str::as_bytes), Some(&body[..]));
        assert_eq!(record["headers"][0][1], body.len().to_string());
    }
}

fn health_metrics_and_request_ids(nova: &Nova) {
    let health = nova.call("GET", "/health", None);
    assert_eq!(health.status, 200);
    let id = health.header("x-request-id").expect("a request id").to_owned();
    assert_eq!(health.header("nova-request-id"), Some(id.as_str()));
    let echoed = nova.call_with("GET", "/health", &[("x-request-id", "abc-123")], None);
    assert_eq!(echoed.header("x-request-id"), Some("abc-123"));
    // One a log line could be forged with, or too long, is replaced with the server's.
    for unfit in ["two words".to_owned(), "x".repeat(129), "a=b".into(), "a\"b".into()] {
        let replaced = nova.call_with("GET", "/health", &[("x-request-id", &unfit)], None);
        let id = replaced.header("x-request-id").expect("a request id");
        assert!(id != unfit && !id.is_empty(), "{id:?}");
    }
    let longest = "x".repeat(128);
    let kept = nova.call_with("GET", "/health", &[("x-request-id", &longest)], None);
    assert_eq!(kept.header("x-request-id"), Some(longest.as_str()));
    let missing = nova.call("GET", "/v1/buckets/none-here", None);
    assert!(missing.header("x-request-id").is_some(), "errors carry the id too");
    let metrics = nova.call("GET", "/metrics", None);
    assert_eq!(metrics.status, 200);
    let text = metrics.text();
    assert!(text.contains(r#"nova_http_requests_total{route="health",status="200"} 7"#), "{text}");
    assert!(
        text.contains(r#"nova_http_requests_total{route="get_bucket",status="404"} 1"#),
        "{text}"
    );
    assert!(text.contains(r#"nova_shard_batches_acked_total{shard="1"}"#), "{text}");
    for (name, kind) in [
        ("nova_shard_journal_bytes_total", "counter"),
        ("nova_shard_read_cache_hits_total", "counter"),
        ("nova_shard_busy_microseconds_total", "counter"),
        ("nova_settled_early_objects_total", "counter"),
        ("nova_settle_backlog_seconds", "gauge"),
        ("nova_shard_appends_waiting", "gauge"),
        ("nova_shard_memory_bytes_held", "gauge"),
        ("nova_retention_backlog_seconds", "gauge"),
        ("nova_appends_total", "counter"),
        ("nova_bytes_out_total", "counter"),
        ("nova_ack_latency_seconds", "histogram"),
        ("nova_journal_group_seconds", "histogram"),
    ] {
        assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name}: {text}");
    }
    // An express append and its read show up in its class's counters and histogram.
    let sum = |text: &str, prefix: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(prefix) && l.contains("class=\"express\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let before = |name: &str| sum(&text, name);
    nova.express_bucket("metered");
    nova.ok(
        "POST",
        "/v1/streams/metered/s/records",
        Some(r#"{"records":[{"body":"abc"},{"body":"de"}]}"#),
        200,
    );
    nova.ok("GET", "/v1/streams/metered/s/records?seq_num=0", None, 200);
    let after = nova.call("GET", "/metrics", None).text();
    let grew = |name: &str| sum(&after, name) - before(name);
    assert_eq!(grew("nova_appends_total{"), 1.0, "{after}");
    assert_eq!(grew("nova_records_in_total{"), 2.0, "{after}");
    assert_eq!(grew("nova_bytes_in_total{"), 5.0, "{after}");
    assert_eq!(grew("nova_ack_latency_seconds_count{"), 1.0, "{after}");
    assert!(grew("nova_ack_latency_seconds_bucket{") > 0.0, "{after}");
    assert_eq!(grew("nova_records_out_total{"), 2.0, "{after}");
    assert_eq!(grew("nova_bytes_out_total{"), 5.0, "{after}");
    // Its chunk is held, cached, in its shard's memory budget.
    assert!(nova.metric("nova_shard_memory_bytes_held") > 0, "{after}");
    assert!(text.contains("\nnova_auditor_backlog_seconds 0\n"), "{text}");
    assert!(text.contains("# TYPE nova_uploader_bundles_total counter"), "{text}");
    // Both answer HEAD and name both methods when refusing another. /metrics refuses a
    // query parameter as every route does; /health ignores it (a probe may add one).
    for path in ["/health", "/metrics"] {
        let head = nova.call("HEAD", path, None);
        assert_eq!((head.status, head.body.len()), (200, 0), "{path}");
        let refused = nova.call("POST", path, None);
        assert_eq!((refused.status, refused.header("allow")), (405, Some("GET, HEAD")), "{path}");
    }
    let asked = nova.err("GET", "/metrics?x=1", None, 400, "invalid_argument");
    assert!(asked["message"].as_str().is_some_and(|m| m.contains("x")), "{asked}");
    assert_eq!(nova.ok("GET", "/health?nocache=1", None, 200)["status"], "serving");
}

#[test]
fn failed_and_slow_requests_are_logged_with_their_request_id() {
    let dir = tempdir();
    let request_lines = |flags: &[&str]| {
        let log = dir.path().join("nova.log");
        let nova = Nova::start_logging(&dir.path().join("data"), flags, &log);
        nova.call_with("GET", "/health", &[("x-request-id", "fine-1")], None);
        let missing = nova.call_with("GET", "/v1/buckets/none", &[("x-request-id", "bad-2")], None);
        assert_eq!(missing.status, 404);
        assert!(nova.terminate().success());
        let text = std::fs::read_to_string(&log).expect("the log");
        text.lines().filter(|l| l.starts_with("nova request ")).map(str::to_owned).collect()
    };
    // By default a quick success is not logged; a failure is, with its id and status.
    let lines: Vec<String> = request_lines(&[]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("request_id=bad-2 "), "{lines:?}");
    assert!(lines[0].contains(" status=404 code=not_found micros="), "{lines:?}");
    // At 0 ms every request is slow enough.
    let lines: Vec<String> = request_lines(&["--http-log-slow-ms", "0"]);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].contains("request_id=fine-1") && lines[0].contains("status=200"), "{lines:?}");
}

/// An error answered before the request's body was read (here an unknown route, and a
/// bad stream key) says `Connection: close`, and the server closes it after: the client
/// learns that the connection cannot carry its next request. Without a body, an error
/// keeps the connection.
#[test]
fn an_error_before_the_body_is_read_closes_the_connection_and_says_so() {
    use std::io::{Read as _, Write as _};
    let dir = tempdir();
    let nova = Nova::start(&dir.path().join("data"));
    // An HTTP/1.0 client that asked to keep the connection is told `close` alone.
    for (path, version) in
        [("/nope", "1.1"), ("/v1/streams/b/a%0Ab/records", "1.1"), ("/nope", "1.0")]
    {
        let mut stream = std::net::TcpStream::connect(&nova.server.authority).expect("connect");
        let head = format!(
            "POST {path} HTTP/{version}\r\nhost: x\r\nconnection: keep-alive\r\ncontent-length: 100000\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).expect("send the head alone");
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).expect("the answer, then the close");
        let answer = String::from_utf8_lossy(&answer).to_lowercase();
        assert!(answer.starts_with(&format!("http/{version} 4")), "{path}: {answer}");
        assert!(answer.contains("\r\nconnection: close\r\n"), "{path}: {answer}");
    }
    // Two requests on one connection, sent at once: every answer until `status` came
    // twice, or the connection closed.
    let twice = |request: &str, status: &str| {
        let mut stream = std::net::TcpStream::connect(&nova.server.authority).expect("connect");
        stream.set_read_timeout(Some(std::time::Duration::from_secs(30))).expect("timeout");
        stream.write_all(request.repeat(2).as_bytes()).expect("send two requests");
        let (mut answers, mut buffer) = (String::new(), [0u8; 4096]);
        while answers.matches(status).count() < 2 {
            match stream.read(&mut buffer).expect("the answers") {
                0 => break,
                n => answers.push_str(&String::from_utf8_lossy(&buffer[..n]).to_lowercase()),
            }
        }
        answers
    };
    // Without a body, an error keeps the connection.
    let answers = twice("GET /nope HTTP/1.1\r\nhost: x\r\n\r\n", "http/1.1 404");
    assert_eq!(answers.matches("http/1.1 404").count(), 2, "{answers}");
    assert!(!answers.contains("connection: close"), "{answers}");
    // Nor does one refused once its body was read (a match_seq_num that does not match):
    // a request behind it gets its own answer.
    nova.ok("POST", "/v1/buckets/kept", Some(r#"{"create_stream_on_append":true}"#), 201);
    nova.ok("POST", "/v1/streams/kept/k/records", Some(r#"{"records":[{"body":"a"}]}"#), 200);
    let body = r#"{"records":[{"body":"b"}],"match_seq_num":5}"#;
    let request = format!(
        "POST /v1/streams/kept/k/records HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let answers = twice(&request, "http/1.1 412");
    assert_eq!(answers.matches("http/1.1 412").count(), 2, "{answers}");
    assert!(!answers.contains("connection: close"), "{answers}");
    // A body where none is taken is read, then refused: the connection is kept too.
    let request =
        "DELETE /v1/buckets/kept HTTP/1.1\r\nhost: x\r\ncontent-length: 7\r\n\r\n{\"x\":1}";
    let answers = twice(request, "http/1.1 400");
    assert_eq!(answers.matches("http/1.1 400").count(), 2, "{answers}");
    assert!(!answers.contains("connection: close"), "{answers}");
}

/// An append session holds at most `--http-session-in-flight-max` batches sequenced and
/// unacknowledged (at 1, each batch is acknowledged before the next is sequenced, so
/// each ack's tail is its own end), and a batch's bytes in the shard's body memory as
/// they arrive, not as its length announces them.
#[test]
fn append_sessions_keep_to_their_bounds() {
    use std::io::{Read as _, Write as _};
    let dir = tempdir();
    let flags = [
        ["--http-session-in-flight-max", "1"],
        ["--http-idle-timeout-ms", "1000"],
        ["--http-body-bytes-max", "1MiB"],
        ["--http-json-body-bytes-max", "1MiB"],
        ["--http-body-memory-bytes", "2MiB"],
        // One shard, so that one body memory is filled.
        ["--shards", "1"],
    ];
    let nova = Nova::start_with(&dir.path().join("data"), flags.as_flattened(), &[]);
    nova.express_bucket("bnd");
    let path = "/v1/streams/bnd/s/records";
    let media = [("content-type", SESSION_MEDIA)];
    let session =
        |body: &[u8]| session_said(&nova.call_with("POST", path, &media, Some(body)).body);
    let body: Vec<u8> = (0..8).flat_map(|i| session_batch(&[&format!("{i}")], None)).collect();
    let (said, tails) = session(&body);
    let mut expected: Vec<Said> = (1..=8).map(|end| Said::Ack { start: end - 1, end }).collect();
    expected.push(Said::End);
    assert_eq!(said, expected);
    assert_eq!(tails, (1..=8).collect::<Vec<u64>>(), "one batch in flight at a time");
    // Batches announced at 1 MiB of which only some bytes came hold those bytes: three
    // of them fill the shard's 2 MiB exactly.
    let partial = |bytes: usize| {
        let mut stream = std::net::TcpStream::connect(&nova.server.authority).expect("connect");
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: nova\r\ncontent-type: {SESSION_MEDIA}\r\n\
             transfer-encoding: chunked\r\n\r\n"
        );
        let mut chunk = (1u32 << 20).to_le_bytes().to_vec();
        chunk.resize(4 + bytes, 1);
        let size = format!("{:x}\r\n", chunk.len());
        for part in [head.as_bytes(), size.as_bytes(), &chunk, b"\r\n"] {
            stream.write_all(part).expect("send");
        }
        stream
    };
    let held = || nova.metric("nova_http_body_bytes_held");
    let mut stalled = vec![partial(10)];
    common::wait_until("the batch's first bytes held", || held() > 0);
    assert_eq!(held(), 10, "only what came");
    stalled.push(partial((1 << 20) - 1));
    stalled.push(partial((2 << 20) - 10 - ((1 << 20) - 1)));
    common::wait_until("the shard's body memory full", || held() == 2 << 20);
    // A session with nothing in flight is refused then, as an append would be.
    let (said, _) = session(&session_batch(&["x"], None));
    let Said::Error(full) = &said[0] else { panic!("{said:?}") };
    assert_eq!(full["code"], "resource_exhausted", "{full}");
    assert_eq!(full["retry_after_seconds"], 1, "{full}");
    let message = full["message"].as_str().expect("a message");
    assert!(
        message.contains("batch 0 of the session") && message.contains("--http-body-memory-bytes"),
        "{message}"
    );
    // A batch whose bytes stop coming is refused after the idle timeout, and gives its
    // memory back.
    for mut stream in stalled {
        stream.set_read_timeout(Some(Duration::from_secs(30))).expect("a read timeout");
        // To its end, or to a reset after it: what was read is the answer.
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        let text = String::from_utf8_lossy(&answer);
        assert!(text.contains("batch 0 of the session: its bytes stalled"), "{text}");
    }
    common::wait_until("given back", || held() == 0);
    // A stall inside a batch's length names that batch too.
    let mut stream = std::net::TcpStream::connect(&nova.server.authority).expect("connect");
    let whole = session_batch(&["a"], None);
    let half_a_length = [5u8, 0];
    let mut sent = format!(
        "POST {path} HTTP/1.1\r\nhost: nova\r\ncontent-type: {SESSION_MEDIA}\r\n\
         transfer-encoding: chunked\r\n\r\n{:x}\r\n",
        whole.len()
    )
    .into_bytes();
    sent.extend_from_slice(&whole);
    sent.extend_from_slice(b"\r\n2\r\n");
    sent.extend_from_slice(&half_a_length);
    sent.extend_from_slice(b"\r\n");
    stream.write_all(&sent).expect("a batch and half a length");
    stream.set_read_timeout(Some(Duration::from_secs(30))).expect("a read timeout");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    assert!(text.contains("batch 1 of the session: its bytes stalled"), "{text}");
}

/// A session's batches waiting to be durable hold none of their shard's handlers: with
/// more of them in flight than `--shard-handlers-max`, all are sequenced, and the
/// shard goes on serving other requests (an append to another stream) meanwhile.
#[test]
fn session_batches_waiting_to_be_durable_hold_no_handlers() {
    use std::io::Write as _;
    let dir = tempdir();
    let flags = ["--shards", "1", "--shard-handlers-max", "16"];
    let nova = Nova::start_with(&dir.path().join("data"), &flags, &[]);
    let slow = r#"{"create_stream_on_append":true,"default_batch_max_delay_ms":60000}"#;
    nova.ok("POST", "/v1/buckets/slow", Some(slow), 201);
    nova.express_bucket("fast");
    let one = Some(r#"{"records":[{"body":"x"}]}"#);
    nova.ok("POST", "/v1/streams/fast/x/records", one, 200);
    let mut session = std::net::TcpStream::connect(&nova.server.authority).expect("connect");
    let head = format!(
        "POST /v1/streams/slow/s/records HTTP/1.1\r\nhost: nova\r\n\
         content-type: {SESSION_MEDIA}\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    let batches: Vec<u8> = (0..64).flat_map(|i| session_batch(&[&format!("{i}")], None)).collect();
    let chunk = [format!("{:x}\r\n", batches.len()).as_bytes(), &batches, b"\r\n"].concat();
    session.write_all(&[head.as_bytes(), &chunk].concat()).expect("64 batches");
    common::wait_until("64 batches waiting to be durable", || {
        nova.metric("nova_shard_appends_waiting") == 64
    });
    nova.ok("POST", "/v1/streams/fast/x/records", one, 200);
    assert_eq!(nova.metric("nova_http_session_outcomes_total"), 0, "none durable yet");
}

/// A session stays on the stream its first batch went to: once that stream is deleted,
/// its next batch ends it with `not_found`, and the bucket's create-on-append makes no
/// new stream under it (whose numbers would start again at 0 mid-session).
#[test]
fn a_session_ends_when_its_stream_is_deleted() {
    use std::io::Write as _;
    let dir = tempdir();
    let nova = Nova::start(&dir.path().join("data"));
    nova.express_bucket("del");
    let mut stream = std::net::TcpStream::connect(&nova.server.authority).expect("connect");
    let head = format!(
        "POST /v1/streams/del/s/records HTTP/1.1\r\nhost: nova\r\n\
         content-type: {SESSION_MEDIA}\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    let chunk = |bytes: &[u8]| {
        let mut out = format!("{:x}\r\n", bytes.len()).into_bytes();
        out.extend_from_slice(bytes);
        out.extend_from_slice(b"\r\n");
        out
    };
    stream.write_all(head.as_bytes()).expect("head");
    stream.write_all(&chunk(&session_batch(&["a"], None))).expect("a batch");
    common::wait_until("the first batch acknowledged", || {
        nova.metric("nova_http_session_outcomes_total") == 1
    });
    nova.ok("DELETE", "/v1/streams/del/s", None, 204);
    stream.write_all(&chunk(&session_batch(&["b"], None))).expect("a batch");
    stream.write_all(b"0\r\n\r\n").expect("the body's end");
    let mut reader = std::io::BufReader::new(stream);
    let (answer, _) = net::client::http::read_response(&mut reader, "POST").expect("the answer");
    let (said, _) = session_said(&answer.body);
    let [Said::Ack { start: 0, end: 1 }, Said::Error(error)] = &said[..] else {
        panic!("{said:?}")
    };
    assert_eq!(error["code"], "not_found", "{error}");
    nova.err("GET", "/v1/streams/del/s", None, 404, "not_found");
}

/// A body sent a byte at a time (one-byte chunks) holds about its own size: its small
/// pieces are gathered into buffers of the server's own, where each would keep one of
/// hyper's read buffers alive, which body memory does not count. Both a session's batch
/// and a single binary append, each one byte short of its end so that it is held.
#[test]
fn a_body_sent_a_byte_at_a_time_holds_about_its_size() {
    use std::io::Write as _;
    let dir = tempdir();
    let nova = Nova::start_with(&dir.path().join("data"), &["--shards", "1"], &[]);
    nova.express_bucket("tiny");
    let bytes = 512 << 10;
    let one_byte_chunks = b"1\r\nx\r\n".repeat(bytes);
    let before = resident_bytes(nova.pid());
    let open = |path: &str, media: &str| {
        let mut stream = std::net::TcpStream::connect(&nova.server.authority).expect("connect");
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: nova\r\ncontent-type: {media}\r\n\
             transfer-encoding: chunked\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).expect("head");
        stream
    };
    let mut session = open("/v1/streams/tiny/s/records", SESSION_MEDIA);
    let announced = u32::try_from(bytes + 1).expect("small").to_le_bytes();
    session.write_all(b"4\r\n").expect("a chunk");
    session.write_all(&announced).expect("the batch's length");
    session.write_all(b"\r\n").expect("a chunk's end");
    session.write_all(&one_byte_chunks).expect("the batch but its last byte");
    let mut single = open("/v1/streams/tiny/t/records", net::api::RECORDS_MEDIA_TYPE);
    single.write_all(&one_byte_chunks).expect("the body but its end");
    // And a batch of 16 KiB chunks, each followed by many one-byte ones: a large piece
    // would keep a read buffer that is mostly the small ones' chunk framing.
    let large = [format!("{:x}\r\n", 16 << 10).as_bytes(), &[b'y'; 16 << 10], b"\r\n"].concat();
    let cycle = [&large[..], &b"1\r\nx\r\n".repeat(30_000)].concat();
    let cycles = 48;
    let mixed_bytes = cycles * ((16 << 10) + 30_000);
    let mut mixed = open("/v1/streams/tiny/m/records", SESSION_MEDIA);
    let announced = u32::try_from(mixed_bytes + 1).expect("small").to_le_bytes();
    mixed.write_all(&[b"4\r\n", &announced[..], b"\r\n"].concat()).expect("a length");
    mixed.write_all(&cycle.repeat(cycles)).expect("the batch but its last byte");
    let held = || nova.metric("nova_http_body_bytes_held");
    let all = (2 * bytes + mixed_bytes) as u64;
    common::wait_until("the bodies held", || held() == all);
    let grew = resident_bytes(nova.pid()).saturating_sub(before);
    eprintln!("the server grew {grew} bytes holding {all} body bytes");
    assert!(grew < 12 << 20, "the server grew {grew} bytes for {all} body bytes");
}

/// A node that stops ends its subscriptions with an `unavailable` error (an SSE `error`
/// event, a binary error frame), so a subscriber tells a stop from a cut connection, and
/// resumes as from a cut; the stop does not wait for them.
#[test]
fn sigterm_ends_subscriptions_with_unavailable() {
    use std::io::{Read as _, Write as _};
    let dir = tempdir();
    let nova = Nova::start(&dir.path().join("data"));
    nova.express_bucket("stop");
    nova.ok("POST", "/v1/streams/stop/s/records", Some(r#"{"records":[{"body":"one"}]}"#), 200);
    let subscribers: Vec<std::net::TcpStream> = ["text/event-stream", client::SUBSCRIBE_MEDIA_TYPE]
        .iter()
        .map(|accept| {
            let mut stream = std::net::TcpStream::connect(&nova.server.authority).expect("connect");
            let head = format!(
                "GET /v1/streams/stop/s/records HTTP/1.1\r\nhost: nova\r\naccept: {accept}\r\n\r\n"
            );
            stream.write_all(head.as_bytes()).expect("subscribe");
            stream
        })
        .collect();
    wait_until("both subscriptions wait at the tail", || {
        nova.metric("nova_shard_reads_waiting") == 2
    });
    assert!(nova.terminate().success(), "the subscriptions did not hold the stop");
    for mut subscriber in subscribers {
        let mut answer = Vec::new();
        subscriber.read_to_end(&mut answer).expect("the answer, to its end");
        let text = String::from_utf8_lossy(&answer);
        assert!(text.contains("one"), "{text}");
        assert!(text.contains(r#""code":"unavailable""#), "{text}");
    }
}

/// A node that stops ends its open append sessions: after the acks of what they had
/// sequenced, an `unavailable` error frame says nothing more was taken, so the node exits
/// 0 without waiting on a producer that sends nothing; what was acknowledged survives.
/// The client sees the session ended before its next batch (an ack it has not taken
/// yet counted), and sends it on a new connection (refused here: nothing listens any
/// more), not into the ended session.
#[test]
fn sigterm_ends_open_append_sessions() {
    use net::client::{Address, Batch, Client, Conditions, ReadOptions};
    let dir = tempdir();
    let data = dir.path().join("data");
    let nova = Nova::start(&data);
    nova.express_bucket("stop");
    let client = Client::new(&nova.url).expect("url");
    let address = Address::new("stop", "s");
    let mut session = client.append_session(&address, 4).expect("session");
    let one = |body: &str| {
        let mut batch = Batch::new();
        batch.push::<&str, &str>(&[], body.as_bytes()).expect("fits");
        batch
    };
    session.submit(&one("acked"), &Conditions::default()).expect("submit");
    // Its ack is left unread, so the session learns of the stop with it still to take.
    common::wait_until("the ack sent", || nova.metric("nova_http_session_outcomes_total") == 1);
    // A raw session too, to read what the stop says.
    let mut raw = std::net::TcpStream::connect(&nova.server.authority).expect("connect");
    let head = format!(
        "POST /v1/streams/stop/raw/records HTTP/1.1\r\nhost: nova\r\n\
         content-type: {SESSION_MEDIA}\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    std::io::Write::write_all(&mut raw, head.as_bytes()).expect("head");
    common::wait_until("the raw session answering", || {
        let metrics = nova.call("GET", "/metrics", None).text();
        metrics.contains(r#"nova_http_requests_total{route="append_session",status="200"} 2"#)
    });
    assert!(nova.terminate().success(), "the open session did not hold the stop");
    let mut answer = Vec::new();
    std::io::Read::read_to_end(&mut raw, &mut answer).expect("the answer, to its end");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.contains(r#""code":"unavailable""#), "{text}");
    assert!(text.contains(r#""not_appended":true"#), "nothing after the acks was taken: {text}");
    let late = session.submit(&one("late"), &Conditions::default()).expect_err("no server");
    assert!(late.to_string().contains("connect to"), "{late}");
    assert!(session.recv().expect("the ack").result.is_ok());
    let nova = Nova::start(&data);
    let client = Client::new(&nova.url).expect("url");
    let page = client.read(&address, &ReadOptions::default()).expect("read");
    let bodies: Vec<&[u8]> = page.records.iter().map(|r| r.body.as_slice()).collect();
    assert_eq!(bodies, [b"acked".as_slice()]);
}

/// A connection the kernel queued before the stop is served, not reset: with the one
/// connection permit held, a second client's append waits in the kernel's queue when
/// SIGTERM comes; the server takes it, acknowledges it, and the record survives.
#[test]
fn sigterm_serves_connections_queued_in_the_kernel() {
    use std::io::{Read as _, Write as _};
    let dir = tempdir();
    let data = dir.path().join("data");
    let one = ["--shards", "1"];
    let nova = Nova::start_with(&data, &[&one[..], &["--http-connections-max", "1"]].concat(), &[]);
    nova.express_bucket("queued");
    // The one permit, held by a kept-alive connection.
    let mut held = std::net::TcpStream::connect(&nova.server.authority).expect("connect");
    assert_eq!(get_on(&mut held, "/health", "application/json").0, 200);
    let mut queued = std::net::TcpStream::connect(&nova.server.authority).expect("connect");
    let body = r#"{"records":[{"body":"queued"}]}"#;
    let head = format!(
        "POST /v1/streams/queued/s/records HTTP/1.1\r\nhost: nova\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    queued.write_all(format!("{head}{body}").as_bytes()).expect("send the append");
    // A request answered at once (in the poll that reads it) is its connection's last too.
    let mut probe = std::net::TcpStream::connect(&nova.server.authority).expect("connect");
    probe.write_all(b"GET /health HTTP/1.1\r\nhost: nova\r\n\r\n").expect("send a probe");
    assert!(nova.terminate().success());
    let (status, answer) = read_answer(&mut queued);
    let answer = String::from_utf8_lossy(&answer);
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains(r#""start":{"seq_num":0"#), "{answer}");
    let mut probed = Vec::new();
    probe.read_to_end(&mut probed).expect("the probe's answer, then its close");
    let probed = String::from_utf8_lossy(&probed);
    assert!(probed.starts_with("HTTP/1.1 200") && probed.contains("connection: close"), "{probed}");
    let mut rest = Vec::new();
    queued.read_to_end(&mut rest).expect("the server closes it after the answer");
    assert!(rest.is_empty());
    let nova = Nova::start_with(&data, &one, &[]);
    assert_eq!(read_all(&nova, "/v1/streams/queued/s"), ["queued"]);
}

#[test]
fn sigterm_exits_zero_and_acknowledged_records_survive_a_restart() {
    sigterm_case(Store::Local);
}

#[test]
fn s3_sigterm_exits_zero_and_acknowledged_records_survive_a_restart() {
    sigterm_case(Store::s3());
}

#[test]
fn a_restart_listens_on_the_port_its_last_run_closed_connections_on() {
    use std::io::{Read as _, Write as _};
    let dir = tempdir();
    let data = dir.path().join("data");
    // The journals apart from the data directory, as an operator with a fast disk puts them.
    let journals = dir.path().join("journals");
    let journal_flag = ["--journal-dir", journals.to_str().expect("utf-8")];
    let nova = Nova::start_with(&data, &journal_flag, &[]);
    assert!(journals.join("shard-0").is_dir() && !data.join("journal").exists());
    let address = nova.server.authority.clone();
    // A connection the server closes first (the client asked it to, then waited for its
    // end) waits out TIME_WAIT on the server's port after the server is gone.
    let mut connection = std::net::TcpStream::connect(&address).expect("connect");
    connection
        .write_all(b"GET /health HTTP/1.1\r\nhost: nova\r\nconnection: close\r\n\r\n")
        .expect("send");
    let mut answer = String::new();
    connection.read_to_string(&mut answer).expect("read to the server's close");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop(connection);
    assert!(nova.terminate().success());
    let nova = Nova::start_with(&data, &[&journal_flag[..], &["--listen", &address]].concat(), &[]);
    assert_eq!(nova.server.authority, address);
    nova.ok("GET", "/health", None, 200);

    // The port is still refused to a second server while this one listens on it.
    let other = std::process::Command::new(env!("CARGO_BIN_EXE_nova"))
        .args(["serve", "--listen", &address, "--data-dir"])
        .arg(dir.path().join("other"))
        .output()
        .expect("run a second nova serve");
    let stderr = String::from_utf8_lossy(&other.stderr);
    assert!(!other.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("cannot listen on {address}")), "{stderr}");
}

#[test]
fn a_query_parameter_a_verb_does_not_take_is_refused_before_it_runs() {
    let dir = tempdir();
    let nova = Nova::start(dir.path());
    nova.ok("POST", "/v1/buckets/qqq", None, 201);
    nova.ok("POST", "/v1/streams/qqq/s", None, 201);
    let append = r#"{"records":[{"body":"a"}]}"#;
    nova.ok("POST", "/v1/streams/qqq/s/records", Some(append), 200);
    // A condition in the query instead of the body would make an unconditional append.
    let refused = nova.err(
        "POST",
        "/v1/streams/qqq/s/records?match_seq_num=0",
        Some(append),
        400,
        "invalid_argument",
    );
    assert!(refused["message"].as_str().unwrap().contains("\"match_seq_num\""), "{refused}");
    assert_eq!(nova.ok("GET", "/v1/streams/qqq/s/tail", None, 200)["tail"]["seq_num"], 1);
    for (method, path, body) in [
        ("POST", "/v1/buckets/qrr?x=1", None),
        ("GET", "/v1/buckets/qqq?x=1", None),
        ("PUT", "/v1/buckets/qqq?x=1", Some("{}")),
        ("DELETE", "/v1/buckets/qqq?x=1", None),
        ("POST", "/v1/streams/qqq/t?x=1", None),
        ("GET", "/v1/streams/qqq/s?x=1", None),
        ("PATCH", "/v1/streams/qqq/s?x=1", Some("{}")),
        ("DELETE", "/v1/streams/qqq/s?x=1", None),
        ("GET", "/v1/streams/qqq/s/tail?x=1", None),
        ("POST", "/v1/streams/qqq/s/fence?x=1", Some(r#"{"fencing_token":"f"}"#)),
        ("POST", "/v1/streams/qqq/s/trim?x=1", Some(r#"{"seq_num":1}"#)),
    ] {
        nova.err(method, path, body, 400, "invalid_argument");
    }
    // Nothing ran: no bucket qr, no stream t, no fence, no trim, the stream is there.
    nova.err("GET", "/v1/buckets/qrr", None, 404, "not_found");
    nova.err("GET", "/v1/streams/qqq/t", None, 404, "not_found");
    let stream = nova.ok("GET", "/v1/streams/qqq/s/records?seq_num=0", None, 200);
    assert_eq!(bodies(&stream), ["a"]);
    nova.ok("POST", "/v1/streams/qqq/s/records", Some(append), 200);
}

#[test]
fn a_non_loopback_address_is_served_only_with_insecure_no_auth_and_a_warning() {
    let dir = tempdir();
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_nova"))
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path().join("refused"))
        .output()
        .expect("run nova serve");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.contains("not a loopback address") && stderr.contains("--insecure-no-auth"));
    assert!(!dir.path().join("refused").exists(), "refused before it touched the disk");

    let log = dir.path().join("log");
    let flags = ["--listen", "0.0.0.0:0", "--insecure-no-auth"];
    let nova = Nova::start_logging(&dir.path().join("data"), &flags, &log);
    nova.ok("GET", "/health", None, 200);
    // Stopped, so every line it logged is written.
    assert!(nova.terminate().success());
    let log = std::fs::read_to_string(&log).expect("read the log");
    assert!(log.contains("WARNING: listening on 0.0.0.0:") && log.contains("authentication"));
    assert!(log.contains("nova: 2 shards (--shards) and one uploader thread, on "), "{log}");
}

#[test]
fn a_flood_of_failing_requests_writes_a_bounded_log() {
    let dir = tempdir();
    let log = dir.path().join("log");
    let flags = ["--http-log-lines-per-second", "3"];
    let nova = Nova::start_logging(&dir.path().join("data"), &flags, &log);
    let started = Instant::now();
    const FAILED: usize = 60;
    for _ in 0..FAILED {
        nova.ok("GET", "/v1/buckets/none-here", None, 404);
    }
    let seconds = started.elapsed().as_secs() + 1;
    let suppressed = nova.metric("nova_http_log_lines_suppressed_total") as usize;
    assert!(nova.terminate().success());
    let log = std::fs::read_to_string(&log).expect("read the log");
    let written = log.lines().filter(|l| l.contains("route=get_bucket status=404")).count();
    // Every failed request is either a line or a count, and at most 3 lines a second
    // on each of the 2 shards are written.
    assert_eq!(written + suppressed, FAILED, "{log}");
    assert!(written as u64 <= 3 * 2 * seconds, "{written} lines in {seconds} s: {log}");
    assert!(suppressed > 0, "60 failures in {seconds} s fit 3 lines a second? {log}");
}

/// Long polls and subscription pages waiting for records have a pool of their own: more
/// of them than the shard's handlers hold none of the permits an append needs.
#[test]
fn waiting_reads_past_the_handler_limit_do_not_hold_up_appends() {
    let dir = tempdir();
    let flags = ["--shards", "1", "--shard-handlers-max", "16"];
    let nova = Nova::start_with(&dir.path().join("data"), &flags, &[]);
    nova.ok("POST", "/v1/buckets/wrd", Some(r#"{"create_stream_on_append":true}"#), 201);
    for stream in ["s", "t"] {
        nova.ok("POST", &format!("/v1/streams/wrd/{stream}"), None, 201);
    }
    let polls = 20;
    std::thread::scope(|scope| {
        let waiting: Vec<_> = (0..polls)
            .map(|_| {
                let path = "/v1/streams/wrd/s/records?seq_num=0&wait=30";
                scope.spawn(|| nova.ok("GET", path, None, 200))
            })
            .collect();
        // As many as the pool holds are waiting; the other 4 wait for a permit.
        while nova.metric("nova_shard_reads_waiting") < 16 {
            std::thread::yield_now();
        }
        nova.ok("POST", "/v1/streams/wrd/t/records", Some(r#"{"records":[{"body":"t"}]}"#), 200);
        // Answered while every poll still waits (with one handler pool, not before the
        // polls' 30 s ran out).
        assert_eq!(nova.metric("nova_shard_reads_waiting"), 16);
        nova.ok("POST", "/v1/streams/wrd/s/records", Some(r#"{"records":[{"body":"s"}]}"#), 200);
        for poll in waiting {
            assert_eq!(bodies(&poll.join().expect("poll")), ["s"]);
        }
    });
}

#[test]
fn a_body_other_than_an_appends_is_refused_past_1_mib_naming_the_limit() {
    let dir = tempdir();
    let nova = Nova::start(dir.path());
    let padded = |len: usize| {
        let mut body = r#"{"create_stream_on_append":true}"#.to_owned();
        body.push_str(&" ".repeat(len - body.len()));
        body
    };
    let refused =
        nova.err("POST", "/v1/buckets/ctl", Some(&padded((1 << 20) + 1)), 400, "invalid_argument");
    let message = refused["message"].as_str().expect("a message");
    let limit = "over the limit of 1048576 bytes (the limit of a body other than an append's)";
    assert!(message.contains(limit), "{message}");
    nova.err("GET", "/v1/buckets/ctl", None, 404, "not_found");
    nova.ok("POST", "/v1/buckets/ctl", Some(&padded(1 << 20)), 201);
    // An append's body is bounded by its own limit alone (JSON: --http-json-body-bytes-max).
    let append = format!(r#"{{"records":[{{"body":"{}"}}]}}"#, "x".repeat(1 << 20));
    nova.ok("POST", "/v1/streams/ctl/s/records", Some(&append), 200);
}

/// The request bodies a shard holds are bounded (`--http-body-memory-bytes`): a
/// request whose body would pass the bound is refused with resource_exhausted and
/// Retry-After before its body is read, and the memory comes back when the request
/// that held it is done, answered or not.
#[test]
fn request_bodies_a_shard_holds_are_bounded() {
    use std::io::Write as _;
    let dir = tempdir();
    let limits = ["--http-body-bytes-max", "1MiB", "--http-json-body-bytes-max", "1MiB"];
    let bound = ["--shards", "1", "--http-body-memory-bytes", "2MiB"];
    let nova = Nova::start_with(&dir.path().join("data"), &[&limits[..], &bound].concat(), &[]);
    nova.ok("POST", "/v1/buckets/mem", Some(r#"{"create_stream_on_append":true}"#), 201);
    let held = || nova.metric("nova_http_body_bytes_held");
    // Two appends whose 1 MiB bodies have all but their last 4 bytes here hold all but
    // 8 bytes of the bound: a body is held as it arrives.
    let body = format!(r#"{{"records":[{{"body":"{}"}}]}}"#, "y".repeat((1 << 20) - 25));
    assert_eq!(body.len(), 1 << 20);
    let (sent, rest) = body.split_at(body.len() - 4);
    let address = nova.url.trim_start_matches("http://").to_owned();
    let mut holders: Vec<std::net::TcpStream> = (0..2)
        .map(|_| {
            let mut stream = std::net::TcpStream::connect(&address).expect("connect");
            let head = format!(
                "POST /v1/streams/mem/s/records HTTP/1.1\r\nhost: nova\r\n\
                 content-length: {}\r\n\r\n{sent}",
                body.len()
            );
            stream.write_all(head.as_bytes()).expect("send the head and most of the body");
            stream
        })
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let await_held = |bytes: u64| {
        while held() != bytes {
            assert!(std::time::Instant::now() < deadline, "held {} bytes, not {bytes}", held());
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    };
    await_held(2 * sent.len() as u64);
    // A body that could not be held is refused from its Content-Length.
    let small = r#"{"records":[{"body":"x"}]}"#;
    let refused = nova.call("POST", "/v1/streams/mem/s/records", Some(small));
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert_eq!(refused.header("retry-after"), Some("1"));
    let message = refused.json()["message"].as_str().expect("a message").to_owned();
    assert!(message.contains("--http-body-memory-bytes") && message.contains("2097152"));
    // So is one with no Content-Length, when its first piece would not fit.
    let mut chunked = std::net::TcpStream::connect(&address).expect("connect");
    let head = "POST /v1/streams/mem/s/records HTTP/1.1\r\nhost: nova\r\nconnection: close\r\n\
                transfer-encoding: chunked\r\n\r\n";
    // The piece alone, no last chunk: nothing is left unread when the server answers.
    let piece = format!("{:x}\r\n{small}\r\n", small.len());
    chunked.write_all(format!("{head}{piece}").as_bytes()).expect("send a chunked body");
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut chunked, &mut answer).expect("an answer");
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    assert!(answer.contains("--http-body-memory-bytes"), "{answer}");
    // One holder gives up: its memory comes back, and appends are taken again.
    drop(holders.pop());
    await_held(sent.len() as u64);
    nova.ok("POST", "/v1/streams/mem/s/records", Some(small), 200);
    // The other sends the rest: joined for the parser (held twice, the whole bound), it
    // is appended, and nothing stays held.
    let mut holder = holders.pop().expect("a holder");
    holder.write_all(rest.as_bytes()).expect("send the rest");
    let mut answer = [0u8; 12];
    std::io::Read::read_exact(&mut holder, &mut answer).expect("an answer");
    assert_eq!(&answer, b"HTTP/1.1 200", "{}", String::from_utf8_lossy(&answer));
    assert_eq!(held(), 0);
    // A body that stops coming is refused after --http-idle-timeout-ms, and lets go.
    let quick = Nova::start_with(
        &dir.path().join("quick"),
        &["--shards", "1", "--http-idle-timeout-ms", "1000"],
        &[],
    );
    let mut stalled =
        std::net::TcpStream::connect(quick.url.trim_start_matches("http://")).expect("connect");
    stalled
        .write_all(b"POST /v1/streams/mem/s/records HTTP/1.1\r\nhost: nova\r\ncontent-length: 100\r\n\r\n{")
        .expect("send a head and a byte");
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut stalled, &mut answer).expect("an answer");
    assert!(answer.starts_with("HTTP/1.1 400") && answer.contains("stalled"), "{answer}");
    assert_eq!(quick.metric("nova_http_body_bytes_held"), 0);
    // A bound below a body limit could never take such a body: refused at start.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nova"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("other"))
        .args(["--http-body-memory-bytes", "2MiB", "--http-body-bytes-max", "1MiB"])
        .args(["--http-json-body-bytes-max", "2MiB"])
        .output()
        .expect("run nova serve");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--http-body-memory-bytes")
            && stderr.contains("--http-json-body-bytes-max"),
        "{stderr}"
    );
}

/// A subscriber that goes away gives back at once what its queued pages held, though its
/// subscription is in a long wait for records (the body empties its channel when
/// dropped: a channel's items outlive its receivers until taken out).
#[test]
fn a_subscriber_gone_gives_its_queued_pages_back_at_once() {
    let dir = tempdir();
    let nova = Nova::start_with(&dir.path().join("data"), &["--shards", "1"], &[]);
    nova.ok("POST", "/v1/buckets/gone", Some(r#"{"create_stream_on_append":true}"#), 201);
    // Five pages of 4 MiB: one in hyper's hands, four queued; then the subscription
    // waits for new records, for the default heartbeat's 15 s.
    common::append_large(&nova, "gone/s", 5);
    let subscribe = "application/x-nova-records; subscribe=true";
    let subscriber = nova.stalled_get("/v1/streams/gone/s/records?seq_num=0", subscribe, 20 << 20);
    drop(subscriber);
    let gone = Instant::now();
    while nova.response_bytes_held() > 0 {
        let held = nova.response_bytes_held();
        assert!(gone.elapsed() < Duration::from_secs(5), "{held} bytes still held");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A binary subscription's pages hold at most 4 MiB of content each (api.md), though a
/// binary read's page may hold 16 MiB: what one subscriber can have queued is six such
/// pages. Every record still comes, once, in order.
#[test]
fn binary_subscription_pages_are_capped() {
    const BINARY_PAGE_BYTES_MAX: u64 = 4 << 20;
    let dir = tempdir();
    let nova = Nova::start_with(&dir.path().join("data"), &["--shards", "1"], &[]);
    nova.ok("POST", "/v1/buckets/cap", Some(r#"{"create_stream_on_append":true}"#), 201);
    // Three batches of 64 records of 64 KiB: 12 MiB, under one binary read page.
    common::append_large(&nova, "cap/s", 3);
    let record_bytes = 64 << 10;
    assert!(3 * 64 * record_bytes < engine::limits::READ_PAGE_BYTES_MAX_BINARY);
    let mut stream = subscribe_binary(&nova, "cap", "seq_num=0&count=192");
    let (mut next, mut largest) = (0, 0);
    while next < 192 {
        let (records, next_seq_num, _) = binary_page(&mut stream);
        let seq_nums: Vec<u64> = records.iter().map(|&(seq_num, _)| seq_num).collect();
        assert_eq!(seq_nums, (next..next_seq_num).collect::<Vec<_>>(), "no gap, no duplicate");
        let bytes = records.len() as u64 * record_bytes;
        assert!(bytes <= BINARY_PAGE_BYTES_MAX, "a page of {bytes} bytes");
        (next, largest) = (next_seq_num, largest.max(bytes));
    }
    assert_eq!(largest, BINARY_PAGE_BYTES_MAX, "the cap, not something else, cuts the pages");
    assert!(binary_records_then_end(&mut stream).is_empty());
}

/// Sends a GET on a kept-alive connection and reads its whole answer: status and body.
fn get_on(stream: &mut std::net::TcpStream, path: &str, accept: &str) -> (u16, Vec<u8>) {
    use std::io::Write as _;
    let request = format!("GET {path} HTTP/1.1\r\nhost: nova\r\naccept: {accept}\r\n\r\n");
    stream.write_all(request.as_bytes()).expect("send a request");
    read_answer(stream)
}

/// Reads one whole answer with a Content-Length from `stream`: status and body.
fn read_answer(stream: &mut std::net::TcpStream) -> (u16, Vec<u8>) {
    use std::io::Read as _;
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8];
        stream.read_exact(&mut byte).expect("an answer's head");
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).expect("a text head");
    let status = head[9..12].parse().expect("a status");
    let length: usize = head
        .lines()
        .find_map(|line| line.to_ascii_lowercase().strip_prefix("content-length: ")?.parse().ok())
        .unwrap_or_else(|| panic!("no content-length in {head}"));
    let mut body = vec![0; length];
    stream.read_exact(&mut body).expect("an answer's body");
    (status, body)
}

fn resident_bytes(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:")?.trim().strip_suffix(" kB")?.parse().ok())
        .expect("VmRSS");
    kib << 10
}

/// An answer's body goes to the socket from where it lies: a kept-alive connection that
/// once answered a 16 MiB page does not keep a buffer of that size for its life (hyper
/// copied every body into one when writes were not vectored, and kept its capacity).
#[test]
fn kept_alive_connections_do_not_keep_the_pages_they_answered() {
    let dir = tempdir();
    let nova = Nova::start(&dir.path().join("data"));
    nova.ok("POST", "/v1/buckets/big", Some(r#"{"create_stream_on_append":true}"#), 201);
    common::append_large(&nova, "big/s", 5);
    let address = &nova.server.authority;
    let page = "/v1/streams/big/s/records?seq_num=0&count=256";
    // Once, so the page's chunks are in memory before the measure.
    let mut first = std::net::TcpStream::connect(address).expect("connect");
    let (status, body) = get_on(&mut first, page, RECORDS_MEDIA_TYPE);
    assert_eq!(status, 200);
    assert!(body.len() > 15 << 20, "a page of 256 records of 64 KiB: {} bytes", body.len());
    let before = resident_bytes(nova.pid());
    let connections = 12;
    let _kept: Vec<std::net::TcpStream> = (0..connections)
        .map(|_| {
            let mut stream = std::net::TcpStream::connect(address).expect("connect");
            assert_eq!(get_on(&mut stream, page, RECORDS_MEDIA_TYPE).0, 200);
            stream
        })
        .collect();
    let grew = resident_bytes(nova.pid()).saturating_sub(before);
    eprintln!("the server grew {grew} bytes");
    let kept_each = (16u64 << 20) * connections;
    assert!(
        grew < kept_each / 2,
        "the server grew {grew} bytes after {connections} kept-alive connections read one page each"
    );
}

/// A head of more than 100 header fields is refused by the HTTP library (431, with no
/// body), as docs/api.md says; 100 are served.
#[test]
fn a_head_of_over_100_header_fields_is_refused() {
    let dir = tempdir();
    let nova = Nova::start(&dir.path().join("data"));
    let names: Vec<String> = (0..101).map(|i| format!("x-h{i}")).collect();
    let headers: Vec<(&str, &str)> = names.iter().map(|name| (name.as_str(), "v")).collect();
    assert_eq!(nova.call_with("GET", "/health", &headers[..101], None).status, 431);
    // Within the limit: the client adds its own few fields beside these.
    assert_eq!(nova.call_with("GET", "/health", &headers[..90], None).status, 200);
}

/// An append refused by a limit leaves no trace (producers.md), not even the stream its
/// bucket would have created: the limits are checked before the address is resolved.
#[test]
fn an_append_refused_by_a_limit_does_not_create_its_stream() {
    let dir = tempdir();
    let nova = Nova::start(&dir.path().join("data"));
    nova.ok("POST", "/v1/buckets/auto", Some(r#"{"create_stream_on_append":true}"#), 201);
    let big = format!(r#"{{"records":[{{"body":"{}"}}]}}"#, "x".repeat((1 << 20) + 1));
    let refused =
        nova.err("POST", "/v1/streams/auto/new/records", Some(&big), 400, "invalid_argument");
    let message = refused["message"].as_str().unwrap();
    assert!(message.contains("1048576"), "names the limit: {message}");
    let headers = r#"{"records":[{"body":"b","headers":[["","v"]]}]}"#;
    nova.err("POST", "/v1/streams/auto/new/records", Some(headers), 400, "invalid_argument");
    nova.err("GET", "/v1/streams/auto/new", None, 404, "not_found");
    let listed = nova.ok("GET", "/v1/streams/auto", None, 200);
    assert_eq!(listed["streams"], serde_json::json!([]), "{listed}");
    // The same batch within the limits creates it.
    nova.ok("POST", "/v1/streams/auto/new/records", Some(r#"{"records":[{"body":"b"}]}"#), 200);
    nova.ok("GET", "/v1/streams/auto/new", None, 200);
    drop(nova);

    // So does the journal's: a batch larger than one journal entry takes.
    let nova =
        Nova::start_with(&dir.path().join("small"), &["--journal-segment-bytes", "1MiB"], &[]);
    nova.ok("POST", "/v1/buckets/auto", Some(r#"{"create_stream_on_append":true}"#), 201);
    let record = format!(r#"{{"body":"{}"}}"#, "x".repeat(600 << 10));
    let two = format!(r#"{{"records":[{record},{record}]}}"#);
    let refused =
        nova.err("POST", "/v1/streams/auto/new/records", Some(&two), 400, "invalid_argument");
    assert!(refused["message"].as_str().unwrap().contains("1048576"), "{refused}");
    nova.err("GET", "/v1/streams/auto/new", None, 404, "not_found");
    drop(nova);

    // And the shard's memory budget's: a batch over the whole budget could never be
    // held, so it is refused for good (400), not asked to retry (429).
    let budget =
        ["--shard-memory-bytes", "16MiB", "--shards", "1", "--journal-segment-bytes", "64MiB"];
    let nova = Nova::start_with(&dir.path().join("budget"), &budget, &[]);
    nova.ok("POST", "/v1/buckets/auto", Some(r#"{"create_stream_on_append":true}"#), 201);
    let record = format!(r#"{{"body":"{}"}}"#, "x".repeat(1_000_000));
    let over = format!(r#"{{"records":[{}]}}"#, [record.as_str(); 17].join(","));
    let refused =
        nova.err("POST", "/v1/streams/auto/new/records", Some(&over), 400, "invalid_argument");
    let message = refused["message"].as_str().unwrap();
    assert!(message.contains("16777216") && message.contains("--shard-memory-bytes"), "{message}");
    nova.err("GET", "/v1/streams/auto/new", None, 404, "not_found");
    let under = format!(r#"{{"records":[{}]}}"#, [record.as_str(); 12].join(","));
    nova.ok("POST", "/v1/streams/auto/new/records", Some(&under), 200);
}

/// Names and query parameters that are not what they claim are refused, each naming
/// its field and what it takes: a `%` that starts no escape (else one key would have two
/// spellings), a parameter that is not UTF-8, a number out of its range, a flag that is
/// not one, a `Last-Event-ID` given twice.
#[test]
fn malformed_names_and_parameters_are_refused_by_name() {
    let dir = tempdir();
    let nova = Nova::start(&dir.path().join("data"));
    nova.ok("POST", "/v1/buckets/mal", None, 201);
    let message = |method: &str, path: &str| -> String {
        let refused = nova.err(method, path, None, 400, "invalid_argument");
        refused["message"].as_str().expect("a message").to_owned()
    };
    for (key, escape) in [("a%zz", "%zz"), ("a%2", "%2"), ("%", "%")] {
        let said = message("POST", &format!("/v1/streams/mal/{key}"));
        assert!(said.contains("stream key") && said.contains(&format!("{escape:?}")), "{said}");
    }
    nova.ok("POST", "/v1/streams/mal/a%25zz", None, 201);
    let listed = nova.ok("GET", "/v1/streams/mal", None, 200);
    assert_eq!(listed["streams"][0]["key"], "a%zz", "{listed}");
    let said = message("GET", "/v1/streams/mal?prefix=%FF");
    assert!(said.contains("query parameter prefix") && said.contains("UTF-8"), "{said}");
    let said = message("GET", "/v1/streams/mal?limit=-1");
    assert!(said.contains("from 1 to 1000"), "{said}");
    let said = message("GET", "/v1/streams/mal/a%25zz/records?seq_num=0&count=-1");
    assert!(said.contains("query parameter count") && said.contains("from 1"), "{said}");
    let said = message("GET", "/v1/streams/mal/a/records?count=99999999999999999999");
    assert!(said.contains(&format!("from 1 to {}", u64::MAX)), "{said}");
    let said = message("GET", "/v1/streams/mal/a%25zz/records?seq_num=0&clamp=yes");
    assert!(said.contains("true or false (or 1, 0"), "{said}");
    let twice = [("accept", "text/event-stream"), ("last-event-id", "2"), ("last-event-id", "5")];
    let refused = nova.call_with("GET", "/v1/streams/mal/a%25zz/records", &twice, None);
    assert_eq!(refused.status, 400, "{}", refused.text());
    assert!(refused.text().contains("Last-Event-ID is given twice"), "{}", refused.text());
}

/// A verb that takes no body (GET, DELETE) refuses one, as a body with an unknown field
/// is refused: a DELETE carrying a condition its sender believes holds must not delete
/// regardless. An empty body, or an empty JSON object, passes.
#[test]
fn a_verb_that_takes_no_body_refuses_one() {
    let dir = tempdir();
    let nova = Nova::start(&dir.path().join("data"));
    nova.ok("POST", "/v1/buckets/nob", None, 201);
    nova.ok("POST", "/v1/streams/nob/s", None, 201);
    let conditional = Some(r#"{"expected_id":"nope"}"#);
    let refused = nova.err("DELETE", "/v1/streams/nob/s", conditional, 400, "invalid_argument");
    let message = refused["message"].as_str().expect("a message");
    assert!(message.contains("DELETE takes no request body"), "{message}");
    assert!(message.contains("expected_id"), "{message}");
    nova.ok("GET", "/v1/streams/nob/s", None, 200);
    nova.err("DELETE", "/v1/buckets/nob", Some(r#"{"bogus":true}"#), 400, "invalid_argument");
    let garbage = nova.err("GET", "/v1/buckets/nob", Some("garbage"), 400, "invalid_argument");
    assert!(garbage["message"].as_str().unwrap().contains("not valid JSON"), "{garbage}");
    nova.ok("GET", "/v1/buckets/nob", Some("{}"), 200);
    nova.ok("DELETE", "/v1/streams/nob/s", Some(" {} "), 204);
    nova.err("GET", "/v1/streams/nob/s", None, 404, "not_found");
}

/// So does an append refused by the conditions it would meet on the stream its bucket
/// would create (decisions.md, "Appends"): its timestamping mode, its producer policy and
/// its `match_seq_num` are checked against the new stream before it is made.
#[test]
fn an_append_refused_by_a_new_streams_conditions_does_not_create_it() {
    let dir = tempdir();
    let nova = Nova::start(&dir.path().join("data"));
    let bucket = r#"{"create_stream_on_append":true,"default_producer_policy":"fenced",
        "default_timestamping_mode":"client-require"}"#;
    nova.ok("POST", "/v1/buckets/strict", Some(bucket), 201);
    let path = "/v1/streams/strict/new/records";
    let refused =
        nova.err("POST", path, Some(r#"{"records":[{"body":"b"}]}"#), 400, "invalid_argument");
    assert!(refused["message"].as_str().unwrap().contains("timestamp"), "{refused}");
    let stamped = r#"{"records":[{"body":"b","timestamp":5}]"#;
    let refused = nova.err("POST", path, Some(&format!("{stamped}}}")), 412, "failed_precondition");
    assert_eq!(refused["fencing_token"], "", "{refused}");
    let wrong_token = format!(r#"{stamped},"fencing_token":"w1"}}"#);
    let refused = nova.err("POST", path, Some(&wrong_token), 412, "failed_precondition");
    assert_eq!(refused["fencing_token"], "", "{refused}");
    let ahead = format!(r#"{stamped},"fencing_token":"","match_seq_num":3}}"#);
    let refused = nova.err("POST", path, Some(&ahead), 412, "failed_precondition");
    assert_eq!(refused["next_seq_num"], 0, "{refused}");
    nova.err("GET", "/v1/streams/strict/new", None, 404, "not_found");
    let listed = nova.ok("GET", "/v1/streams/strict", None, 200);
    assert_eq!(listed["streams"], serde_json::json!([]), "{listed}");
    // The batch that meets them creates it, with the bucket's defaults.
    let first = format!(r#"{stamped},"fencing_token":"","match_seq_num":0}}"#);
    let ack = nova.ok("POST", path, Some(&first), 200);
    assert_eq!(ack["end"]["seq_num"], 1, "{ack}");
    let stream = nova.ok("GET", "/v1/streams/strict/new", None, 200);
    assert_eq!(stream["producer_policy"], "fenced", "{stream}");
}

/// A standard stream's chunk grows with what is appended to it: small appends cut by
/// their delay do not each keep a `batch_max_bytes` buffer (8 MiB) in the cache, which
/// the memory budget, counting stored bytes, never saw.
#[test]
fn small_standard_appends_keep_about_what_they_hold() {
    let dir = tempdir();
    let nova = Nova::start(&dir.path().join("data"));
    let bucket = r#"{"create_stream_on_append":true,"default_batch_max_delay_ms":2}"#;
    nova.ok("POST", "/v1/buckets/small", Some(bucket), 201);
    let before = resident_bytes(nova.pid());
    let (producers, appends) = (8, 25);
    std::thread::scope(|scope| {
        for producer in 0..producers {
            let nova = &nova;
            scope.spawn(move || {
                let path = format!("/v1/streams/small/s{producer}/records");
                for _ in 0..appends {
                    nova.ok("POST", &path, Some(r#"{"records":[{"body":"hi"}]}"#), 200);
                }
            });
        }
    });
    let tail = nova.ok("GET", "/v1/streams/small/s0/tail", None, 200);
    assert_eq!(tail["tail"]["seq_num"], appends);
    let grew = resident_bytes(nova.pid()).saturating_sub(before);
    eprintln!("the server grew {grew} bytes");
    let chunks = producers * appends;
    assert!(grew < 64 << 20, "the server grew {grew} bytes for {chunks} one-record chunks");
}

/// Response memory (`--http-response-memory-bytes`): a page its client does not take
/// stays held, a read finding no room is refused naming the limit, a subscription waits
/// for room with heartbeats and then goes on with no gap, and everything is given back.
#[test]
fn response_pages_a_shard_holds_are_bounded() {
    let dir = tempdir();
    let flags =
        ["--shards", "1", "--http-response-memory-bytes", "16MiB", "--sse-heartbeat-ms", "200"];
    let nova = Nova::start_with(&dir.path().join("data"), &flags, &[]);
    let held = || nova.response_bytes_held();
    nova.ok("POST", "/v1/buckets/big", Some(r#"{"create_stream_on_append":true}"#), 201);
    common::append_large(&nova, "big/s", 5);
    nova.ok("POST", "/v1/buckets/sub", Some(r#"{"create_stream_on_append":true}"#), 201);
    append_bodies(&nova, "sub", &["a", "b"]);
    let mut subscription = subscribe(&nova, "sub", "seq_num=0", &[]);
    let first = event(&mut subscription);
    assert_eq!(first.event, "batch");
    assert_eq!(bodies(&serde_json::from_str(&first.data).unwrap()), ["a", "b"]);
    nova.ok("POST", "/v1/buckets/small", Some(r#"{"create_stream_on_append":true}"#), 201);
    let kib = "k".repeat(1024);
    for _ in 0..4 {
        append_bodies(&nova, "small", &[kib.as_str(); 250]);
    }
    nova.ok("POST", "/v1/buckets/one", Some(r#"{"create_stream_on_append":true}"#), 201);
    let half_mib = "h".repeat(512 << 10);
    append_bodies(&nova, "one", &[half_mib.as_str()]);

    // A reader asks for 252 records of 64 KiB and takes none of them: the page stays
    // held for as long as its client leaves it, and about 250 KiB stay free.
    let big = |count: u64| format!("/v1/streams/big/s/records?seq_num=0&count={count}");
    let mut stalled = nova.stalled_get(&big(252), RECORDS_MEDIA_TYPE, 252 << 16);
    let free = (16 << 20) - held();
    assert!((64 << 10..256 << 10).contains(&free), "{free} bytes free");
    // A read of 1 MiB of 1 KiB records is cut to what is free, in both formats: a
    // shorter page from its start, not a refusal.
    let page = nova.ok("GET", "/v1/streams/small/s/records?seq_num=0", None, 200);
    let json_records = page["records"].as_array().expect("records").len() as u64;
    assert!((32..1000).contains(&json_records), "{json_records} records in a cut JSON page");
    assert_eq!(page["next_seq_num"], json_records);
    let media = [("accept", "application/x-nova-records")];
    let page = nova.call_with("GET", "/v1/streams/small/s/records?seq_num=0", &media, None);
    assert_eq!(page.status, 200);
    let mut binary_records = 0;
    let mut at = 0;
    while let Some((frame, used)) = engine::framing::decode_frame(&page.body[at..]).unwrap() {
        if let engine::framing::Frame::Records(run) = frame {
            binary_records += run.iter().count() as u64;
        }
        at += used;
    }
    assert!(
        (32..1000).contains(&binary_records) && page.body.len() as u64 <= free,
        "{binary_records} records in a cut binary page of {} bytes",
        page.body.len()
    );
    // So is every page of a subscription, which then goes on page after page as its
    // client takes them: all 1,000 records, in order, none twice.
    let mut small = subscribe(&nova, "small", "seq_num=0&count=1000", &[]);
    let mut seq_nums = Vec::new();
    let started = Instant::now();
    loop {
        assert!(started.elapsed() < Duration::from_secs(30), "got {} records", seq_nums.len());
        let next = event(&mut small);
        match next.event.as_str() {
            "batch" => {
                let page: Value = serde_json::from_str(&next.data).unwrap();
                let records = page["records"].as_array().expect("records");
                assert!(records.len() < 1000, "a page of {} records was not cut", records.len());
                seq_nums.extend(records.iter().map(|r| r["seq_num"].as_u64().unwrap()));
            }
            "end" => break,
            _ => {}
        }
    }
    assert_eq!(seq_nums, (0..1000).collect::<Vec<u64>>());
    // A record alone larger than what is free cannot be cut: a read of it is refused,
    // and a subscription to it waits for room (with heartbeats) until the page fits.
    let refused = nova.call("GET", "/v1/streams/one/s/records?seq_num=0", None);
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert!(refused.text().contains("--http-response-memory-bytes"), "{}", refused.text());
    let mut one = subscribe(&nova, "one", "seq_num=0", &[]);
    let next = event(&mut one);
    assert_eq!(next.event, "ping", "a page that does not fit is not sent: {next:?}");
    assert_eq!(read_answer(&mut stalled).0, 200);
    let next = loop {
        let next = event(&mut one);
        if next.event != "ping" {
            break next;
        }
    };
    assert_eq!(bodies(&serde_json::from_str(&next.data).unwrap()), [half_mib.as_str()]);

    // A reader asks for 256 records and takes none: as large as the whole budget, the
    // page is held alone.
    let mut stalled = nova.stalled_get(&big(256), RECORDS_MEDIA_TYPE, 16 << 20);
    // Another read finds no room: refused, naming the limit, with Retry-After.
    let refused = nova.call("GET", "/v1/streams/sub/s/records?seq_num=0", None);
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert_eq!(refused.header("retry-after"), Some("1"));
    let message = refused.json()["message"].as_str().expect("a message").to_owned();
    assert!(message.contains("--http-response-memory-bytes") && message.contains("16777216"));
    // So is a new subscription, before its answer starts.
    let status = client::open(
        &nova.server,
        "GET",
        "/v1/streams/sub/s/records?seq_num=0",
        &[("accept", "text/event-stream")],
        None,
        Some(Duration::from_secs(30)),
    )
    .expect("subscribe")
    .status;
    assert_eq!(status, 429);
    // The subscription already open waits for room: records appended now are not sent,
    // heartbeats are.
    append_bodies(&nova, "sub", &["c", "d"]);
    for _ in 0..3 {
        let next = event(&mut subscription);
        assert_eq!(next.event, "ping", "nothing but heartbeats without room: {next:?}");
    }
    // The reader takes its page: everything it held is given back.
    let (status, page) = read_answer(&mut stalled);
    assert_eq!(status, 200);
    assert!(page.len() > 16 << 20, "{} bytes", page.len());
    drop(stalled);
    // The subscription goes on where it was: no record skipped, none twice.
    let mut got = Vec::new();
    while got.len() < 2 {
        let next = event(&mut subscription);
        if next.event == "batch" {
            got.extend(bodies(&serde_json::from_str(&next.data).unwrap()));
        }
    }
    assert_eq!(got, ["c", "d"]);
    append_bodies(&nova, "sub", &["e"]);
    let next = loop {
        let next = event(&mut subscription);
        if next.event != "ping" {
            break next;
        }
    };
    assert_eq!(bodies(&serde_json::from_str(&next.data).unwrap()), ["e"]);
    nova.ok("GET", "/v1/streams/sub/s/records?seq_num=0", None, 200);
    assert_eq!(held(), 0, "every page taken, nothing held");
}

#[test]
fn a_request_head_past_the_limit_is_refused_naming_it() {
    let dir = tempdir();
    let nova = Nova::start_with(&dir.path().join("data"), &["--http-head-bytes-max", "16KiB"], &[]);
    let padding = "x".repeat(16 << 10);
    let refused = nova.call_with("GET", "/health", &[("x-padding", &padding)], None);
    assert_eq!(refused.status, 400, "{}", refused.text());
    let error = refused.json();
    assert_eq!(error["code"], "invalid_argument", "{error}");
    let message = error["message"].as_str().expect("a message");
    assert!(message.contains("over the limit of 16384 bytes (--http-head-bytes-max)"), "{message}");
    // The request target counts too.
    let long_key = "k".repeat(16 << 10);
    let refused = nova.call("GET", &format!("/v1/streams/apps/{long_key}"), None);
    assert_eq!(refused.status, 400, "{}", refused.text());
    // A head within the limit (the client's own headers are under 200 bytes) is served.
    let padding = "x".repeat((16 << 10) - 200);
    assert_eq!(nova.call_with("GET", "/health", &[("x-padding", &padding)], None).status, 200);
}

/// A log that is open but never read fills its pipe (64 KiB here); the server logs
/// through a thread of its own, so its shards go on answering, the lines past the queue
/// are counted, and it still stops on SIGTERM.
#[test]
fn a_log_nobody_reads_stops_no_request() {
    let dir = tempdir();
    // Every request logged (0 ms is slow enough), none held back by the rate, and room
    // for 64 lines waiting.
    let flags = [
        "--http-log-slow-ms",
        "0",
        "--http-log-lines-per-second",
        "1000000",
        "--log-queue-lines",
        "64",
    ];
    let nova = Nova::start_with_stderr_unread(&dir.path().join("data"), &flags);
    // Each line is over 150 bytes: 2000 are several times what the pipe holds.
    // Each answered within 10 s: a shard blocked on the pipe would answer none.
    for i in 0..2000 {
        let path = format!("/v1/buckets/none-{i}");
        let patience = Some(Duration::from_secs(10));
        let answer = net::client::http::open(&nova.server, "GET", &path, &[], None, patience)
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        assert_eq!(answer.status, 404, "GET {path}");
    }
    let metrics = nova.call("GET", "/metrics", None).text();
    let dropped: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("nova_log_lines_dropped_total ")?.parse().ok())
        .expect("the dropped lines' counter");
    assert!(dropped > 0, "2000 lines fit a pipe nobody reads? {metrics}");
    let started = Instant::now();
    assert!(nova.terminate().success());
    assert!(started.elapsed() < Duration::from_secs(20), "stopping took {:?}", started.elapsed());
}

/// A stream trimmed under a subscriber that is behind: what it had queued before the
/// trim still arrives, then it goes on from the trim watermark (streams.md: a start
/// below it moves up to it), in order, with every record from there to the tail.
#[test]
fn a_subscription_behind_a_trim_moves_up_to_the_watermark() {
    const WATERMARK: u64 = 900;
    let dir = tempdir();
    let nova = Nova::start(&dir.path().join("data"));
    let mut stream = a_stalled_subscription(&nova, "trimmed", &"t".repeat(16 << 10));
    let trim = json!({"seq_num": WATERMARK}).to_string();
    nova.ok("POST", "/v1/streams/trimmed/s/trim", Some(&trim), 200);
    let mut seen: Vec<u64> = Vec::new();
    while seen.last() != Some(&1023) {
        let next = event(&mut stream);
        if next.event == "batch" {
            let data: Value = serde_json::from_str(&next.data).expect("json");
            let records = data["records"].as_array().expect("records");
            seen.extend(records.iter().map(|r| r["seq_num"].as_u64().expect("seq_num")));
        } else {
            assert_eq!(next.event, "ping", "{}", next.data);
        }
    }
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "in order, never twice");
    let below = seen.iter().filter(|&&seq| seq < WATERMARK).count() as u64;
    assert!(below < WATERMARK, "the premise: the subscription was behind the trim: {below}");
    assert_eq!(seen[below as usize..], (WATERMARK..1024).collect::<Vec<_>>()[..]);
    assert_eq!(seen[..below as usize], (0..below).collect::<Vec<_>>()[..], "what was queued");
}

/// A graceful stop does not wait out `--http-idle-timeout-ms` (2 minutes here) for a
/// subscriber that stopped reading, nor for a connection that never sent a request: both
/// are closed within `--http-shutdown-idle-ms`.
#[test]
fn a_stop_closes_connections_that_take_or_send_nothing() {
    let dir = tempdir();
    let nova = Nova::start(&dir.path().join("data"));
    let stalled = a_stalled_subscription(&nova, "stalled", &"s".repeat(16 << 10));
    let address = nova.url.trim_start_matches("http://").to_owned();
    let silent = std::net::TcpStream::connect(&address).expect("connect");
    while nova.metric("nova_http_connections_open") < 3 {
        std::thread::yield_now();
    }
    let started = Instant::now();
    let exit = nova.terminate();
    assert!(exit.success(), "{exit}");
    assert!(started.elapsed() < Duration::from_secs(20), "stopping took {:?}", started.elapsed());
    drop((stalled, silent));
}

/// A stop held up (here by a standard append waiting on a store that is down, with a
/// drain time of ten minutes) ends at once on a second signal, with 128 + its number, and
/// what was acknowledged before is all there after a restart: express records that only
/// the journal held among them.
#[test]
fn a_second_sigterm_ends_a_stop_at_once_and_loses_nothing_acknowledged() {
    let moto = s3::testing::Moto::start();
    moto.create_bucket("nova");
    let proxy = s3::testing::Proxy::start(moto.port, Vec::new());
    let dir = tempdir();
    let data = dir.path().join("data");
    let s3 = common::s3_flags(&proxy.endpoint());
    let flags: Vec<&str> = s3.iter().map(String::as_str).collect();
    let drain = ["--uploader-drain-ms", "600000"];
    let nova = Nova::start_with(&data, &[&flags[..], &drain[..]].concat(), &[]);
    nova.ok("POST", "/v1/buckets/held", Some(r#"{"create_stream_on_append":true}"#), 201);
    let append = |class: &str| {
        let records = format!(r#"{{"records":[{{"body":"{class} 0"}},{{"body":"{class} 1"}}]}}"#);
        nova.ok("POST", &format!("/v1/streams/held/{class}/records"), Some(&records), 200);
    };
    for class in ["standard", "express"] {
        let body = format!(r#"{{"class":"{class}"}}"#);
        nova.ok("POST", &format!("/v1/streams/held/{class}"), Some(&body), 201);
    }
    append("standard");
    proxy.set_down(true);
    // Acknowledged from the journal alone: the store is down, so only the journal holds
    // these when the process exits.
    append("express");
    let started = std::thread::scope(|scope| {
        // Cut unanswered (its connection closed) or answered unavailable: never 200.
        let held = scope.spawn(|| {
            let body = br#"{"records":[{"body":"held"}]}"#;
            let path = "/v1/streams/held/standard/records";
            net::client::http::open(&nova.server, "POST", path, &[], Some(body), None)
                .map(|answer| answer.status)
        });
        while nova.metric("nova_http_requests_in_flight") < 2 {
            std::thread::yield_now();
        }
        let signal = || {
            // SAFETY: kill(2) on our own child, which has not been waited for.
            assert_eq!(unsafe { libc::kill(nova.pid(), libc::SIGTERM) }, 0);
        };
        signal();
        // The first signal is heard once the server stops accepting.
        let address = nova.url.trim_start_matches("http://").to_owned();
        while std::net::TcpStream::connect(&address).is_ok() {
            std::thread::yield_now();
        }
        let started = Instant::now();
        signal();
        let held = held.join().expect("the held append");
        assert!(held.as_ref().is_ok_and(|&status| status == 503) || held.is_err(), "{held:?}");
        started
    });
    let status = nova.wait_exit();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the second signal took {:?}",
        started.elapsed()
    );
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status}");
    proxy.set_down(false);
    let nova = Nova::start_with(&data, &flags, &[]);
    for class in ["standard", "express"] {
        let read =
            nova.ok("GET", &format!("/v1/streams/held/{class}/records?seq_num=0"), None, 200);
        assert_eq!(bodies(&read), [format!("{class} 0"), format!("{class} 1")], "{class}: {read}");
    }
}

/// While the object store is down, `/health` still answers 200 (a restart cannot bring
/// the store back) but says degraded and how many PUTs fail, as `/metrics` does, and why
/// only to a caller whose token may read `/metrics`; the standard append waiting
/// meanwhile is acknowledged once the store is back, and `/health` says serving again.
#[test]
fn health_says_degraded_while_the_object_store_is_down() {
    let moto = s3::testing::Moto::start();
    moto.create_bucket("nova");
    let proxy = s3::testing::Proxy::start(moto.port, Vec::new());
    let dir = tempdir();
    let root = dir.path().join("root-token");
    std::fs::write(&root, "root-token-for-tests-0123456789\n").expect("write the root token");
    let mut flags = common::s3_flags(&proxy.endpoint());
    flags.extend(["--root-token-file".into(), root.to_str().expect("UTF-8").into()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let log = dir.path().join("log");
    let nova = Nova::start_logging(&dir.path().join("data"), &flags, &log);
    let logged = |line: &str| std::fs::read_to_string(&log).is_ok_and(|text| text.contains(line));
    let bearer = [("authorization", "Bearer root-token-for-tests-0123456789")];
    let call = |method: &str, path: &str, body: Option<&str>, token: bool| {
        let headers = if token { &bearer[..] } else { &[] };
        let response = nova.call_with(method, path, headers, body.map(str::as_bytes));
        assert!((200..300).contains(&response.status), "{method} {path}: {}", response.text());
        response.json()
    };
    let metric = |name: &str| -> u64 {
        let text = nova.call_with("GET", "/metrics", &bearer, None).text();
        let line = text.lines().find(|line| line.starts_with(&format!("{name} ")));
        line.and_then(|line| line.rsplit(' ').next()?.parse().ok()).expect(name)
    };
    call("POST", "/v1/buckets/held", Some(r#"{"create_stream_on_append":true}"#), true);
    let path = "/v1/streams/held/standard/records";
    call("POST", path, Some(r#"{"records":[{"body":"before"}]}"#), true);
    assert_eq!(call("GET", "/health", None, false), json!({"status": "serving"}));
    assert_eq!(metric("nova_uploader_puts_failing"), 0);
    proxy.set_down(true);
    std::thread::scope(|scope| {
        let held =
            scope.spawn(|| call("POST", path, Some(r#"{"records":[{"body":"held"}]}"#), true));
        let mut health = Value::Null;
        wait_until("health says degraded", || {
            health = call("GET", "/health", None, false);
            health["status"] == "degraded"
        });
        assert!(health["object_puts_failing"].as_u64() >= Some(1), "{health}");
        assert!(health["object_store_failing_ms"].as_u64().is_some(), "{health}");
        let message = health["message"].as_str().expect("a message");
        let said = "standard appends wait until the store takes them";
        assert!(
            message.contains(" object PUTs failing for ") && message.ends_with(said),
            "{message}"
        );
        // The root token may read /metrics, so it is told the error too.
        let told = call("GET", "/health", None, true);
        let message = told["message"].as_str().expect("a message");
        assert!(message.contains(&format!("{said}: ")), "{told}");
        assert!(metric("nova_uploader_puts_failing") >= 1);
        // The failing PUT's bundle is held as being uploaded, retries and all.
        assert!(metric("nova_uploader_bytes_uploading") > 0);
        assert!(!held.is_finished(), "a standard append waits for the store");
        wait_until("the log says so", || logged("nova: object store failing: "));
        proxy.set_down(false);
        assert_eq!(held.join().expect("the held append")["start"]["seq_num"], 1);
    });
    wait_until("health says serving", || {
        call("GET", "/health", None, false) == json!({"status": "serving"})
    });
    assert_eq!(metric("nova_uploader_puts_failing"), 0);
    assert_eq!(metric("nova_uploader_failing_seconds"), 0);
    wait_until("the uploader holds nothing", || metric("nova_uploader_bytes_uploading") == 0);
    wait_until("the log says the store is back", || logged("nova: object store takes PUTs again"));
}

fn sigterm_case(store: Store) {
    let dir = tempdir();
    let data = dir.path().join("data");
    let nova = Nova::start_in(store.clone(), &data, &[], &[]);
    nova.ok("POST", "/v1/buckets/keep", Some(r#"{"create_stream_on_append":true}"#), 201);
    for class in ["standard", "express"] {
        nova.ok(
            "POST",
            &format!("/v1/streams/keep/{class}"),
            Some(&format!(r#"{{"class":"{class}"}}"#)),
            201,
        );
        for i in 0..3 {
            nova.ok(
                "POST",
                &format!("/v1/streams/keep/{class}/records"),
                Some(&format!(r#"{{"records":[{{"body":"{class}{i}"}}]}}"#)),
                200,
            );
        }
    }
    // A long poll in flight when the signal comes is answered, not cut.
    let status = std::thread::scope(|scope| {
        let poll = scope
            .spawn(|| nova.call("GET", "/v1/streams/keep/express/records?seq_num=3&wait=30", None));
        // The poll is in flight once the server counts it (with the metrics request itself).
        while nova.metric("nova_http_requests_in_flight") < 2 {
            std::thread::yield_now();
        }
        let pid = nova.pid();
        // SAFETY: kill(2) on our own child, which has not been waited for.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let answered = poll.join().expect("poll");
        assert_eq!(answered.status, 200, "{}", answered.text());
        answered.status
    });
    assert_eq!(status, 200);
    let exit = nova.wait_exit();
    assert!(exit.success(), "{exit}");
    let on_s3 = matches!(store, Store::S3(_));
    let nova = Nova::start_in(store, &data, &[], &[]);
    // With --s3-bucket the objects are in the bucket, not in the data directory.
    let local_objects = std::fs::read_dir(data.join("objects")).map_or(0, |dir| dir.count());
    assert_eq!(local_objects == 0, on_s3, "{local_objects} entries in the object directory");
    for class in ["standard", "express"] {
        assert_eq!(
            read_all(&nova, &format!("/v1/streams/keep/{class}")),
            [0, 1, 2].map(|i| format!("{class}{i}"))
        );
    }
}

/// Every record's body, paging until the tail (a page may end early, at a chunk).
fn read_all(nova: &Nova, stream: &str) -> Vec<String> {
    let mut all = Vec::new();
    let mut next = 0;
    loop {
        let page = nova.ok("GET", &format!("{stream}/records?seq_num={next}"), None, 200);
        all.extend(bodies(&page));
        next = page["next_seq_num"].as_u64().expect("next_seq_num");
        if next == page["tail"]["seq_num"].as_u64().expect("tail") {
            return all;
        }
    }
}

fn read_plan_lists_the_objects_holding_records(nova: &Nova) {
    nova.ok("POST", "/v1/buckets/pln", Some(r#"{"create_stream_on_read":true}"#), 201);
    nova.ok("POST", "/v1/streams/pln/s", Some(r#"{"class":"standard"}"#), 201);
    for i in 0..3 {
        nova.ok(
            "POST",
            "/v1/streams/pln/s/records",
            Some(&format!(r#"{{"records":[{{"body":"p{i}"}},{{"body":"q{i}"}}]}}"#)),
            200,
        );
    }
    // Standard appends are acknowledged from the object store: every record is in an extent.
    let plan = nova.ok("GET", "/v1/streams/pln/s/plan?seq_num=0", None, 200);
    assert_eq!(plan["tail"]["seq_num"], 6, "{plan}");
    assert_eq!(plan["memory_from_seq_num"], Value::Null, "{plan}");
    let extents = plan["extents"].as_array().expect("extents");
    assert_eq!(extents[0]["first_seq_num"], 0, "{plan}");
    let mut next = 0;
    for extent in extents {
        assert_eq!(extent["first_seq_num"].as_u64(), Some(next), "extents tile: {plan}");
        next += extent["count"].as_u64().expect("count");
        assert!(extent["object"].as_str().is_some_and(|o| !o.is_empty()), "{plan}");
        assert!(extent["length"].as_u64().is_some_and(|l| l > 64), "{plan}");
    }
    assert_eq!(next, 6, "{plan}");
    let plan = nova.ok("GET", "/v1/streams/pln/s/plan?seq_num=4&count=1", None, 200);
    let extents = plan["extents"].as_array().expect("extents");
    assert!(!extents.is_empty(), "{plan}");
    let first = extents[0]["first_seq_num"].as_u64().expect("first");
    assert!(first <= 4 && first + extents[0]["count"].as_u64().expect("count") > 4, "{plan}");
    // Never creates, even where reads would; bad bounds are named.
    nova.err("GET", "/v1/streams/pln/ghost/plan", None, 404, "not_found");
    nova.err("GET", "/v1/streams/pln/ghost/tail", None, 404, "not_found");
    let bad = nova.err("GET", "/v1/streams/pln/s/plan?wait=1", None, 400, "invalid_argument");
    assert!(bad["message"].as_str().expect("message").contains("wait"), "{bad}");
    nova.err("GET", "/v1/streams/pln/s/plan?seq_num=99", None, 416, "out_of_range");
    assert_eq!(nova.call("POST", "/v1/streams/pln/s/plan", None).status, 405);
    // A plan from below the trim watermark starts at it: the extent still holds the
    // trimmed record, and start_seq_num tells the client to skip it.
    assert_eq!(plan["start_seq_num"], 4, "{plan}");
    nova.ok("POST", "/v1/streams/pln/s/trim", Some(r#"{"seq_num":3}"#), 200);
    let plan = nova.ok("GET", "/v1/streams/pln/s/plan?seq_num=0", None, 200);
    assert_eq!(plan["start_seq_num"], 3, "{plan}");
    let first = &plan["extents"][0];
    assert_eq!((first["first_seq_num"].as_u64(), first["count"].as_u64()), (Some(2), Some(2)));
    let read = nova.ok("GET", "/v1/streams/pln/s/records?seq_num=0&count=1", None, 200);
    assert_eq!(bodies(&read), ["q1"], "a read starts at the watermark too");
}

/// Reads the binary frames of a subscription: the records' bodies and the other frames.
fn binary_frame(stream: &mut client::Streaming) -> engine::framing::Frame<'static> {
    use engine::framing::decode_frame;
    use std::io::Read;
    let mut len = [0u8; 4];
    stream.body.read_exact(&mut len).expect("a frame length");
    let mut frame = len.to_vec();
    frame.resize(4 + u32::from_le_bytes(len) as usize, 0);
    stream.body.read_exact(&mut frame[4..]).expect("a whole frame");
    let frame: &'static [u8] = Box::leak(frame.into_boxed_slice());
    let (decoded, used) = decode_frame(frame).expect("a valid frame").expect("complete");
    assert_eq!(used, frame.len());
    decoded
}

/// The next page of a binary subscription (heartbeats before it skipped): the records
/// of its records frames, and its page end's next seq_num and tail.
fn binary_page(
    stream: &mut client::Streaming,
) -> (Vec<(u64, String)>, u64, engine::position::Tail) {
    use engine::framing::Frame;
    let mut records = Vec::new();
    loop {
        match binary_frame(stream) {
            Frame::Heartbeat(_) if records.is_empty() => {}
            frame @ Frame::Records(_) => records.extend(frame_bodies(&frame)),
            Frame::PageEnd { next_seq_num, tail } if !records.is_empty() => {
                return (records, next_seq_num, tail);
            }
            other => panic!("expected a page's frames, got {other:?}"),
        }
    }
}

fn frame_bodies(frame: &engine::framing::Frame<'_>) -> Vec<(u64, String)> {
    let engine::framing::Frame::Records(run) = frame else { panic!("not records: {frame:?}") };
    run.iter()
        .map(|(seq_num, _, stored)| {
            let record = engine::record::decode(stored).expect("a record");
            (seq_num, String::from_utf8(record.body().to_vec()).expect("text"))
        })
        .collect()
}

/// The shared servers send a heartbeat every 200 ms.
fn binary_subscription_follows_live_records_and_ends(nova: &Nova) {
    use engine::framing::Frame;
    let bucket = r#"{"default_class":"express","create_stream_on_read":true}"#;
    nova.ok("POST", "/v1/buckets/bsub", Some(bucket), 201);
    nova.ok("POST", "/v1/streams/bsub/s", None, 201);
    let append = |body: &str| {
        let body = format!(r#"{{"records":[{{"body":"{body}"}}]}}"#);
        nova.ok("POST", "/v1/streams/bsub/s/records", Some(&body), 200);
    };
    append("h0");
    append("h1");
    let accept = [("accept", "application/x-nova-records; subscribe=true")];
    let open = |query: &str, headers: &[(&str, &str)]| {
        let stream = client::open(
            &nova.server,
            "GET",
            &format!("/v1/streams/bsub/s/records?{query}"),
            headers,
            None,
            Some(Duration::from_secs(30)),
        )
        .expect("subscribe");
        assert_eq!(stream.status, 200);
        assert_eq!(stream.header("content-type"), Some("application/x-nova-records"));
        stream
    };
    let mut stream = open("seq_num=0", &accept);
    let (seen, next_seq_num, tail) = binary_page(&mut stream);
    assert_eq!(seen, [(0, "h0".to_owned()), (1, "h1".to_owned())]);
    // Each page ends with the tail, as a read's does.
    assert_eq!((next_seq_num, tail.seq_num), (2, 2));
    // Idle: a heartbeat with the tail.
    match binary_frame(&mut stream) {
        Frame::Heartbeat(tail) => assert_eq!(tail.seq_num, 2),
        other => panic!("expected a heartbeat, got {other:?}"),
    }
    append("l2");
    let (live, next_seq_num, tail) = binary_page(&mut stream);
    assert_eq!(live, [(2, "l2".to_owned())]);
    assert_eq!((next_seq_num, tail.seq_num), (3, 3));
    // Deleting the stream ends it with not_found, though the bucket creates on read.
    assert_eq!(nova.call("DELETE", "/v1/streams/bsub/s", None).status, 204);
    let end = loop {
        let frame = binary_frame(&mut stream);
        if !matches!(frame, Frame::Heartbeat(_)) {
            break frame;
        }
    };
    let Frame::Error(text) = end else { panic!("{end:?}") };
    assert_eq!(serde_json::from_str::<Value>(text).expect("json")["code"], "not_found");
    // A bound ends it with an end frame; Last-Event-ID resumes after the seq_num it names.
    nova.ok("POST", "/v1/streams/bsub/t", None, 201);
    for i in 0..4 {
        let body = format!(r#"{{"records":[{{"body":"t{i}"}}]}}"#);
        nova.ok("POST", "/v1/streams/bsub/t/records", Some(&body), 200);
    }
    let mut stream = client::open(
        &nova.server,
        "GET",
        "/v1/streams/bsub/t/records?seq_num=0&count=2",
        &[accept[0], ("last-event-id", "0")],
        None,
        Some(Duration::from_secs(30)),
    )
    .expect("subscribe");
    let mut seen = Vec::new();
    let end = loop {
        let frame = binary_frame(&mut stream);
        match frame {
            Frame::Records(_) => seen.extend(frame_bodies(&frame)),
            // The tail when the page was read: all 4 records, though the bound stops at 2.
            Frame::PageEnd { next_seq_num, tail } => {
                assert_eq!((next_seq_num, tail.seq_num), (3, 4))
            }
            other => break other,
        }
    };
    assert_eq!(seen, [(1, "t1".to_owned()), (2, "t2".to_owned())]);
    assert_eq!(end, Frame::End);
    // A plain binary Accept is still a one-page read.
    let page = nova.call_with(
        "GET",
        "/v1/streams/bsub/t/records?seq_num=0",
        &[("accept", "application/x-nova-records")],
        None,
    );
    assert_eq!(page.status, 200);
}

fn subscribe_binary(nova: &Nova, bucket: &str, query: &str) -> client::Streaming {
    open_subscription(nova, bucket, query, "application/x-nova-records; subscribe=true", &[])
}

/// Reads a binary subscription to its end: the records of its records frames (heartbeats
/// are skipped), up to the end frame, after which the stream must close.
fn binary_records_then_end(stream: &mut client::Streaming) -> Vec<(u64, String)> {
    use engine::framing::Frame;
    let mut seen = Vec::new();
    loop {
        let frame = binary_frame(stream);
        match frame {
            Frame::Records(_) => seen.extend(frame_bodies(&frame)),
            Frame::Heartbeat(_) | Frame::PageEnd { .. } => {}
            Frame::End => break,
            other => panic!("unexpected frame {other:?}"),
        }
    }
    assert!(stream.body.fill_buf().expect("read").is_empty(), "closes at end");
    seen
}

/// The binary framing of `subscription_bytes_bound_the_whole_subscription`.
fn binary_subscription_bytes_bound_the_whole_subscription(nova: &Nova) {
    use engine::framing::Frame;
    create_three_then_two(nova, "bsubb");
    // aaa fits 4; bbb does not fit the 1 left.
    let mut stream = subscribe_binary(nova, "bsubb", "seq_num=0&bytes=4");
    assert_eq!(binary_records_then_end(&mut stream), owned(&[(0, "aaa")]));
    // ccc, then ddd (another chunk), fit 7; eee does not fit the 1 left.
    let mut stream = subscribe_binary(nova, "bsubb", "seq_num=2&bytes=7");
    assert_eq!(binary_records_then_end(&mut stream), owned(&[(2, "ccc"), (3, "ddd")]));
    // The first record is delivered though alone it exceeds the budget.
    let mut stream = subscribe_binary(nova, "bsubb", "seq_num=0&bytes=2");
    assert_eq!(binary_records_then_end(&mut stream), owned(&[(0, "aaa")]));
    // At the live tail: fff fits 4; ggg does not fit the 1 left.
    let mut stream = subscribe_binary(nova, "bsubb", "seq_num=5&bytes=4");
    assert!(matches!(binary_frame(&mut stream), Frame::Heartbeat(_)), "idle at the tail");
    append_bodies(nova, "bsubb", &["fff"]);
    assert_eq!(binary_page(&mut stream).0, owned(&[(5, "fff")]));
    append_bodies(nova, "bsubb", &["ggg"]);
    assert_eq!(binary_records_then_end(&mut stream), []);
    // At the live tail, a first record larger than the budget is delivered, then it ends.
    let mut stream = subscribe_binary(nova, "bsubb", "seq_num=7&bytes=2");
    assert!(matches!(binary_frame(&mut stream), Frame::Heartbeat(_)), "idle at the tail");
    append_bodies(nova, "bsubb", &["hhh"]);
    assert_eq!(binary_records_then_end(&mut stream), owned(&[(7, "hhh")]));
}

suite!(
    read_plan_lists_the_objects_holding_records,
    binary_subscription_follows_live_records_and_ends,
    health_metrics_and_request_ids,
    seed_examples_work_verbatim_with_curl,
    bucket_verbs_and_their_errors,
    stream_verbs_and_their_errors,
    append_read_and_their_conditions,
    throughput_cap_answers_resource_exhausted_with_retry_after,
    request_bodies_over_the_limit_are_refused_before_they_are_read,
    base64_round_trips_all_256_byte_values,
    concurrent_producers_batches_stay_contiguous,
    long_poll_returns_when_records_arrive,
    a_read_from_the_tail_until_its_last_stamp_is_complete_at_once,
    subscription_delivers_history_then_live_records_and_ends,
    subscription_resumes_after_last_event_id_and_ends_at_a_bound,
    subscription_bytes_bound_the_whole_subscription,
    binary_subscription_bytes_bound_the_whole_subscription,
    binary_framing_appends_and_reads,
    a_binary_body_in_pieces_is_appended_whole,
    append_sessions_ack_in_order_and_end_at_a_refusal,
);

/// Every limit of limits.md the other tests do not reach, at its edge: the value at the
/// limit is taken, one past it refused with invalid_argument naming the field and the
/// limit; and the producer policy, timestamping and autocreate-on-read rules over HTTP.
#[test]
fn limits_at_their_edges_and_policies_over_http() {
    let dir = tempdir();
    let nova = Nova::start(&dir.path().join("data"));
    let refused = |method: &str, path: &str, body: &str, names: &[&str]| {
        let bad = nova.err(method, path, Some(body), 400, "invalid_argument");
        let message = bad["message"].as_str().expect("a message");
        for name in names {
            assert!(message.contains(name), "{message:?} does not name {name:?}");
        }
    };

    // Creation tokens: 64 bytes.
    let token = |n: usize| format!(r#"{{"creation_token":"{}"}}"#, "t".repeat(n));
    refused("POST", "/v1/buckets/lim", &token(65), &["creation token", "64"]);
    nova.ok("POST", "/v1/buckets/lim", Some(&token(64)), 201);
    refused("POST", "/v1/streams/lim/s", &token(65), &["creation token", "64"]);
    nova.ok("POST", "/v1/streams/lim/s", Some(&token(64)), 201);

    // Fencing tokens set by Fence: 36 bytes.
    let fence = |n: usize| format!(r#"{{"fencing_token":"{}"}}"#, "f".repeat(n));
    refused("POST", "/v1/streams/lim/s/fence", &fence(37), &["fencing_token", "36"]);
    nova.ok("POST", "/v1/streams/lim/s/fence", Some(&fence(36)), 200);
    let fenced_by = "f".repeat(36);
    // An expected token over the limit is refused as too long, not as a mismatch.
    let expected = format!(r#"{{"fencing_token":"g","expected":"{}"}}"#, "e".repeat(37));
    refused("POST", "/v1/streams/lim/s/fence", &expected, &["expected", "36"]);

    // Headers per record: 100.
    let with_headers = |n: usize| {
        let headers: Vec<Value> = (0..n).map(|i| json!([format!("h{i}"), "v"])).collect();
        json!({"records": [{"body": "x", "headers": headers}], "fencing_token": fenced_by})
            .to_string()
    };
    refused("POST", "/v1/streams/lim/s/records", &with_headers(101), &["header", "100"]);
    nova.ok("POST", "/v1/streams/lim/s/records", Some(&with_headers(100)), 200);

    // A record's content (body, header names and values): 1 MiB, inclusive.
    let sized = |n: usize| {
        let record = json!({"body": "b".repeat(n - 1), "headers": [["k", ""]]});
        json!({"records": [record], "fencing_token": fenced_by}).to_string()
    };
    refused("POST", "/v1/streams/lim/s/records", &sized((1 << 20) + 1), &["1048576"]);
    nova.ok("POST", "/v1/streams/lim/s/records", Some(&sized(1 << 20)), 200);

    // Records per batch: 100,000.
    let many = |n: usize| {
        json!({"records": vec![json!({"body": "x"}); n], "fencing_token": fenced_by}).to_string()
    };
    refused("POST", "/v1/streams/lim/s/records", &many(100_001), &["100000"]);
    let ack = nova.ok("POST", "/v1/streams/lim/s/records", Some(&many(100_000)), 200);
    assert_eq!(
        ack["end"]["seq_num"].as_u64().unwrap() - ack["start"]["seq_num"].as_u64().unwrap(),
        100_000
    );

    // List pages: 1 to 1000 entries.
    refused("GET", "/v1/buckets?limit=1001", "", &["limit", "1000"]);
    refused("GET", "/v1/streams/lim?limit=1001", "", &["limit", "1000"]);
    refused("GET", "/v1/streams/lim?limit=0", "", &["limit"]);
    nova.ok("GET", "/v1/streams/lim?limit=1000", None, 200);

    // Under the fenced policy an append without a token is refused with the current one;
    // an explicit empty token matches a stream whose token was never set.
    nova.ok("POST", "/v1/streams/lim/fenced", Some(r#"{"producer_policy":"fenced"}"#), 201);
    let bare = nova.err(
        "POST",
        "/v1/streams/lim/fenced/records",
        Some(r#"{"records":[{"body":"x"}]}"#),
        412,
        "failed_precondition",
    );
    assert_eq!(bare["fencing_token"], "", "{bare}");
    let empty = r#"{"records":[{"body":"x"}],"fencing_token":""}"#;
    nova.ok("POST", "/v1/streams/lim/fenced/records", Some(empty), 200);

    // Timestamping: client-require needs a stamp on every record; arrival takes none.
    nova.ok("POST", "/v1/streams/lim/req", Some(r#"{"timestamping_mode":"client-require"}"#), 201);
    let partly = r#"{"records":[{"body":"a","timestamp":5},{"body":"b"}]}"#;
    refused("POST", "/v1/streams/lim/req/records", partly, &["timestamp"]);
    let stamped = r#"{"records":[{"body":"a","timestamp":5},{"body":"b","timestamp":6}]}"#;
    nova.ok("POST", "/v1/streams/lim/req/records", Some(stamped), 200);
    nova.ok("POST", "/v1/streams/lim/arr", Some(r#"{"timestamping_mode":"arrival"}"#), 201);
    refused("POST", "/v1/streams/lim/arr/records", partly, &["timestamp"]);
    nova.ok("POST", "/v1/streams/lim/arr/records", Some(r#"{"records":[{"body":"a"}]}"#), 200);
    // Uncapped stamps and age retention together, refused at create.
    refused(
        "POST",
        "/v1/streams/lim/unc",
        r#"{"timestamping_uncapped":true,"retention_max_age_ms":60000}"#,
        &["timestamping_uncapped", "retention_max_age_ms"],
    );

    // A bucket that creates streams on read: a read of a missing key creates it.
    nova.ok("POST", "/v1/buckets/onread", Some(r#"{"create_stream_on_read":true}"#), 201);
    let page = nova.ok("GET", "/v1/streams/onread/new/records?seq_num=0", None, 200);
    assert_eq!(page["records"], json!([]));
    nova.ok("GET", "/v1/streams/onread/new", None, 200);
}

/// A subscription follows one stream: deleted and created again at the same address
/// between two of its pages (the subscriber not reading, so the subscription waits to
/// send, not in a read), the new stream is another, and the subscription ends with
/// not_found after the old stream's records, never sending one of the new stream's.
#[test]
fn a_subscription_ends_when_its_stream_is_recreated_under_it() {
    // The new stream longer than the old one (a read at the subscription's next position
    // finds records of it) and shorter (that position is past its tail).
    for new_records in [2048, 1] {
        recreated_under_a_subscription(new_records);
    }
}

/// A subscription from the start of stream `s` of a new bucket `bucket`, over 16 MiB of
/// history (1,024 records of `body`, 16 KiB) that its client does not read: more than
/// the subscription's queue, hyper's buffer and the sockets hold (its client's receive
/// buffer is made small, whatever the host's TCP buffer sizes), so it stops reading
/// pages on a full queue before its end. Returned once it has.
fn a_stalled_subscription(nova: &Nova, bucket: &str, body: &str) -> client::Streaming {
    let config = r#"{"create_stream_on_append":true,"default_class":"express"}"#;
    nova.ok("POST", &format!("/v1/buckets/{bucket}"), Some(config), 201);
    let batch = json!({"records": vec![json!({"body": body}); 64]}).to_string();
    for _ in 0..16 {
        nova.ok("POST", &format!("/v1/streams/{bucket}/s/records"), Some(&batch), 200);
    }
    let stream = client::open_on(
        nova.connect_with_small_window(),
        &nova.server,
        "GET",
        &format!("/v1/streams/{bucket}/s/records?seq_num=0"),
        &[("accept", "text/event-stream")],
        None,
        Some(Duration::from_secs(30)),
    )
    .expect("subscribe");
    assert_eq!(stream.status, 200);
    // Until the subscription has stopped reading pages (a count that has stopped moving
    // is all a client can see of it).
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut pages = nova.metric("nova_reads_total");
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = nova.metric("nova_reads_total");
        if now == pages {
            return stream;
        }
        assert!(Instant::now() < deadline, "the subscription never stopped reading");
        pages = now;
    }
}

fn recreated_under_a_subscription(new_records: usize) {
    let dir = tempdir();
    let nova = Nova::start(&dir.path().join("data"));
    let old = "o".repeat(16 << 10);
    let mut stream = a_stalled_subscription(&nova, "again", &old);
    assert_eq!(nova.call("DELETE", "/v1/streams/again/s", None).status, 204);
    let new = json!({"records": vec![json!({"body": "n"}); new_records]}).to_string();
    nova.ok("POST", "/v1/streams/again/s/records", Some(&new), 200);
    let mut old_records = 0;
    let end = loop {
        let next = event(&mut stream);
        match next.event.as_str() {
            "batch" => {
                let data: Value = serde_json::from_str(&next.data).expect("json");
                for body in bodies(&data) {
                    assert!(body == old, "record {old_records}, {body:?}: of the new stream");
                    old_records += 1;
                }
            }
            "ping" => {}
            _ => break next,
        }
    };
    assert_eq!(end.event, "error", "{new_records} new records: {}", end.data);
    let code = &serde_json::from_str::<Value>(&end.data).expect("json")["code"];
    assert_eq!(code, "not_found", "{new_records} new records: {}", end.data);
    assert!(old_records < 16 * 64, "the premise: the subscription waited before the old end");
    assert!(next_event(&mut stream.body).expect("read").is_none(), "the stream closes");
}

/// A connection with no request being answered is closed after `--http-idle-timeout-ms`,
/// counted from its last answer or from its accepting: one that sends nothing, one that
/// sends a request head a byte at a time (it cannot hold a connection permit for good),
/// and a kept-alive one after its answer. A request being answered keeps it open, however
/// long: a long poll of twice the timeout is answered on it.
#[test]
fn a_connection_without_a_request_is_closed_after_the_idle_timeout() {
    use std::io::{Read as _, Write as _};
    use std::net::TcpStream;

    let dir = tempdir();
    let nova = Nova::start_with(&dir.path().join("data"), &["--http-idle-timeout-ms", "1000"], &[]);
    let timeout = Duration::from_secs(1);
    nova.ok("POST", "/v1/buckets/idle", Some(r#"{"default_class":"express"}"#), 201);
    nova.ok("POST", "/v1/streams/idle/s", None, 201);
    let connect = || {
        let stream = TcpStream::connect(&nova.server.authority).expect("connect");
        // A server that never closes fails the test here instead of hanging it.
        stream.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
        stream
    };
    // What the server sent until it closed the connection, and when it closed it.
    let until_closed = |mut stream: &TcpStream| {
        let (mut sent, mut buf) = (Vec::new(), [0u8; 4096]);
        loop {
            match stream.read(&mut buf) {
                Ok(0) => return (String::from_utf8_lossy(&sent).into_owned(), Instant::now()),
                Ok(n) => sent.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    return (String::from_utf8_lossy(&sent).into_owned(), Instant::now());
                }
                Err(e) => panic!("the server did not close the connection: {e}"),
            }
        }
    };

    let opened = Instant::now();
    let (sent, closed) = until_closed(&connect());
    assert_eq!(sent, "");
    assert!(closed - opened >= timeout, "closed after {:?}", closed - opened);

    let opened = Instant::now();
    let slow = connect();
    let (sent, closed) = std::thread::scope(|scope| {
        let mut writer = &slow;
        scope.spawn(move || {
            for byte in b"GET /health HTTP/1.1\r\nhost: x\r\nx-slow: 1234567890abcdef" {
                // Until the server closes: then a write fails.
                if writer.write_all(&[*byte]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        until_closed(&slow)
    });
    assert_eq!(sent, "", "a head never finished gets no answer");
    assert!(closed - opened >= timeout, "closed after {:?}", closed - opened);

    let kept = connect();
    let asked = Instant::now();
    (&kept)
        .write_all(b"GET /v1/streams/idle/s/records?seq_num=0&wait=2 HTTP/1.1\r\nhost: x\r\n\r\n")
        .expect("ask");
    let (sent, closed) = until_closed(&kept);
    assert!(sent.starts_with("HTTP/1.1 200"), "{sent}");
    assert!(sent.contains(r#""records":[]"#), "{sent}");
    // The long poll's 2 s, then the idle timeout.
    assert!(closed - asked >= timeout * 3, "closed after {:?}", closed - asked);

    assert_eq!(nova.metric("nova_http_connections_closed_idle_total"), 3);
}

/// A long poll whose client went away before its answer stops waiting at once: it holds
/// none of its shard's pool of waiting reads (16 here, the least) from the long polls of clients
/// still there, and it is counted as unanswered (499), not left in flight for good.
#[test]
fn a_long_poll_whose_client_went_away_stops_waiting() {
    use std::io::{Read as _, Write as _};
    use std::net::TcpStream;

    let dir = tempdir();
    let flags = ["--shards", "1", "--shard-handlers-max", "16"];
    let nova = Nova::start_with(&dir.path().join("data"), &flags, &[]);
    nova.express_bucket("gone");
    nova.ok("POST", "/v1/streams/gone/a", None, 201);
    nova.ok("POST", "/v1/streams/gone/b", None, 201);
    let long_poll = |key: &str| {
        let mut stream = TcpStream::connect(&nova.server.authority).expect("connect");
        let head =
            format!("GET /v1/streams/gone/{key}/records?wait=30 HTTP/1.1\r\nhost: x\r\n\r\n");
        stream.write_all(head.as_bytes()).expect("send");
        stream
    };
    let abandoned: Vec<TcpStream> = (0..20).map(|_| long_poll("a")).collect();
    wait_until("the shard's whole pool of waiting reads is taken", || {
        nova.metric("nova_shard_reads_waiting") == 16
    });
    drop(abandoned);
    wait_until("every abandoned long poll is counted unanswered", || {
        nova.metric(r#"nova_http_requests_total{route="unanswered",status="499"}"#) == 20
    });
    assert_eq!(nova.metric("nova_shard_reads_waiting"), 0);
    // The /metrics request asking is the one in flight.
    assert_eq!(nova.metric("nova_http_requests_in_flight"), 1);

    let asked = Instant::now();
    let mut waiting = long_poll("b");
    wait_until("the long poll waits", || nova.metric("nova_shard_reads_waiting") == 1);
    nova.ok("POST", "/v1/streams/gone/b/records", Some(r#"{"records":[{"body":"here"}]}"#), 200);
    waiting.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let mut answer = vec![0u8; 4096];
    let n = waiting.read(&mut answer).expect("the long poll's answer");
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains(r#""body":"here""#), "{answer}");
    assert!(asked.elapsed() < Duration::from_secs(20), "answered after {:?}", asked.elapsed());
}

/// A long poll by a timestamp past the last record's stamp starts at the tail
/// (decisions.md), as a subscription from it does: what arrives while it waits is its
/// answer, whatever its stamp.
#[test]
fn a_long_poll_from_a_future_timestamp_answers_with_what_arrives() {
    let dir = tempdir();
    let nova = Nova::start(&dir.path().join("data"));
    nova.express_bucket("future");
    nova.ok("POST", "/v1/streams/future/s/records", Some(r#"{"records":[{"body":"old"}]}"#), 200);
    let later = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis()
        + 600_000;
    let asked = Instant::now();
    let page = std::thread::scope(|scope| {
        let poll = scope.spawn(|| {
            nova.ok(
                "GET",
                &format!("/v1/streams/future/s/records?timestamp={later}&wait=20"),
                None,
                200,
            )
        });
        wait_until("the long poll waits", || nova.metric("nova_shard_reads_waiting") >= 1);
        nova.ok(
            "POST",
            "/v1/streams/future/s/records",
            Some(r#"{"records":[{"body":"new"}]}"#),
            200,
        );
        poll.join().expect("the long poll")
    });
    assert_eq!(page["records"][0]["body"], "new", "{page}");
    assert_eq!(page["records"][0]["seq_num"], 1, "{page}");
    assert!(asked.elapsed() < Duration::from_secs(15), "answered after {:?}", asked.elapsed());
}

/// Every read and subscription names the stream it reads (`Nova-Stream-Id`), and
/// `stream_id` keeps one on that stream: once its address names a stream created anew,
/// a read, a long poll or a subscription given the old one's id is not_found, never a
/// page of the new one from the old one's position (how `read --follow` resumes).
#[test]
fn stream_id_keeps_reads_and_subscriptions_on_one_stream() {
    let dir = tempdir();
    let nova = Nova::start(&dir.path().join("data"));
    nova.express_bucket("pin");
    let records = "/v1/streams/pin/s/records";
    nova.ok("POST", records, Some(r#"{"records":[{"body":"old"}]}"#), 200);
    let old = nova.ok("GET", "/v1/streams/pin/s", None, 200)["id"].as_str().expect("id").to_owned();
    let subscribe = |path: &str, accept: &str| {
        nova.call_with("GET", &format!("{path}?count=1"), &[("accept", accept)], None)
    };
    let answers = [
        nova.call("GET", records, None),
        subscribe(records, "text/event-stream"),
        subscribe(records, client::SUBSCRIBE_MEDIA_TYPE),
    ];
    for answer in &answers {
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.header("nova-stream-id"), Some(old.as_str()));
    }
    let pinned = format!("{records}?stream_id={old}");
    assert_eq!(bodies(&nova.ok("GET", &pinned, None, 200)), ["old"]);

    nova.ok("DELETE", "/v1/streams/pin/s", None, 204);
    nova.ok("POST", records, Some(r#"{"records":[{"body":"new0"},{"body":"new1"}]}"#), 200);
    nova.err("GET", &pinned, None, 404, "not_found");
    nova.err("GET", &format!("{pinned}&seq_num=1&wait=5"), None, 404, "not_found");
    for accept in ["text/event-stream", client::SUBSCRIBE_MEDIA_TYPE] {
        let refused =
            nova.call_with("GET", &format!("{pinned}&seq_num=1"), &[("accept", accept)], None);
        assert_eq!(refused.status, 404, "{accept}: {}", refused.text());
        assert_eq!(refused.json()["code"], "not_found");
    }
    let new = nova.call("GET", records, None);
    assert_eq!(bodies(&new.json()), ["new0", "new1"]);
    assert_ne!(new.header("nova-stream-id"), Some(old.as_str()));
    let refused =
        nova.err("GET", &format!("{records}?stream_id=ab"), None, 400, "invalid_argument");
    assert!(refused["message"].as_str().expect("message").contains("stream_id"), "{refused}");
}

/// A shard whose journal write failed acknowledges nothing more until a restart, and
/// `/health` says so (503, naming the shard and why), so a supervisor restarts it rather
/// than keep a node that answers every append unavailable; the log says it once. Here the
/// journal's first segment cannot be created: a directory is in its place.
#[test]
fn health_reports_a_shard_whose_journal_failed() {
    let dir = tempdir();
    let data = dir.path().join("data");
    let log = dir.path().join("log");
    let nova = Nova::start_logging(&data, &["--shards", "1"], &log);
    nova.express_bucket("sick");
    let segment = data.join("journal/shard-0").join(format!("{:020}.journal", 0));
    std::fs::create_dir(&segment).expect("a directory where the first segment goes");
    let append = |nova: &Nova| {
        nova.call("POST", "/v1/streams/sick/s/records", Some(r#"{"records":[{"body":"x"}]}"#))
    };
    let refused = append(&nova);
    assert_eq!(refused.status, 503, "{}", refused.text());
    let health = nova.err("GET", "/health", None, 503, "unavailable");
    let said = health["message"].as_str().expect("message");
    assert!(said.contains("shard 0") && said.contains("journal"), "{said}");
    assert!(said.contains("restarted"), "{said}");
    // The log says so too, once.
    let failed = "nova: shard 0 (journal";
    wait_until("the log says the shard failed", || {
        std::fs::read_to_string(&log).is_ok_and(|text| text.contains(failed))
    });

    assert!(nova.terminate().success());
    let text = std::fs::read_to_string(&log).expect("the log");
    assert_eq!(text.matches(failed).count(), 1, "{text}");
    std::fs::remove_dir(&segment).expect("the obstacle gone");
    let nova = Nova::start_with(&data, &["--shards", "1"], &[]);
    assert_eq!(nova.ok("GET", "/health", None, 200)["status"], "serving");
    assert_eq!(append(&nova).status, 200);
}

/// A server killed and started again at once on the same address starts: the killed
/// one's listener outlives it by some milliseconds (its io_uring torn down), which the
/// start waits out instead of failing as if another nova held the port.
#[test]
fn a_server_killed_starts_again_at_once_on_its_address() {
    let dir = tempdir();
    let data = dir.path().join("data");
    let mut nova = Nova::start(&data);
    let address = nova.server.authority.clone();
    for _ in 0..5 {
        nova.kill();
        nova = Nova::start_with(&data, &["--listen", &address], &[]);
        assert_eq!(nova.ok("GET", "/health", None, 200)["status"], "serving");
    }
}

/// `--http-peer-gone-ms` sets how soon a connection's vanished peer is given up: a quiet
/// connection is probed with TCP keepalive from half of it on. The kernel shows the
/// server's socket's keepalive timer in /proc/net/tcp (`tr` 2, `tm->when` in clock ticks
/// of 1/100 s); the default would put it at 60 s.
#[test]
fn a_quiet_connection_is_probed_after_half_the_peer_gone_time() {
    let dir = tempdir();
    let nova = Nova::start_with(&dir.path().join("data"), &["--http-peer-gone-ms", "30000"], &[]);
    let client = std::net::TcpStream::connect(&nova.server.authority).expect("connect");
    let (server_port, client_port) =
        (client.peer_addr().expect("peer").port(), client.local_addr().expect("local").port());
    // The server's side of this connection: its (timer, ticks to go) from /proc/net/tcp.
    let timer = || {
        let table = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
        table.lines().skip(1).find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let port = |address: &str| u16::from_str_radix(address.split(':').nth(1)?, 16).ok();
            if port(fields[1]) != Some(server_port) || port(fields[2]) != Some(client_port) {
                return None;
            }
            let (timer, when) = fields[5].split_once(':')?;
            Some((timer.to_owned(), u64::from_str_radix(when, 16).ok()?))
        })
    };
    wait_until("the server's socket has its keepalive timer", || {
        timer().is_some_and(|(timer, _)| timer == "02")
    });
    let (_, ticks) = timer().expect("the server's socket");
    assert!(ticks <= 1_500, "keepalive in {ticks} ticks of 1/100 s, not within 15 s");
    assert!(ticks > 1_000, "keepalive in {ticks} ticks: the test took too long to look");
    drop(client);
}

/// An answer the client stops taking holds its connection (a permit) and the answer's
/// memory only until the idle timeout: once no byte of it has gone out for that long, the
/// connection is closed. A client that reads slowly is not cut, however long its answer
/// takes: each byte it takes counts. Here a 16 MiB binary read page (which hyper holds
/// whole once the body has given it, past the request's answering) read slowly, and a
/// subscription from the same 16 MiB of history (a body that never ends) not read at
/// all, each to a socket with a 16 KiB receive buffer.
#[test]
fn a_client_that_stops_reading_its_answer_is_closed_after_the_idle_timeout() {
    use engine::framing::{AppendBuilder, AppendConditions};
    use std::io::{Read as _, Write as _};
    use std::net::{SocketAddr, TcpStream};

    let dir = tempdir();
    let nova = Nova::start_with(&dir.path().join("data"), &["--http-idle-timeout-ms", "1000"], &[]);
    let timeout = Duration::from_secs(1);
    nova.express_bucket("stall");
    let media = [("content-type", "application/x-nova-records")];
    for _ in 0..16 {
        let mut builder = AppendBuilder::new();
        for _ in 0..64 {
            builder.push::<&[u8], &[u8]>(&[], &[7; 16 << 10]).expect("fits");
        }
        let framed = builder.finish(&AppendConditions::default());
        let ack = nova.call_with("POST", "/v1/streams/stall/s/records", &media, Some(&framed));
        assert_eq!(ack.status, 200, "{}", ack.text());
    }
    let page_bytes = 16 << 20;
    let ask = |accept: &str| {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        socket.set_recv_buffer_size(16 << 10).expect("SO_RCVBUF");
        let at: SocketAddr = nova.server.authority.parse().expect("an address");
        socket.connect(&at.into()).expect("connect");
        let stream = TcpStream::from(socket);
        stream.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
        (&stream)
            .write_all(
                format!(
                    "GET /v1/streams/stall/s/records?seq_num=0 HTTP/1.1\r\nhost: x\r\n\
                     accept: {accept}\r\n\r\n"
                )
                .as_bytes(),
            )
            .expect("ask");
        stream
    };
    // Until the server closes; how many bytes came.
    let rest = |mut stream: &TcpStream| {
        let (mut got, mut buf) = (0, vec![0; 1 << 20]);
        loop {
            match stream.read(&mut buf) {
                Ok(0) => return got,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
                Err(e) => panic!("the server neither answered nor closed: {e}"),
            }
        }
    };

    // Slowly: 64 KiB every 100 ms for three timeouts, then the rest at once. The whole
    // page arrives on a connection kept alive, not closed.
    let slow = ask("application/x-nova-records");
    let started = Instant::now();
    let mut got = 0;
    let mut buf = vec![0; 64 << 10];
    while started.elapsed() < timeout * 3 {
        got += (&slow).read(&mut buf).expect("a slow read");
        std::thread::sleep(Duration::from_millis(100));
    }
    slow.set_read_timeout(Some(Duration::from_millis(500))).expect("timeout");
    loop {
        match (&slow).read(&mut buf) {
            Ok(0) => panic!("the server closed a connection its client was reading"),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(got > page_bytes, "{got} bytes of a {page_bytes}-byte page");
    assert_eq!(nova.metric("nova_http_connections_closed_idle_total"), 0);
    assert_eq!(nova.metric("nova_http_connections_closed_stalled_total"), 0);
    drop(slow);

    let stalled = ask("application/x-nova-records; subscribe=true");
    let asked = Instant::now();
    let deadline = asked + Duration::from_secs(30);
    while nova.metric("nova_http_connections_closed_stalled_total") < 1 {
        assert!(Instant::now() < deadline, "a client that stopped reading was never closed");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(asked.elapsed() >= timeout, "closed after {:?}", asked.elapsed());
    // What the socket buffers held, and not the rest of the history.
    let got = rest(&stalled);
    assert!((1..page_bytes).contains(&got), "{got} bytes of {page_bytes} bytes of history");
    assert_eq!(nova.metric("nova_http_connections_closed_stalled_total"), 1);
}

/// `--pin-cores 1` pins shard i to the i-th core nova may run on and the uploader to the
/// next; without it, each may run on every core. A pinning the cores cannot give is
/// refused at start, naming the flag.
#[test]
fn pin_cores_puts_each_shard_and_the_uploader_on_a_core_of_its_own() {
    // The cores a thread may run on, as /proc lists them ("0-1", "2,5-6").
    let cores_of = |status: &str| -> Vec<usize> {
        let line = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:"));
        let mut cores = Vec::new();
        for range in line.expect("Cpus_allowed_list").trim().split(',') {
            let (first, last) = range.split_once('-').unwrap_or((range, range));
            cores.extend(first.parse::<usize>().expect("a core")..=last.parse().expect("a core"));
        }
        cores
    };
    // What this test may run on, and so a child it starts.
    let ours = cores_of(&std::fs::read_to_string("/proc/self/status").expect("status"));
    // The cores of every thread whose name starts with `thread` (glommio names an
    // executor's threads after it, with a suffix): one set for all of them.
    let allowed = |nova: &Nova, thread: &str| -> Vec<usize> {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", nova.pid())).expect("tasks");
        let mut sets: Vec<Vec<usize>> = tasks
            .filter_map(Result::ok)
            .filter(|task| {
                std::fs::read_to_string(task.path().join("comm"))
                    .is_ok_and(|name| name.starts_with(thread))
            })
            .map(|task| {
                cores_of(&std::fs::read_to_string(task.path().join("status")).expect("status"))
            })
            .collect();
        sets.sort();
        sets.dedup();
        assert_eq!(sets.len(), 1, "{thread}: {sets:?}");
        sets.remove(0)
    };
    let dir = tempdir();
    let nova = Nova::start_with(&dir.path().join("a"), &["--shards", "1"], &[]);
    assert_eq!(allowed(&nova, "nova-shard-0"), ours);
    assert_eq!(allowed(&nova, "nova-uploader"), ours);
    drop(nova);
    let consecutive = ours.windows(2).all(|pair| pair[1] == pair[0] + 1);
    if consecutive {
        let flags = ["--shards", "1", "--pin-cores", "1"];
        let nova = Nova::start_with(&dir.path().join("b"), &flags, &[]);
        assert_eq!(allowed(&nova, "nova-shard-0"), [ours[0]]);
        let uploader = if ours.len() > 1 { vec![ours[1]] } else { ours.clone() };
        assert_eq!(allowed(&nova, "nova-uploader"), uploader);
        drop(nova);
    }
    // More shards than cores (or cores with gaps): refused before anything starts, as a
    // usage mistake.
    let shards = (ours.len() + 1).to_string();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nova"))
        .args(["serve", "--listen", "127.0.0.1:0", "--pin-cores", "1", "--shards", &shards])
        .arg("--data-dir")
        .arg(dir.path().join("c"))
        .output()
        .expect("run nova serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--pin-cores 1 needs a core of its own"), "{stderr}");
}
