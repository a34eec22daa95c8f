//! `leasehold completions <SHELL>` and `leasehold man`: generated from the command line's own definition, so they
//! never drift from `--help`.

use clap::CommandFactory as _;

use crate::cli::{Cli, CompletionsArgs, ManArgs};
use crate::exit::{self, fail};

/// Prints the completion script for one shell.
pub fn completions(args: &CompletionsArgs) -> anyhow::Result<u8> {
    // The internal commands (demo-buyer, bench-worker) are hidden from --help; they are left out here too, on a copy
    // of the root that has only the visible ones.
    let root = Cli::command();
    let mut command = clap::Command::new("leasehold")
        .version(root.get_version().unwrap_or_default().to_owned())
        .about(root.get_about().cloned().unwrap_or_default())
        .subcommands(root.get_subcommands().filter(|c| !c.is_hide_set()).cloned());
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "leasehold", &mut script);
    exit::print_out(&String::from_utf8_lossy(&script));
    Ok(0)
}

/// Prints a man page in roff: `leasehold(1)`, or with a COMMAND `leasehold-COMMAND(1)` (as git splits its pages).
pub fn man(args: &ManArgs) -> anyhow::Result<u8> {
    let root = Cli::command();
    let command = match &args.command {
        None => root,
        Some(name) => {
            let Some(sub) = root.find_subcommand(name).filter(|c| !c.is_hide_set()) else {
                return Err(fail(
                    exit::USAGE,
                    format!("man: no command {name:?} (see leasehold --help)"),
                ));
            };
            let full = format!("leasehold-{name}");
            sub.clone().name(full).bin_name(format!("leasehold {name}"))
        }
    };
    let mut page = Vec::new();
    clap_mangen::Man::new(command)
        .render(&mut page)
        .map_err(|err| fail(exit::INTERNAL, format!("cannot render the man page: {err}")))?;
    exit::print_out(&String::from_utf8_lossy(&page));
    Ok(0)
}
