//! Segment and index recovery on arbitrary bytes on disk (on the simulated disk, so a run does no
//! I/O): opening never panics; a log that opens reads back every entry it claims (each a payload
//! or an isolated corruption), takes an append at its next offset, and reopens to the same state.
#![no_main]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use mmmq::storage::vfs::sim::SimFs;
use mmmq::storage::vfs::{OpenMode, Vfs};
use mmmq::storage::{Log, LogConfig};

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
    })
}

fn write(fs: &SimFs, path: &std::path::Path, bytes: &[u8]) {
    let f = fs.open(path, OpenMode::CreateNew).unwrap();
    f.write_all_at(bytes, 0).unwrap();
    f.sync_data().unwrap();
}

fuzz_target!(|data: &[u8]| {
    // Layout: [u8 segments][per segment: u16 data len, u16 index len, start offset u8]* bytes...
    let Some((&n, mut rest)) = data.split_first() else {
        return;
    };
    let fs = SimFs::new();
    let dir = PathBuf::from("/sim/t");
    fs.mkdir_durable(&dir);
    let mut start = 0u64;
    for _ in 0..(n % 4) {
        if rest.len() < 5 {
            break;
        }
        let data_len = u16::from_le_bytes([rest[0], rest[1]]) as usize % 512;
        let index_len = u16::from_le_bytes([rest[2], rest[3]]) as usize % 128;
        start += u64::from(rest[4] % 8);
        rest = &rest[5..];
        let take = |rest: &mut &[u8], len: usize| {
            let len = len.min(rest.len());
            let (a, b) = rest.split_at(len);
            *rest = b;
            a.to_vec()
        };
        let d = take(&mut rest, data_len);
        let i = take(&mut rest, index_len);
        write(&fs, &dir.join(format!("{start:019}.mmm")), &d);
        write(&fs, &dir.join(format!("{start:019}.idx")), &i);
        start += 1;
    }
    fs.sync_dir(&dir).unwrap();
    let vfs: Arc<dyn Vfs> = Arc::new(fs.clone());
    let _guard = runtime().enter();
    let Ok(log) = Log::open(&dir, vfs.clone(), LogConfig::default()) else {
        return;
    };
    let next = log.next_offset();
    let first = log.first_offset();
    let entries = log.read_from(first, usize::MAX, usize::MAX).unwrap();
    assert_eq!(entries.len() as u64, next - first);
    for (k, e) in entries.iter().enumerate() {
        assert_eq!(e.offset, first + k as u64);
    }
    let offset = runtime().block_on(log.append(b"{\"after\":true}")).unwrap();
    assert_eq!(offset, next);
    drop(log);
    let log = Log::open(&dir, vfs, LogConfig::default()).unwrap();
    assert_eq!(log.next_offset(), next + 1);
    assert_eq!(log.read(next).unwrap().unwrap(), b"{\"after\":true}");
});
