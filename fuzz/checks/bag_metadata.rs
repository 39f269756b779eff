//! A bag directory's `metadata.yaml`, next to a small valid MCAP file and a small valid sqlite3
//! file (so that metadata naming either gets as far as reading it).
use sptr::bag::reader::Bag;

const MCAP: &[u8] = include_bytes!("../../tests/data/bags/mcap_small/mcap_small.mcap");
const DB3: &[u8] = include_bytes!("../../tests/data/bags/sqlite_small/sqlite_small.db3");

/// One input: returns when the decoder refuses it, panics when a check fails.
pub fn check(data: &[u8]) {
    let dir = std::env::temp_dir().join(format!("sptr-fuzz-meta-{}", std::process::id()));
    if !dir.join("mcap_small.mcap").exists() {
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::write(dir.join("mcap_small.mcap"), MCAP);
        let _ = std::fs::write(dir.join("sqlite_small.db3"), DB3);
    }
    if std::fs::write(dir.join("metadata.yaml"), data).is_err() {
        return;
    }
    let Ok(bag) = Bag::open(&dir) else {
        return;
    };
    let _ = sptr::bag::info::summary(&bag, false);
    for msg in bag.messages(&[]).take(64) {
        if msg.is_err() {
            break;
        }
    }
}
