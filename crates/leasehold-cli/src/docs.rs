//! `leasehold completions <SHELL>` and `leasehold man`: generated from the command line's own definition, so they
//! never drift from `--help`.

use clap::Args;

use crate::exit::{self, fail};

/// `leasehold completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_name = "SHELL")]
    pub shell: clap_complete::Shell,
}

/// `leasehold man`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// A command (run, status, list, release, permits, demo, bench, completions) for its own page, leasehold-COMMAND(1).
    #[arg(value_name = "COMMAND")]
    pub command: Option<String>,
}

/// Prints the completion script for one shell, from `root`, the command line's definition.
pub fn completions(args: &CompletionsArgs, root: &clap::Command) -> anyhow::Result<u8> {
    // The internal commands (demo-buyer, bench-worker) are hidden from --help; they are left out here too, on a copy
    // of the root that has only the visible ones.
    let mut command = clap::Command::new("leasehold")
        .version(root.get_version().unwrap_or_default().to_owned())
        .about(root.get_about().cloned().unwrap_or_default())
        .subcommands(root.get_subcommands().filter(|c| !c.is_hide_set()).cloned());
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "leasehold", &mut script);
    exit::print_out(&String::from_utf8_lossy(&script));
    Ok(0)
}

/// Prints a man page in roff, from `root`, the command line's definition: `leasehold(1)`, or with a COMMAND
/// `leasehold-COMMAND(1)` (as git splits its pages).
pub fn man(args: &ManArgs, root: clap::Command) -> anyhow::Result<u8> {
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
