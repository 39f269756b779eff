//! A single `.mcap` file given to `sptr replay` / `sptr bag info`: opened, every message read and
//! every supported message decoded, as replay does.
use sptr::msgs::cdr::{decode_message, is_supported_type};
use sptr::bag::reader::Bag;

/// One input: returns when the decoder refuses it, panics when a check fails.
pub fn check(data: &[u8]) {
    let dir = std::env::temp_dir().join(format!("sptr-fuzz-mcap-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let file = dir.join("fuzz.mcap");
    if std::fs::write(&file, data).is_err() {
        return;
    }
    let Ok(bag) = Bag::open(&file) else {
        return;
    };
    for msg in bag.messages(&[]) {
        let Ok(msg) = msg else {
            break;
        };
        // A message's payload comes out of the file: it cannot be larger than the file.
        assert!(msg.data.len() <= data.len());
        if is_supported_type(&msg.type_name) {
            let _ = decode_message(&msg.type_name, &msg.data);
        }
    }
}
