//! Validation of one append batch against the limits (limits.md), over its framed form:
//! the records' stored lengths and the stored records back to back, exactly what the
//! binary framing carries and what [`crate::chunk::ChunkBuilder::push_batch`] copies.
//! The JSON path encodes into the same form first, so there is one validation for both.
//!
//! Checks, first failure wins, the whole batch refused (decisions.md, check order (1)):
//! 1 to 100,000 records; every stored record well-formed; each record's content at most
//! the record cap (inclusive); at most 100 headers per record, names non-empty; the
//! batch's content at most 100 MiB. Sizes are content bytes, never framing.
//!
//! A headerless record costs a flag check, a slice and a length comparison.

use crate::error::{Error, Result};
use crate::limits::{BATCH_BYTES_MAX, BATCH_RECORDS_MAX, HEADERS_PER_RECORD_MAX, Limits};
use crate::pieces::Pieces;
use crate::record;

/// What a valid batch holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchSummary {
    /// Records in the batch (1 to 100,000).
    pub records: u32,
    /// Content bytes of all records: what budgets and throughput caps meter.
    pub content_bytes: u64,
}

/// Validates a framed batch. `lengths` holds one little-endian u32 per record and the
/// lengths add up to `data.len()` (the framing decoder guarantees both). Each record is
/// read where it lies (a record split between two pieces of the body is read from a
/// copy).
pub fn validate(lengths: &[u8], data: Pieces<'_>, limits: &Limits) -> Result<BatchSummary> {
    let count = lengths.len() / 4;
    if count == 0 {
        return Err(Error::EmptyBatch);
    }
    if count > BATCH_RECORDS_MAX as usize {
        return Err(Error::TooManyRecords { count: count as u64, limit: BATCH_RECORDS_MAX });
    }
    let mut content_bytes = 0u64;
    let mut rest = data;
    for (index, length) in lengths.chunks_exact(4).enumerate() {
        let index = index as u32; // count <= BATCH_RECORDS_MAX
        let length = u32::from_le_bytes(length.try_into().expect("4-byte chunk")) as usize;
        let stored = rest.take(length).expect("the lengths add up to the data");
        let record =
            record::decode(&stored).map_err(|source| Error::MalformedRecord { index, source })?;
        let size = record.content_len();
        if size > u64::from(limits.record_bytes_max) {
            return Err(Error::RecordTooLarge { index, size, limit: limits.record_bytes_max });
        }
        if record.header_count() > 0 {
            check_headers(index, &record)?;
        }
        content_bytes += size;
        if content_bytes > BATCH_BYTES_MAX {
            // Stop at the first record that passes the cap; the total is at least this.
            return Err(Error::BatchTooLarge { bytes: content_bytes, limit: BATCH_BYTES_MAX });
        }
    }
    debug_assert!(rest.is_empty(), "lengths add up to the data");
    Ok(BatchSummary { records: count as u32, content_bytes })
}

fn check_headers(index: u32, record: &record::StoredRecord<'_>) -> Result<()> {
    if record.header_count() > HEADERS_PER_RECORD_MAX {
        return Err(Error::TooManyHeaders {
            index,
            count: record.header_count(),
            limit: HEADERS_PER_RECORD_MAX,
        });
    }
    match record.headers().position(|(name, _)| name.is_empty()) {
        Some(header) => Err(Error::EmptyHeaderName { index, header: header as u32 }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Code;
    use crate::framing::{AppendBuilder, AppendConditions, AppendFrame, FramedBody};
    use crate::limits::RECORD_BYTES_MAX_DEFAULT;
    use s3::Bytes;

    type Header<'a> = (&'a [u8], &'a [u8]);

    fn check(records: &[(Vec<Header<'_>>, Vec<u8>)]) -> Result<BatchSummary> {
        let mut builder = AppendBuilder::new();
        for (headers, body) in records {
            builder.push(headers, body).expect("fits the format");
        }
        let body = builder.finish(&AppendConditions::default());
        let frame = AppendFrame::decode(&body).expect("valid framing");
        let whole = validate(frame.lengths, frame.data, &Limits::default());
        // The same body in three pieces, cut inside records: the same verdict.
        let body = Bytes::from(body);
        let (a, b) = (body.len() / 3 + 1, body.len() * 2 / 3 + 5); // a body has 24 bytes or more
        let cut = [body.slice(..a), body.slice(a..b), body.slice(b..)];
        let body = FramedBody::from_pieces(cut);
        let frame = AppendFrame::decode_body(&body).expect("valid framing");
        assert_eq!(validate(frame.lengths, frame.data, &Limits::default()), whole, "in pieces");
        whole
    }

    #[test]
    fn meters_content_bytes_not_framing() {
        let summary = check(&[(vec![], b"hi".to_vec()), (vec![(b"k", b"v")], b"hi".to_vec())])
            .expect("valid");
        assert_eq!(summary, BatchSummary { records: 2, content_bytes: 6 });
    }

    #[test]
    fn refuses_an_empty_batch() {
        assert_eq!(check(&[]), Err(Error::EmptyBatch));
    }

    #[test]
    fn record_cap_is_inclusive() {
        let limit = RECORD_BYTES_MAX_DEFAULT as usize;
        let at_cap =
            check(&[(vec![(b"k", b"v")], vec![0; limit - 2])]).expect("exactly 1 MiB is accepted");
        assert_eq!(at_cap.content_bytes, limit as u64);
        let over =
            check(&[(vec![], vec![]), (vec![(b"k", b"v")], vec![0; limit - 1])]).expect_err("over");
        assert_eq!(
            over,
            Error::RecordTooLarge { index: 1, size: limit as u64 + 1, limit: limit as u32 }
        );
        assert_eq!(over.code(), Code::InvalidArgument);
        assert!(over.to_string().contains("1048577"), "{over}");
        assert!(over.to_string().contains("1048576"), "{over}");
    }

    #[test]
    fn record_cap_follows_the_flag() {
        let mut builder = AppendBuilder::new();
        builder.push::<&[u8], &[u8]>(&[], &[0; 11]).expect("fits");
        let body = builder.finish(&AppendConditions::default());
        let frame = AppendFrame::decode(&body).expect("valid");
        let limits = Limits { record_bytes_max: 10 };
        assert_eq!(
            validate(frame.lengths, frame.data, &limits),
            Err(Error::RecordTooLarge { index: 0, size: 11, limit: 10 })
        );
    }

    #[test]
    fn header_limits() {
        let hundred: Vec<Header<'_>> = vec![(b"n", b"v"); 100];
        assert!(check(&[(hundred.clone(), vec![])]).is_ok());
        let too_many: Vec<Header<'_>> = vec![(b"n", b"v"); 101];
        assert_eq!(
            check(&[(vec![], vec![]), (too_many, vec![])]),
            Err(Error::TooManyHeaders { index: 1, count: 101, limit: 100 })
        );
        assert_eq!(
            check(&[(vec![(b"a", b"1"), (b"", b"2")], vec![])]),
            Err(Error::EmptyHeaderName { index: 0, header: 1 })
        );
        // Empty values and duplicate names are legal.
        assert!(check(&[(vec![(b"a", b""), (b"a", b"")], vec![])]).is_ok());
    }

    #[test]
    fn record_count_limit() {
        let records = vec![(vec![], vec![]); BATCH_RECORDS_MAX as usize];
        assert_eq!(check(&records).expect("at the limit").records, BATCH_RECORDS_MAX);
        let records = vec![(vec![], vec![]); BATCH_RECORDS_MAX as usize + 1];
        assert_eq!(
            check(&records),
            Err(Error::TooManyRecords { count: 100_001, limit: BATCH_RECORDS_MAX })
        );
    }

    #[test]
    fn batch_byte_limit() {
        // 100 records of 1 MiB is exactly 100 MiB: accepted; one byte more is refused.
        let full = vec![(vec![], vec![7u8; RECORD_BYTES_MAX_DEFAULT as usize]); 100];
        assert_eq!(check(&full).expect("at the limit").content_bytes, BATCH_BYTES_MAX);
        let mut over = full;
        over.push((vec![], vec![1]));
        assert_eq!(
            check(&over),
            Err(Error::BatchTooLarge { bytes: BATCH_BYTES_MAX + 1, limit: BATCH_BYTES_MAX })
        );
    }

    #[test]
    fn malformed_record_names_its_index() {
        let lengths = [1u32, 2].iter().flat_map(|l| l.to_le_bytes()).collect::<Vec<_>>();
        let err = validate(&lengths, Pieces::from(&[0x00, 0x80, 0x00][..]), &Limits::default())
            .expect_err("malformed");
        assert_eq!(
            err,
            Error::MalformedRecord {
                index: 1,
                source: record::Corruption::ReservedBits { flag: 0x80 }
            }
        );
        assert_eq!(err.code(), Code::InvalidArgument);
    }
}
