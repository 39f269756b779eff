//! `sptr bag`: rosbag2 bags (MCAP or sqlite3 storage).

use std::path::PathBuf;

use anyhow::Result;

#[derive(clap::Subcommand)]
pub enum BagCmd {
    /// Storage, files, duration, topics with types and message counts.
    Info {
        /// Bag directory (with metadata.yaml), its metadata.yaml, or a single .mcap file.
        bag: PathBuf,
        /// Also read every message and count it per topic (checks the bag can be read).
        #[arg(long)]
        count: bool,
    },
}

pub fn command(what: BagCmd) -> Result<()> {
    match what {
        BagCmd::Info { bag, count } => {
            // Library errors already carry their cause in their message: show it once.
            let b = crate::bag::Bag::open(&bag).map_err(|e| anyhow::anyhow!("{e}"))?;
            let (text, error) = crate::bag::info::summary(&b, count);
            print!("{text}");
            match error {
                Some(e) => anyhow::bail!("reading the messages: {e}"),
                None => Ok(()),
            }
        }
    }
}
