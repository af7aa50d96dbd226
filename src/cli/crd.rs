//! `tidal crd`: prints the `Model` CustomResourceDefinition (what `crds/model.yaml` holds).

use anyhow::Context;
use clap::Args;

/// Flags of `tidal crd` (none: it prints the YAML to stdout).
#[derive(Args, Debug)]
pub struct CrdArgs {}

/// Prints the CRD YAML.
pub fn run(_args: CrdArgs) -> anyhow::Result<()> {
    let yaml = tidal_crds::crd_yaml().context("rendering the CRD as YAML")?;
    print!("{yaml}");
    Ok(())
}
