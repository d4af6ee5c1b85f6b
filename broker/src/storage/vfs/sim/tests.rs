//! The simulated disk itself: what it keeps and forgets at a power cut.

use super::*;

fn fs() -> (SimFs, PathBuf) {
    let fs = SimFs::new();
    let root = PathBuf::from("/sim");
    fs.mkdir_durable(&root);
    (fs, root)
}

#[test]
fn unsynced_bytes_are_lost_and_synced_bytes_kept() {
    let (fs, root) = fs();
    let path = root.join("f");
    let f = fs.open(&path, OpenMode::CreateNew).unwrap();
    fs.sync_dir(&root).unwrap();
    f.write_all_at(b"durable", 0).unwrap();
    f.sync_data().unwrap();
    f.write_all_at(b"-volatile", 7).unwrap();
    assert_eq!(fs.contents(&path).unwrap(), b"durable-volatile");
    fs.power_cut(1, CutMode::SyncedOnly);
    assert_eq!(fs.contents(&path).unwrap(), b"durable");
    let mut buf = [0u8; 1];
    assert!(f.read_exact_at(&mut buf, 0).is_err(), "old handles die");
}

#[test]
fn a_file_whose_directory_was_not_synced_disappears() {
    let (fs, root) = fs();
    let path = root.join("f");
    let f = fs.open(&path, OpenMode::CreateNew).unwrap();
    f.write_all_at(b"x", 0).unwrap();
    f.sync_data().unwrap();
    fs.power_cut(1, CutMode::SyncedOnly);
    assert!(!fs.exists(&path));
}

#[test]
fn a_rename_is_durable_only_after_the_directory_sync() {
    let (fs, root) = fs();
    let (tmp, dst) = (root.join("a.tmp"), root.join("a"));
    let f = fs.open(&tmp, OpenMode::CreateNew).unwrap();
    f.write_all_at(b"1", 0).unwrap();
    f.sync_data().unwrap();
    fs.rename(&tmp, &dst).unwrap();
    fs.sync_dir(&root).unwrap();
    let f = fs.open(&tmp, OpenMode::CreateNew).unwrap();
    f.write_all_at(b"2", 0).unwrap();
    f.sync_data().unwrap();
    fs.rename(&tmp, &dst).unwrap();
    fs.power_cut(1, CutMode::SyncedOnly);
    assert_eq!(fs.contents(&dst).unwrap(), b"1");
    assert_eq!(fs.read_dir(&root).unwrap(), vec!["a".to_owned()]);
}

#[test]
fn cut_modes_keep_only_written_bytes() {
    for seed in 0..50 {
        for mode in [CutMode::Prefix, CutMode::TornSectors] {
            let (fs, root) = fs();
            let path = root.join("f");
            let f = fs.open(&path, OpenMode::CreateNew).unwrap();
            fs.sync_dir(&root).unwrap();
            f.write_all_at(&[1; 100], 0).unwrap();
            f.sync_data().unwrap();
            f.write_all_at(&[2; 2000], 100).unwrap();
            fs.power_cut(seed, mode);
            let got = fs.contents(&path).unwrap();
            assert!(got.len() >= 100 && got.len() <= 2100, "{mode:?} {seed}");
            assert_eq!(&got[..100], &[1; 100]);
            assert!(got[100..].iter().all(|&b| b == 2 || b == 0));
            if mode == CutMode::Prefix {
                assert!(got[100..].iter().all(|&b| b == 2), "in order: no holes");
            }
        }
    }
}

#[test]
fn a_dead_machine_fails_every_change() {
    let (fs, root) = fs();
    let f = fs.open(&root.join("f"), OpenMode::CreateNew).unwrap();
    fs.die_after(1);
    f.write_all_at(b"a", 0).unwrap();
    assert_eq!(
        f.write_all_at(b"b", 1).unwrap_err().raw_os_error(),
        Some(libc::EIO)
    );
    assert!(f.sync_data().is_err());
    fs.power_cut(0, CutMode::SyncedOnly);
    assert!(!fs.exists(&root.join("f")));
}
