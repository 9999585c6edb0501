//! The watchdog's command line, written by the runner and read by the
//! watchdog (the crate docs describe the protocol).

use std::ffi::OsString;

/// The hidden subcommand that makes the embedding binary a watchdog: its
/// first argument when the runner re-executes it.
pub const SUBCOMMAND: &str = "__watchdog";

/// Sent to the watchdog by the kernel when the runner's thread that started
/// it exits (`PR_SET_PDEATHSIG`): kill the group at once, if the runner is
/// gone.
pub(crate) const PARENT_DEATH_SIGNAL: libc::c_int = libc::SIGUSR1;

/// The watchdog's arguments after [`SUBCOMMAND`]:
/// `--parent PID [--log CONFIG] [--stdin-fd FD] [--stdout-fd FD] [--no-cgroup] [-- COMMAND...]`.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Args {
    /// The runner's pid: the watchdog exits at once, killing the tree, if
    /// its parent is another.
    pub(crate) parent: i32,
    /// For the embedding binary's log setup (`Command::watchdog_log`).
    pub(crate) log: String,
    /// An inherited descriptor for the command's stdin (the runner's).
    pub(crate) stdin_fd: Option<i32>,
    /// An inherited descriptor for the command's stdout (the runner's).
    pub(crate) stdout_fd: Option<i32>,
    /// No cgroup leaf for the command, even where one could be made
    /// (`Command::cgroup`).
    pub(crate) no_cgroup: bool,
    /// The command the watchdog starts on `spawn`.
    pub(crate) command: Vec<OsString>,
}

impl Args {
    /// The arguments after [`SUBCOMMAND`].
    pub(crate) fn to_argv(&self) -> Vec<OsString> {
        let mut out: Vec<OsString> = vec!["--parent".into(), self.parent.to_string().into()];
        if !self.log.is_empty() {
            out.extend(["--log".into(), self.log.clone().into()]);
        }
        for (flag, fd) in [
            ("--stdin-fd", self.stdin_fd),
            ("--stdout-fd", self.stdout_fd),
        ] {
            if let Some(fd) = fd {
                out.extend([flag.into(), fd.to_string().into()]);
            }
        }
        if self.no_cgroup {
            out.push("--no-cgroup".into());
        }
        out.push("--".into());
        out.extend(self.command.iter().cloned());
        out
    }

    /// Reads the arguments after [`SUBCOMMAND`]; `Err` names what is wrong.
    pub(crate) fn parse(argv: impl IntoIterator<Item = OsString>) -> Result<Args, String> {
        let mut args = Args::default();
        let mut parent = None;
        let mut argv = argv.into_iter();
        while let Some(arg) = argv.next() {
            let flag = arg.to_string_lossy().into_owned();
            if flag == "--" {
                args.command = argv.collect();
                break;
            }
            if flag == "--no-cgroup" {
                args.no_cgroup = true;
                continue;
            }
            let value = argv
                .next()
                .map(|v| v.to_string_lossy().into_owned())
                .ok_or_else(|| format!("{flag}: a value is missing"))?;
            let number = || {
                value
                    .parse::<i32>()
                    .map_err(|_| format!("{flag}: not a number: {value:?}"))
            };
            match flag.as_str() {
                "--parent" => parent = Some(number()?),
                "--stdin-fd" => args.stdin_fd = Some(number()?),
                "--stdout-fd" => args.stdout_fd = Some(number()?),
                "--log" => args.log = value,
                _ => return Err(format!("unknown argument {flag:?}")),
            }
        }
        args.parent = parent.ok_or("--parent is missing")?;
        Ok(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_round_trip() {
        let args = Args {
            parent: 42,
            log: "quiet,json".into(),
            stdin_fd: Some(3),
            stdout_fd: None,
            no_cgroup: true,
            command: vec!["sh".into(), "-c".into(), "--parent".into()],
        };
        assert_eq!(Args::parse(args.to_argv()), Ok(args));
        let bare = Args::parse(["--parent".into(), "7".into()]).expect("parent only");
        assert_eq!((bare.parent, bare.command.len()), (7, 0));
        let parse = |argv: &[&str]| Args::parse(argv.iter().map(OsString::from));
        assert!(parse(&[]).is_err(), "no parent");
        assert!(parse(&["--parent"]).is_err(), "no value");
        assert!(parse(&["--parent", "x"]).is_err());
        assert!(parse(&["--parent", "7", "--quiet", "x"]).is_err());
    }
}
