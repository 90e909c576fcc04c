//! Names the commit in `kvtrace --version`, so a report or a bug can say which build made it.
//! A build outside a git checkout (a crates.io package, a tarball) says only the version.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    };
    let version = env!("CARGO_PKG_VERSION");
    let long = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(commit) => {
            let date = git(&["log", "-1", "--format=%cs"]).unwrap_or_default();
            format!("{version} ({commit} {date})")
        }
        None => version.to_owned(),
    };
    println!("cargo:rustc-env=KVTRACE_LONG_VERSION={long}");
}
