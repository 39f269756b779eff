//! What the bag checks share: a bag opened from the fuzzer's bytes, read the way replay reads it.
use sptr::bag::reader::Bag;
use sptr::msgs::cdr::{decode_message, is_supported_type};

/// Opens the bag at `path` (made from `data`), reads every message and decodes every supported
/// one; returns when the reader refuses the bag or a message. Checks that no message's payload is
/// larger than the input it came out of.
pub fn read_all(path: &std::path::Path, data: &[u8]) {
    let Ok(bag) = Bag::open(path) else {
        return;
    };
    for msg in bag.messages(&[]) {
        let Ok(msg) = msg else {
            break;
        };
        assert!(msg.data.len() <= data.len(), "a message of {} bytes out of {} bytes of input", msg.data.len(), data.len());
        if is_supported_type(&msg.type_name) {
            let _ = decode_message(&msg.type_name, &msg.data);
        }
    }
}
