//! A single `.mcap` file given to `sptr replay` / `sptr bag info`: opened, every message read and
//! every supported message decoded, as replay does.
#[path = "bag_messages.rs"]
mod bag_messages;

/// One input: returns when the decoder refuses it, panics when a check fails.
pub fn check(data: &[u8]) {
    let dir = std::env::temp_dir().join(format!("sptr-fuzz-mcap-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let file = dir.join("fuzz.mcap");
    if std::fs::write(&file, data).is_err() {
        return;
    }
    bag_messages::read_all(&file, data);
}
