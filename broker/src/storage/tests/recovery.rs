//! Recovery at open: every damaged shape, what is cut, what is repaired, what stops the boot.

use std::sync::Arc;

use super::super::scan::{self, SegmentFiles, TailCheck, segment_file_name};
use super::super::vfs::fault::{FaultyFs, Op};
use super::super::*;
use super::*;

/// The data fsync is the commit point, and the index lags: a complete, CRC-valid entry past the
/// last index entry may have been acknowledged, so recovery indexes it; a torn one was not, and
/// is cut.
#[tokio::test(flavor = "multi_thread")]
async fn recovery_indexes_complete_entries_past_an_empty_index_and_cuts_a_torn_one() {
    let tmp = tempfile::tempdir().unwrap();
    close(open(tmp.path(), 1 << 20).unwrap()).await;
    let files = seg0(tmp.path());
    let whole = frame::encode(b"committed by its data fsync");
    append_bytes(&files.data, &whole);
    append_bytes(&files.data, &frame::encode(b"torn")[..9]);
    let log = open(tmp.path(), 1 << 20).unwrap();
    assert_eq!(log.next_offset(), 1);
    assert_eq!(len(&files.data), whole.len() as u64);
    assert_eq!(std::fs::read(&files.index).unwrap(), 0u64.to_be_bytes());
    assert_eq!(log.append(b"1").await.unwrap(), 1);
    assert_eq!(
        read_all(&log),
        vec![b"committed by its data fsync".to_vec(), b"1".to_vec()]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn recovery_reindexes_entries_past_the_index_and_cuts_a_torn_write() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 1 << 20).unwrap();
    fill(&log, 5).await;
    close(log).await;
    let files = seg0(tmp.path());
    let lagging = frame::encode(&payload(5));
    let committed = len(&files.data) + lagging.len() as u64;
    append_bytes(&files.data, &lagging);
    append_bytes(&files.data, b"\x00\x00\x01");
    let log = open(tmp.path(), 1 << 20).unwrap();
    assert_eq!(len(&files.data), committed);
    assert_eq!(len(&files.index), 6 * 8);
    assert_eq!(log.next_offset(), 6);
    assert_eq!(log.append(&payload(6)).await.unwrap(), 6);
    assert_eq!(read_all(&log), (0..7).map(payload).collect::<Vec<_>>());
}

/// A running tail is preallocated with zeros and its index lags; dropped without a clean close
/// (a crash), the next open finds every acknowledged entry and cuts the zeros.
#[tokio::test(flavor = "multi_thread")]
async fn a_crashed_tail_with_preallocated_zeros_and_a_lagging_index_recovers_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 1 << 20).unwrap();
    fill(&log, 40).await;
    drop(log);
    let files = seg0(tmp.path());
    let written = std::fs::read(&files.data).unwrap();
    let end = (0..40)
        .map(|i| frame::encode(&payload(i)).len())
        .sum::<usize>();
    assert!(written.len() > end, "the tail is preallocated");
    assert!(written[end..].iter().all(|&b| b == 0));
    // The index lost its last 25 entries (never synced).
    truncate(&files.index, 15 * 8);
    let log = open(tmp.path(), 1 << 20).unwrap();
    assert_eq!(read_all(&log), (0..40).map(payload).collect::<Vec<_>>());
    assert_eq!(len(&files.data), end as u64);
    assert_eq!(len(&files.index), 40 * 8);
}

#[tokio::test(flavor = "multi_thread")]
async fn recovery_refuses_an_index_that_points_past_the_data() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 1 << 20).unwrap();
    fill(&log, 3).await;
    close(log).await;
    let files = seg0(tmp.path());
    // Cut the data inside the last committed entry: the index now points past it.
    truncate(&files.data, len(&files.data) - 1);
    let err = open(tmp.path(), 1 << 20).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, StorageError::Inconsistent { .. }), "{msg}");
    assert!(msg.contains("0000000000000000000.idx"), "{msg}");
    assert!(msg.contains("past the end of the data file"), "{msg}");
    // The files were not touched by the refused open.
    assert_eq!(len(&files.index), 24);
}

#[tokio::test(flavor = "multi_thread")]
async fn recovery_refuses_an_index_entry_beyond_the_data() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 1 << 20).unwrap();
    fill(&log, 2).await;
    close(log).await;
    let files = seg0(tmp.path());
    append_bytes(&files.index, &10_000u64.to_be_bytes());
    let msg = open(tmp.path(), 1 << 20).unwrap_err().to_string();
    assert!(msg.contains("points to byte 10000"), "{msg}");
    assert!(msg.contains("0000000000000000000.idx"), "{msg}");
}

#[tokio::test(flavor = "multi_thread")]
async fn recovery_cuts_a_torn_index_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 1 << 20).unwrap();
    fill(&log, 4).await;
    close(log).await;
    let files = seg0(tmp.path());
    append_bytes(&files.data, &frame::encode(b"half committed"));
    append_bytes(&files.index, &[0, 0, 0]);
    let log = open(tmp.path(), 1 << 20).unwrap();
    // The torn index bytes are cut, the complete entry past them is indexed.
    assert_eq!(log.next_offset(), 5);
    assert_eq!(len(&files.index), 40);
    assert_eq!(log.append(&payload(5)).await.unwrap(), 5);
    assert_eq!(read_all(&log).len(), 6);
}

/// A crash can stop the data write of the last entry at any byte: whichever byte it is, recovery
/// keeps every earlier entry and appends continue where they belong.
#[tokio::test(flavor = "multi_thread")]
async fn a_torn_tail_cut_at_every_byte_of_the_last_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let pristine = tmp.path().join("pristine");
    let log = open(&pristine, 1 << 20).unwrap();
    fill(&log, 3).await;
    close(log).await;
    let files = seg0(&pristine);
    let committed = len(&files.data);
    let last = frame::encode(&payload(3));
    for cut in 0..=last.len() {
        let dir = tmp.path().join(format!("cut-{cut}"));
        copy_segment(&pristine, &dir);
        append_bytes(&seg0(&dir).data, &last[..cut]);
        let log = open(&dir, 1 << 20).unwrap();
        // Whole, the entry is committed (its data fsync may have returned); torn, it is cut.
        let whole = u64::from(cut == last.len());
        assert_eq!(log.next_offset(), 3 + whole, "cut {cut}");
        let kept = committed + whole * last.len() as u64;
        assert_eq!(len(&seg0(&dir).data), kept, "cut {cut}");
        assert_eq!(log.append(&payload(3 + whole)).await.unwrap(), 3 + whole);
        let all = read_all(&log);
        assert_eq!(
            all,
            (0..4 + whole).map(payload).collect::<Vec<_>>(),
            "cut {cut}"
        );
    }
}

/// The other side: the index entry reached the disk but the data did not (impossible with the
/// write order, possible with a lying disk). Every cut inside the entry stops the open.
#[tokio::test(flavor = "multi_thread")]
async fn an_indexed_entry_cut_at_every_byte_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let pristine = tmp.path().join("pristine");
    let log = open(&pristine, 1 << 20).unwrap();
    fill(&log, 3).await;
    close(log).await;
    let files = seg0(&pristine);
    let full = len(&files.data);
    let last_start = full - frame::encode(&payload(2)).len() as u64;
    for cut in last_start..full {
        let dir = tmp.path().join(format!("cut-{cut}"));
        copy_segment(&pristine, &dir);
        truncate(&seg0(&dir).data, cut);
        let err = open(&dir, 1 << 20).unwrap_err();
        assert!(
            matches!(err, StorageError::Inconsistent { .. }),
            "cut {cut}: {err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flipped_bit_isolates_one_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 1 << 20).unwrap();
    fill(&log, 5).await;
    close(log).await;
    let files = seg0(tmp.path());
    let mut data = std::fs::read(&files.data).unwrap();
    let index = std::fs::read(&files.index).unwrap();
    let pos2 = u64::from_be_bytes(index[16..24].try_into().unwrap()) as usize;
    data[pos2 + frame::HEADER_LEN + 3] ^= 0x10;
    std::fs::write(&files.data, &data).unwrap();

    let log = open(tmp.path(), 1 << 20).unwrap();
    assert_eq!(log.next_offset(), 5);
    for i in [0, 1, 3, 4] {
        assert_eq!(log.read(i).unwrap().unwrap(), payload(i));
    }
    match log.read(2) {
        Err(StorageError::Corrupt(c)) => {
            assert_eq!(c.offset, 2);
            assert_eq!(c.position, pos2 as u64);
            assert!(matches!(c.fault, frame::FrameFault::CrcMismatch { .. }));
        }
        other => panic!("expected corruption, got {other:?}"),
    }
    let entries = log.read_from(0, 10, usize::MAX).unwrap();
    assert_eq!(entries.len(), 5);
    assert!(entries[2].payload.is_err());
    assert!(
        entries
            .iter()
            .enumerate()
            .all(|(i, e)| i == 2 || e.payload.is_ok())
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_rotation_leaves_an_empty_segment_that_recovery_removes() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 1 << 20).unwrap();
    fill(&log, 3).await;
    close(log).await;
    // A rotation (of an older version, which created the next segment before the batch that
    // filled the last one was committed) left segment 5 empty.
    let orphan = SegmentFiles::new(tmp.path(), 5);
    std::fs::write(&orphan.data, b"").unwrap();
    std::fs::write(&orphan.index, b"").unwrap();
    let log = open(tmp.path(), 1 << 20).unwrap();
    assert!(!orphan.data.exists() && !orphan.index.exists());
    assert_eq!(log.next_offset(), 3);
    assert_eq!(log.append(b"3").await.unwrap(), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gap_between_non_empty_segments_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 1).unwrap();
    fill(&log, 4).await;
    close(log).await;
    let gone = SegmentFiles::new(tmp.path(), 1);
    std::fs::remove_file(&gone.data).unwrap();
    std::fs::remove_file(&gone.index).unwrap();
    let msg = open(tmp.path(), 1).unwrap_err().to_string();
    assert!(
        msg.contains("0000000000000000002.idx") && msg.contains("ends at offset 1"),
        "{msg}"
    );
}

/// Found by fuzzing: index positions near `u64::MAX` overflowed the recovery checks. (A lone
/// first entry near `u64::MAX` over a valid frame at byte 0 is repaired from the frame: see
/// `a_flipped_bit_in_the_tail_index_is_repaired_from_the_frames`.)
#[tokio::test(flavor = "multi_thread")]
async fn an_index_entry_near_the_end_of_u64_is_refused_not_overflowed() {
    for positions in [
        vec![0, u64::MAX],
        vec![0, u64::MAX - 3],
        vec![0, u64::MAX - 8],
    ] {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join(segment_file_name(0, "mmm")),
            frame::encode(b"{}"),
        )
        .unwrap();
        let index: Vec<u8> = positions.iter().flat_map(|p| p.to_be_bytes()).collect();
        std::fs::write(tmp.path().join(segment_file_name(0, "idx")), index).unwrap();
        let err = open(tmp.path(), 1 << 20).unwrap_err();
        assert!(
            matches!(err, StorageError::Inconsistent { .. }),
            "{positions:?}: {err}"
        );
    }
}

/// An empty tail segment left behind a segment sealed before this process started (a crash after
/// a rotation, then a restart with bigger segments): after a write error, recovery in place keeps
/// the empty tail instead of falling back to the sealed segment, which takes no appends.
#[tokio::test(flavor = "multi_thread")]
async fn recovery_in_place_keeps_an_empty_tail_after_a_sealed_segment() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 100).unwrap();
    fill(&log, 3).await;
    let next = log.next_offset();
    close(log).await;
    // A crash right after a rotation leaves an empty tail where the log ends.
    for ext in ["mmm", "idx"] {
        std::fs::write(tmp.path().join(segment_file_name(next, ext)), b"").unwrap();
    }
    let fs = FaultyFs::new();
    let config = LogConfig {
        segment_max_bytes: 1 << 20,
        retry_after: std::time::Duration::ZERO,
        ..LogConfig::default()
    };
    let log = Log::open(tmp.path(), Arc::new(fs.clone()), config).unwrap();
    fs.fail(Op::Write, ".mmm", libc::EIO);
    assert!(log.append(b"lost").await.is_err());
    fs.clear();
    assert_eq!(log.append(&payload(next)).await.unwrap(), next);
    assert_eq!(log.append(&payload(next + 1)).await.unwrap(), next + 1);
    assert_eq!(
        read_all(&log),
        (0..next + 2).map(payload).collect::<Vec<_>>()
    );
}

/// A flipped bit in the synced (acknowledged) part of the tail index: recovery used to cut the
/// index at the first entry that did not follow the one before it, and the data with it, deleting
/// every later acknowledged message with only a warning. The frames say where each entry is, so
/// the entry is rewritten from them and nothing is lost, whichever entry and bit it is.
#[tokio::test(flavor = "multi_thread")]
async fn a_flipped_bit_in_the_tail_index_is_repaired_from_the_frames() {
    let tmp = tempfile::tempdir().unwrap();
    let pristine = tmp.path().join("pristine");
    let log = open(&pristine, 1 << 20).unwrap();
    fill(&log, 40).await;
    close(log).await;
    let files = seg0(&pristine);
    let index = std::fs::read(&files.index).unwrap();
    let mut cases = 0;
    for entry in [0usize, 1, 7, 20, 38, 39] {
        for bit in [0u32, 3, 5, 9, 30, 62] {
            let dir = tmp.path().join(format!("flip-{entry}-{bit}"));
            copy_segment(&pristine, &dir);
            let mut flipped = index.clone();
            flipped[entry * 8 + 7 - (bit / 8) as usize] ^= 1 << (bit % 8);
            std::fs::write(seg0(&dir).index, &flipped).unwrap();
            let what = format!("entry {entry} bit {bit}");
            let log = open(&dir, 1 << 20).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(log.next_offset(), 40, "{what}");
            assert_eq!(
                read_all(&log),
                (0..40).map(payload).collect::<Vec<_>>(),
                "{what}"
            );
            close(log).await;
            // The repair is on disk: the index is byte for byte the original again.
            assert_eq!(std::fs::read(seg0(&dir).index).unwrap(), index, "{what}");
            cases += 1;
        }
    }
    assert_eq!(cases, 36);
}

/// Zeros in the tail index (sectors of a never-synced write that were lost) past the frames that
/// made it to disk are cut, as before; the entries before them stay.
#[tokio::test(flavor = "multi_thread")]
async fn zeros_in_the_tail_index_past_the_valid_frames_are_cut() {
    let tmp = tempfile::tempdir().unwrap();
    let log = open(tmp.path(), 1 << 20).unwrap();
    fill(&log, 10).await;
    close(log).await;
    let files = seg0(tmp.path());
    // Two more entries whose index slots were lost (zeros) and whose data is torn.
    let mut extra = frame::encode(&payload(10));
    extra.truncate(extra.len() - 2);
    append_bytes(&files.data, &extra);
    append_bytes(&files.index, &[0u8; 16]);
    let log = open(tmp.path(), 1 << 20).unwrap();
    assert_eq!(log.next_offset(), 10);
    assert_eq!(len(&files.index), 80);
    assert_eq!(log.append(&payload(10)).await.unwrap(), 10);
    assert_eq!(read_all(&log), (0..11).map(payload).collect::<Vec<_>>());
}

/// After a clean shutdown recovery checks the tail quickly (its last frame, its first entry, the
/// index's order) and reconciles only when one of those fails: a flip that breaks the order is
/// still repaired, one that keeps it is left to read as an isolated CRC mismatch. After a crash
/// (the default) both are repaired.
#[tokio::test(flavor = "multi_thread")]
async fn a_quick_tail_check_repairs_what_it_sees_and_leaves_an_ordered_flip_to_the_reader() {
    let tmp = tempfile::tempdir().unwrap();
    let pristine = tmp.path().join("pristine");
    let log = open(&pristine, 1 << 20).unwrap();
    fill(&log, 40).await;
    close(log).await;
    let index = std::fs::read(seg0(&pristine).index).unwrap();
    let positions = index::decode(&index);
    // Entry 20 one byte later keeps the order (entries are longer than 9 bytes); entry 20 far
    // beyond the data breaks it.
    for (p20, keeps_order) in [
        (positions[20] + 1, true),
        (positions[20] | (1 << 40), false),
    ] {
        for check in [TailCheck::Quick, TailCheck::Full] {
            let dir = tmp.path().join(format!("{check:?}-{keeps_order}"));
            copy_segment(&pristine, &dir);
            let mut flipped = positions.clone();
            flipped[20] = p20;
            std::fs::write(seg0(&dir).index, index::encode(&flipped)).unwrap();
            let config = LogConfig {
                tail_check: check,
                ..LogConfig::default()
            };
            let log = Log::open(&dir, Arc::new(OsFs), config).unwrap();
            assert_eq!(log.next_offset(), 40);
            let corrupt: Vec<u64> = log
                .read_from(0, 100, usize::MAX)
                .unwrap()
                .into_iter()
                .filter(|e| e.payload.is_err())
                .map(|e| e.offset)
                .collect();
            if check == TailCheck::Quick && keeps_order {
                assert!(
                    !corrupt.is_empty() && corrupt.iter().all(|o| [19, 20].contains(o)),
                    "{corrupt:?}"
                );
            } else {
                assert!(
                    corrupt.is_empty(),
                    "{check:?} keeps_order={keeps_order}: {corrupt:?}"
                );
            }
        }
    }
}

/// Retention deletes a segment's index, then its data: a crash between the two (or a disk that
/// kept one unlink and not the other) leaves the oldest segment with one file. The next open
/// removes it and starts at the next segment; the same shape anywhere else is damage and refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_retention_pass_interrupted_between_a_segments_two_files_is_finished_at_open() {
    for missing in [scan::INDEX_EXT, scan::DATA_EXT] {
        let tmp = tempfile::tempdir().unwrap();
        let log = open(tmp.path(), 60).unwrap();
        fill(&log, 20).await;
        let starts: Vec<u64> = log.segments().iter().map(|s| s.start).collect();
        assert!(starts.len() > 4, "{starts:?}");
        // Retention took segment 0 whole and half of segment 1.
        assert_eq!(log.remove_segments_before(starts[1]).unwrap(), 1);
        close(log).await;
        std::fs::remove_file(tmp.path().join(segment_file_name(starts[1], missing))).unwrap();
        let log = open(tmp.path(), 60).unwrap();
        assert_eq!(log.first_offset(), starts[2], "{missing}");
        let all = read_all_from(&log, starts[2]);
        assert_eq!(all, (starts[2]..20).map(payload).collect::<Vec<_>>());
        assert!(
            !tmp.path()
                .join(segment_file_name(starts[1], scan::DATA_EXT))
                .exists()
        );
        assert!(
            !tmp.path()
                .join(segment_file_name(starts[1], scan::INDEX_EXT))
                .exists()
        );
        close(log).await;
        // In the middle of the log, a missing file is refused.
        std::fs::remove_file(tmp.path().join(segment_file_name(starts[3], missing))).unwrap();
        assert!(open(tmp.path(), 60).is_err(), "{missing}");
    }
}

fn read_all_from(log: &Log, from: u64) -> Vec<Vec<u8>> {
    log.read_from(from, usize::MAX, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|e| e.payload.unwrap())
        .collect()
}
