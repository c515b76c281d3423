//! Golden byte vectors: bytes a format must keep producing, checked in under
//! `engine/testdata/`. A test renders its cases and compares with the file; a mismatch
//! fails. `NOVA_BLESS=1` rewrites the file instead (and only then), so a format change
//! is a visible diff in review.
//!
//! One line per case: `name`, byte length, CRC-32 of all bytes, and the hex of the
//! first 4096 bytes (large vectors are pinned by length and CRC beyond that).

use std::fmt::Write as _;

const HEX_PREFIX_MAX: usize = 4096;

/// Renders `cases` and compares them with `testdata/<file>`.
///
/// # Panics
/// When the file differs from the rendering (or is missing) and `NOVA_BLESS` is unset.
pub(crate) fn check(file: &str, cases: &[(&str, Vec<u8>)]) {
    let mut rendered = String::new();
    for (name, bytes) in cases {
        assert!(!name.contains('\t'), "case names are tab-free");
        let hex = bytes.iter().take(HEX_PREFIX_MAX).fold(String::new(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        });
        let _ =
            writeln!(rendered, "{name}\t{}\t{:08x}\t{hex}", bytes.len(), crc32fast::hash(bytes));
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata").join(file);
    if std::env::var_os("NOVA_BLESS").is_some() {
        std::fs::write(&path, &rendered).expect("write golden file");
        return;
    }
    let stored = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "golden file {} unreadable ({e}); run with NOVA_BLESS=1 to create it",
            path.display()
        )
    });
    for (line, (want, got)) in stored.lines().zip(rendered.lines()).enumerate() {
        assert_eq!(want, got, "{file} line {} differs from the golden vector", line + 1);
    }
    assert_eq!(stored.lines().count(), rendered.lines().count(), "{file}: case count differs");
}
