//! `tidal crd`: prints the `Model` CustomResourceDefinition (what `crds/model.yaml` holds),
//! or with `--pool` the `ModelPool` one (what `crds/modelpool.yaml` holds).

use anyhow::Context;
use clap::Args;

/// Flags of `tidal crd` (it prints the YAML to stdout).
#[derive(Args, Debug)]
pub struct CrdArgs {
    /// Print the `ModelPool` CRD instead of the `Model` one.
    #[arg(long)]
    pub pool: bool,
}

/// Prints the CRD YAML.
pub fn run(args: CrdArgs) -> anyhow::Result<()> {
    let yaml = if args.pool {
        tidal_crds::pool_crd_yaml()
    } else {
        tidal_crds::crd_yaml()
    };
    print!("{}", yaml.context("rendering the CRD as YAML")?);
    Ok(())
}
