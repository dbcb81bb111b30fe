use anyhow::{Result, bail};

pub fn main(_args: &[String]) -> Result<()> {
    bail!("no benchmarks yet")
}
