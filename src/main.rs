//! The `kvtrace` command line: parses arguments and hands them to the library.

#![warn(unreachable_pub)]

mod cli;

fn main() {
    kvtrace::interrupt::install();
    std::process::exit(cli::run());
}
