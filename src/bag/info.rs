//! `sptr bag info`: what a bag holds (storage, files, duration, topics with types and counts),
//! as `ros2 bag info` prints it, without ROS. Counts come from the metadata; with `count`
//! the messages are read too, which also checks that every one of them can be read.

use super::reader::{Bag, BagError};

/// Text summary of `bag`. With `count`, the messages are read and counted per topic (an error
/// part way is reported after the counts of what was read).
pub fn summary(bag: &Bag, count: bool) -> (String, Option<BagError>) {
    let mut s = String::new();
    let secs = bag.duration_ns() as f64 * 1e-9;
    s.push_str(&format!("bag:        {}\n", bag.path().display()));
    s.push_str(&format!("storage:    {}", bag.storage().as_str()));
    if bag.version() > 0 {
        s.push_str(&format!(" (metadata version {})", bag.version()));
    }
    s.push('\n');
    for f in bag.files() {
        let size = std::fs::metadata(f).map(|m| m.len()).ok();
        match size {
            Some(b) => s.push_str(&format!("file:       {} ({b} bytes)\n", f.display())),
            None => s.push_str(&format!("file:       {} (missing)\n", f.display())),
        }
    }
    s.push_str(&format!("start:      {} ns\n", bag.starting_time_ns()));
    s.push_str(&format!("duration:   {secs:.3} s\n"));
    s.push_str(&format!("messages:   {}\n", bag.message_count()));
    let mut counted: Vec<u64> = vec![0; bag.topics().len()];
    let mut error = None;
    if count {
        for m in bag.messages(&[]) {
            match m {
                Ok(m) => {
                    if let Some(i) = bag.topics().iter().position(|t| t.name == m.topic) {
                        counted[i] += 1;
                    }
                }
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
        }
    }
    let width = bag
        .topics()
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let twidth = bag
        .topics()
        .iter()
        .map(|t| t.type_name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    s.push_str(&format!(
        "topics:     {}\n  {:<width$}  {:<twidth$}  {:>8}{}\n",
        bag.topics().len(),
        "topic",
        "type",
        "count",
        if count { "      read" } else { "" }
    ));
    for (t, c) in bag.topics().iter().zip(&counted) {
        s.push_str(&format!(
            "  {:<width$}  {:<twidth$}  {:>8}",
            t.name, t.type_name, t.count
        ));
        if count {
            s.push_str(&format!("  {c:>8}"));
        }
        s.push('\n');
    }
    (s, error)
}
