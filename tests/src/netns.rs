//! A network namespace joined to the root namespace by a veth pair, with a partition switch
//! that behaves like a real network partition.
//!
//! [`NetNs::partition`] drops every packet at the INGRESS of both veth ends (iptables
//! `INPUT` and `FORWARD` rules matching the veth interface, in each namespace). Each kernel
//! then sees its segments vanish in the network, so retransmission, keepalive and
//! `TCP_USER_TIMEOUT` give-ups happen as they would on a real network. An egress drop (for
//! example a `tc` qdisc) would not do: Linux treats it as local congestion and does not
//! count unanswered keepalive probes then.
//!
//! Needs root, `ip` (iproute2) and `iptables`; without them [`NetNs::create`] fails with a
//! message that says what is missing (`.ci/install-deps` installs both). Names and
//! addresses are unique per namespace, so parallel tests do not clash; dropping the
//! [`NetNs`] removes its rules, its veth pair and the namespace.

use crate::{lock_file, run, KitError};
use std::collections::HashSet;
use std::ffi::OsStr;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long one `ip` or `iptables` call may take.
const TOOL_TIMEOUT: Duration = Duration::from_secs(30);

/// The veth links are /30 networks carved out of this /16 (`10.231.0.0/16`).
const BASE: [u8; 2] = [10, 231];
/// Number of /30 networks in the /16.
const NETWORKS: u32 = 1 << 14;

/// A network namespace `name` with a veth pair: `host_if` (address `host_addr`) in the
/// root namespace, `ns_if` (address `ns_addr`) inside, on a /30 of their own.
pub struct NetNs {
    name: String,
    host_if: String,
    ns_if: String,
    host_addr: Ipv4Addr,
    ns_addr: Ipv4Addr,
    ip: PathBuf,
    iptables: PathBuf,
    partitioned: bool,
}

impl NetNs {
    /// Creates the namespace and its veth pair, both ends up (and `lo` inside).
    pub fn create() -> Result<NetNs, KitError> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err(KitError::Invalid(
                "network namespaces, veth pairs and iptables rules need root: run this test \
                 as root (CI does)"
                    .into(),
            ));
        }
        let ip = find_tool("ip", "iproute2")?;
        let iptables = find_tool("iptables", "iptables")?;
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let name = format!("lt{pid}n{n}");
        // Serialize the choice of a free /30 (and its use) across test processes.
        let _lock = lock_file(&std::env::temp_dir().join("lease-tests-netns.lock"))?;
        let index = free_network(&ip, pid, n)?;
        let [a, b] = BASE;
        let base = index * 4;
        let (c, d) = ((base >> 8) as u8, (base & 0xff) as u8);
        let ns = NetNs {
            host_if: format!("{name}h"),
            ns_if: format!("{name}s"),
            host_addr: Ipv4Addr::new(a, b, c, d + 1),
            ns_addr: Ipv4Addr::new(a, b, c, d + 2),
            name,
            ip,
            iptables,
            partitioned: false,
        };
        // From here on, `Drop` cleans up whatever was created.
        ns.ip(&["netns", "add", &ns.name])?;
        let (host_if, ns_if, name) = (&ns.host_if, &ns.ns_if, &ns.name);
        ns.ip(&[
            "link", "add", host_if, "type", "veth", "peer", "name", ns_if,
        ])?;
        ns.ip(&["link", "set", ns_if, "netns", name])?;
        let host_cidr = format!("{}/30", ns.host_addr);
        let ns_cidr = format!("{}/30", ns.ns_addr);
        ns.ip(&["addr", "add", &host_cidr, "dev", host_if])?;
        ns.ip(&["link", "set", host_if, "up"])?;
        ns.ip_in(&["addr", "add", &ns_cidr, "dev", ns_if])?;
        ns.ip_in(&["link", "set", ns_if, "up"])?;
        ns.ip_in(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name (for `ip netns exec`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The address of the veth end in the root namespace: what a process inside the
    /// namespace connects to to reach a server of the root namespace listening there.
    pub fn host_addr(&self) -> Ipv4Addr {
        self.host_addr
    }

    /// The address of the veth end inside the namespace: where its connections come from.
    pub fn ns_addr(&self) -> Ipv4Addr {
        self.ns_addr
    }

    /// The veth link's network, `10.231.X.Y/30` (for `pg_hba.conf`).
    pub fn network(&self) -> String {
        let [a, b, c, d] = self.host_addr.octets();
        format!("{}/30", Ipv4Addr::new(a, b, c, d - 1))
    }

    /// A command that runs `program` inside the namespace (`ip netns exec NAME program`).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new(&self.ip);
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }

    /// `cmd` (program, arguments, environment changes, working directory) run inside the
    /// namespace.
    pub fn wrap(&self, cmd: Command) -> Command {
        let mut wrapped = self.command(cmd.get_program());
        wrapped.args(cmd.get_args());
        for (key, value) in cmd.get_envs() {
            match value {
                Some(v) => wrapped.env(key, v),
                None => wrapped.env_remove(key),
            };
        }
        if let Some(dir) = cmd.get_current_dir() {
            wrapped.current_dir(dir);
        }
        wrapped
    }

    /// Cuts the link: DROP at the ingress of both veth ends. Established connections
    /// stay open on both sides and see nothing more from each other.
    pub fn partition(&mut self) -> Result<(), KitError> {
        if self.partitioned {
            return Ok(());
        }
        self.partitioned = true;
        for chain in ["INPUT", "FORWARD"] {
            self.iptables_root(&["-I", chain, "-i", &self.host_if, "-j", "DROP"])?;
            self.iptables_in(&["-I", chain, "-i", &self.ns_if, "-j", "DROP"])?;
        }
        Ok(())
    }

    /// Heals the link: removes the rules [`NetNs::partition`] added.
    pub fn heal(&mut self) -> Result<(), KitError> {
        if !self.partitioned {
            return Ok(());
        }
        let mut first_error = None;
        for chain in ["INPUT", "FORWARD"] {
            let root = self.iptables_root(&["-D", chain, "-i", &self.host_if, "-j", "DROP"]);
            let inside = self.iptables_in(&["-D", chain, "-i", &self.ns_if, "-j", "DROP"]);
            for result in [root, inside] {
                if let Err(e) = result {
                    first_error.get_or_insert(e);
                }
            }
        }
        self.partitioned = false;
        first_error.map_or(Ok(()), Err)
    }

    /// Whether the link is cut.
    pub fn is_partitioned(&self) -> bool {
        self.partitioned
    }

    fn ip(&self, args: &[&str]) -> Result<String, KitError> {
        run(
            Command::new(&self.ip).args(args),
            &format!("ip {}", args.join(" ")),
            TOOL_TIMEOUT,
        )
    }

    fn ip_in(&self, args: &[&str]) -> Result<String, KitError> {
        run(
            self.command(&self.ip).args(args),
            &format!("ip netns exec {} ip {}", self.name, args.join(" ")),
            TOOL_TIMEOUT,
        )
    }

    fn iptables_root(&self, args: &[&str]) -> Result<String, KitError> {
        run(
            Command::new(&self.iptables).arg("-w").args(args),
            &format!("iptables {}", args.join(" ")),
            TOOL_TIMEOUT,
        )
    }

    fn iptables_in(&self, args: &[&str]) -> Result<String, KitError> {
        run(
            self.command(&self.iptables).arg("-w").args(args),
            &format!("ip netns exec {} iptables {}", self.name, args.join(" ")),
            TOOL_TIMEOUT,
        )
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // The root namespace's rules match the interface by name and outlive it: remove
        // them first. The namespace's own rules go with the namespace.
        let _ = self.heal();
        // Deleting one end of a veth pair deletes both.
        let _ = self.ip(&["link", "del", &self.host_if]);
        let _ = self.ip(&["netns", "del", &self.name]);
    }
}

/// `PROGRAM` on `PATH` or in `/usr/sbin` or `/sbin`, else a [`KitError::Missing`] naming
/// the Debian `package`.
fn find_tool(program: &str, package: &str) -> Result<PathBuf, KitError> {
    let path: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    path.into_iter()
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            KitError::Missing(format!(
                "{program} not found on PATH, in /usr/sbin or /sbin: install it: \
                 apt-get install {package} (or run .ci/install-deps)"
            ))
        })
}

/// Index of a /30 in [`BASE`] that no interface of the root namespace uses, starting from a
/// pseudo-random place so that concurrent test processes rarely look at the same ones.
fn free_network(ip: &std::path::Path, pid: u32, n: u64) -> Result<u32, KitError> {
    let out = run(
        Command::new(ip).args(["-4", "-o", "addr", "show"]),
        "ip -4 -o addr show",
        TOOL_TIMEOUT,
    )?;
    let used: HashSet<u32> = out
        .split_whitespace()
        .filter_map(|word| word.split_once('/')?.0.parse::<Ipv4Addr>().ok())
        .filter(|addr| addr.octets()[..2] == BASE)
        .map(|addr| {
            let [_, _, c, d] = addr.octets();
            ((u32::from(c) << 8) | u32::from(d)) / 4
        })
        .collect();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let start = (pid.wrapping_mul(2_654_435_761) ^ nanos ^ (n as u32)) % NETWORKS;
    (0..NETWORKS)
        .map(|i| (start + i) % NETWORKS)
        // Skip the /16's first and last /30 (network and broadcast of the whole range).
        .find(|i| *i != 0 && *i != NETWORKS - 1 && !used.contains(i))
        .ok_or_else(|| KitError::Failed {
            context: "no free /30 left in 10.231.0.0/16 for a veth link".into(),
            detail: out,
        })
}
