//! The runner's API end to end, without a database: this test binary is its
//! own watchdog (`main` calls `maybe_run_watchdog` first, as an embedding
//! binary does), starts commands under it and checks what is left of their
//! trees. Timings are printed (`FIGURE` lines).

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lease_exec::{Command, Error, Watchdog};

fn main() {
    lease_exec::maybe_run_watchdog(|_| {});
    // This binary is also the tests' helpers: the pid hopper and the idle
    // host processes (before any thread or runtime starts: they fork).
    let mut args = std::env::args_os().skip(1);
    match args.next().and_then(|a| a.into_string().ok()).as_deref() {
        Some(HOPPER) => hopper(Path::new(&args.next().expect("hopper's directory"))),
        Some(IDLE) => idle(
            args.next()
                .and_then(|n| n.into_string().ok()?.parse().ok())
                .expect("idle's count"),
        ),
        Some(SUBREAPER_CASE) => {
            let cgroup = args.next().is_some_and(|c| c == "cgroup");
            let dir = PathBuf::from(args.next().expect("the case's directory"));
            lease_exec::become_subreaper().expect("become a subreaper");
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(a_job_stops_a_pid_hopper_whose_watchdog_died(&dir, cgroup));
            std::process::exit(0);
        }
        _ => {}
    }
    // Orphans of a test's tree whose watchdog died come to this process, not
    // init (whose reaping may be slow): the guards kill and reap them. The
    // crate's own notion of the tree is unchanged (`become_subreaper` is not
    // called).
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let run =
        |name: &str,
         test: &dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>| {
            if filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str())) {
                rt.block_on(test());
                println!("test {name} ... ok");
            }
        };
    run("the_exit_status_is_reported", &|| {
        Box::pin(the_exit_status_is_reported())
    });
    run("a_missing_program_is_a_spawn_error", &|| {
        Box::pin(a_missing_program_is_a_spawn_error())
    });
    run("an_unrenewed_deadline_kills_the_whole_tree", &|| {
        Box::pin(an_unrenewed_deadline_kills_the_whole_tree())
    });
    run("a_dropped_watchdog_kills_the_whole_tree_at_once", &|| {
        Box::pin(a_dropped_watchdog_kills_the_whole_tree_at_once())
    });
    run(
        "terminate_kills_what_ignores_sigterm_after_the_grace",
        &|| Box::pin(terminate_kills_what_ignores_sigterm_after_the_grace()),
    );
    // Each with the cgroup leaf where one can be made, and without (the
    // tree walk alone, as where none can be).
    for (cgroup, how) in [(true, "in_a_cgroup"), (false, "by_the_tree_walk")] {
        run(&format!("terminate_stops_a_pid_hopper_{how}"), &|| {
            Box::pin(terminate_stops_a_pid_hopper(cgroup))
        });
        run(
            &format!("a_dropped_watchdog_stops_a_pid_hopper_{how}"),
            &|| Box::pin(a_dropped_watchdog_stops_a_pid_hopper(cgroup)),
        );
        run(
            &format!("a_subreaper_job_stops_a_pid_hopper_{how}"),
            &|| Box::pin(in_a_subreaper(cgroup)),
        );
        run(
            &format!("a_stop_costs_the_same_with_many_host_processes_{how}"),
            &|| Box::pin(a_stop_costs_the_same_with_many_host_processes(cgroup)),
        );
    }
}

/// A fresh directory for one test's files.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lease-exec-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

/// The pid a command wrote to `file`, once it is there.
fn pid_in(file: &Path) -> i32 {
    let start = Instant::now();
    loop {
        if let Some(pid) = std::fs::read_to_string(file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return pid;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no pid in {file:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The variable that marks every process of a test's tree (the command
/// passes its environment on, wherever a descendant moves).
const MARKER: &str = "LEASE_EXEC_TEST_TREE";

/// Every live process (not a zombie) whose environment has `MARKER=marker`,
/// but the watchdog (which has the command's variables too): the command's
/// whole tree.
fn tree(marker: &str) -> Vec<i32> {
    let needle = format!("{MARKER}={marker}");
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let env = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        if !env.split(|&b| b == 0).any(|v| v == needle.as_bytes()) {
            continue;
        }
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next());
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let watchdog = cmdline
            .split(|&b| b == 0)
            .any(|a| a == lease_exec::SUBCOMMAND.as_bytes());
        if !matches!(state, Some("Z" | "X") | None) && !watchdog {
            out.push(pid);
        }
    }
    out
}

/// Waits until nothing of the tree marked `marker` is left; how long that
/// took (`None`: not within 3 s).
async fn tree_gone(marker: &str) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        if tree(marker).is_empty() {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    None
}

/// A shell command, marked with `MARKER=dir's name`, that runs `prelude`,
/// starts an escaper (`setsid`: its own session; SIGTERM ignored) that
/// writes its pid to `dir/escaper`, then runs `body`.
fn with_escaper(dir: &Path, prelude: &str, body: &str) -> Command {
    let mut command = Command::new("sh");
    command
        .args([
            "-c".to_owned(),
            format!(
                "{prelude} setsid sh -c 'trap \"\" TERM; echo $$ > {}/escaper; while :; do sleep 0.05; done' & {body}",
                dir.display()
            ),
        ])
        .env(MARKER, marker(dir));
    command
}

/// The marker of the tree started in `dir`.
fn marker(dir: &Path) -> String {
    dir.file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned()
}

async fn the_exit_status_is_reported() {
    let mut command = Command::new("sh");
    command.args(["-c", "exit \"$CODE\""]).env("CODE", "3");
    let (dog, mut job) = spawned(&command).await;
    let status = job.wait().await.expect("status");
    assert_eq!(status.code(), Some(3));
    assert!(
        !job.stop_leftovers(Duration::ZERO, std::future::pending())
            .await
    );
    assert!(matches!(dog.arm(Instant::now()), Ok(())));
    dog.finish().await;
}

async fn a_missing_program_is_a_spawn_error() {
    let command = Command::new("/nonexistent/program");
    let mut dog = Watchdog::start(&command).await.expect("start");
    assert!(matches!(dog.arm(Instant::now()), Err(Error::Misuse(_))));
    match dog.spawn(Instant::now() + Duration::from_secs(60)).await {
        Err(Error::Spawn(e)) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound),
        other => panic!("expected a spawn error, got {other:?}"),
    }
    dog.finish().await;
}

async fn an_unrenewed_deadline_kills_the_whole_tree() {
    let dir = scratch("deadline");
    let command = with_escaper(&dir, "", "exec sleep 60");
    let mut dog = Watchdog::start(&command).await.expect("start");
    let deadline = Instant::now() + Duration::from_millis(300);
    let mut job = dog.spawn(deadline).await.expect("spawn");
    pid_in(&dir.join("escaper"));
    let status = job.wait().await.expect("status");
    let late = Instant::now().saturating_duration_since(deadline);
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
    let left = tree_gone(&marker(&dir))
        .await
        .expect("the tree survived the deadline");
    println!(
        "FIGURE deadline kill: the command's exit seen {:.2} ms after the deadline, the rest of \
         the tree gone {:.2} ms after that",
        late.as_secs_f64() * 1e3,
        left.as_secs_f64() * 1e3
    );
    dog.finish().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A watchdog of `command` and its job, spawned with a deadline a minute away.
async fn spawned(command: &Command) -> (Watchdog, lease_exec::Job) {
    let mut dog = Watchdog::start(command).await.expect("start");
    let job = dog
        .spawn(Instant::now() + Duration::from_secs(60))
        .await
        .expect("spawn");
    (dog, job)
}

async fn a_dropped_watchdog_kills_the_whole_tree_at_once() {
    let dir = scratch("drop");
    let command = with_escaper(&dir, "", "exec sleep 60");
    let (dog, mut job) = spawned(&command).await;
    pid_in(&dir.join("escaper"));
    let dropped = Instant::now();
    drop(dog);
    let status = job.wait().await.expect("status");
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
    tree_gone(&marker(&dir)).await.expect("the tree survived");
    println!(
        "FIGURE dropped watchdog: the tree gone {:.2} ms after the drop",
        dropped.elapsed().as_secs_f64() * 1e3
    );
    let _ = std::fs::remove_dir_all(&dir);
}

async fn terminate_kills_what_ignores_sigterm_after_the_grace() {
    let dir = scratch("terminate");
    let command = with_escaper(&dir, "trap '' TERM;", "while :; do sleep 0.05; done");
    // The escaper's pid is written after the command's trap.
    let (dog, mut job) = spawned(&command).await;
    pid_in(&dir.join("escaper"));
    dog.disarm().expect("disarm");
    let grace = Duration::from_millis(200);
    let start = Instant::now();
    let status = job.terminate(grace, std::future::pending()).await;
    let took = start.elapsed();
    assert_eq!(status.and_then(|s| s.signal()), Some(libc::SIGKILL));
    let left = tree(&marker(&dir));
    assert!(left.is_empty(), "left after the stop: {left:?}");
    assert!(took >= grace, "killed after {took:?}, before the grace");
    println!(
        "FIGURE terminate: SIGTERM ignored, the tree gone {:.1} ms after it (grace {grace:?})",
        took.as_secs_f64() * 1e3
    );
    dog.finish().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The helper mode of this binary that hops pids: [`hopper`].
const HOPPER: &str = "__hopper";
/// The helper mode of this binary that holds idle processes: [`idle`].
const IDLE: &str = "__idle";
/// The helper mode of this binary that runs
/// [`a_job_stops_a_pid_hopper_whose_watchdog_died`] in a runner that called
/// `become_subreaper` (as `lease run`): [`in_a_subreaper`].
const SUBREAPER_CASE: &str = "__subreaper_case";

/// The pid hopper: every millisecond (`LEASE_EXEC_HOP_US` microseconds if
/// set, for a harder run by hand) it writes its hop count to
/// `dir/count` (20 digits, at offset 0), forks a child that calls
/// `setsid()` and goes on while the parent exits. It ignores SIGTERM. One
/// read of the process table and a kill round slower than a hop would
/// signal only pids that exited already. It stops by itself only once
/// `dir/stop` exists (the test's guard; never the stop under test).
fn hopper(dir: &Path) -> ! {
    use std::os::unix::fs::FileExt;
    // SAFETY: signal with SIG_IGN has no preconditions.
    unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
    let count = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("count"))
        .expect("hopper's count file");
    let stop = dir.join("stop");
    let pause = std::env::var("LEASE_EXEC_HOP_US")
        .ok()
        .and_then(|us| us.parse().ok())
        .map_or(Duration::from_millis(1), Duration::from_micros);
    let mut n = 0u64;
    loop {
        if stop.exists() {
            std::process::exit(0);
        }
        n += 1;
        let _ = count.write_all_at(format!("{n:020}\n").as_bytes(), 0);
        std::thread::sleep(pause);
        // SAFETY: this process has one thread; the child only calls setsid
        // and goes on with this loop; the parent exits at once.
        match unsafe { libc::fork() } {
            0 => unsafe {
                libc::setsid();
            },
            p if p > 0 => unsafe { libc::_exit(0) },
            _ => {}
        }
    }
}

/// Idle host processes: forks `n` children that wait in `pause()` (killed
/// with this process: `PR_SET_PDEATHSIG`), says `ready N` on stdout, and at
/// end of file on stdin kills and reaps them all and exits.
fn idle(n: usize) -> ! {
    use std::io::{Read, Write};
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    let mut kids = Vec::with_capacity(n);
    for _ in 0..n {
        // SAFETY: one thread; the child makes only async-signal-safe calls.
        match unsafe { libc::fork() } {
            0 => unsafe {
                libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                );
                if libc::getppid() != parent {
                    libc::_exit(0);
                }
                loop {
                    libc::pause();
                }
            },
            p if p > 0 => kids.push(p),
            _ => break,
        }
    }
    let mut out = std::io::stdout();
    let _ = writeln!(out, "ready {}", kids.len()).and_then(|()| out.flush());
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    for &k in &kids {
        // SAFETY: kill and waitpid on this process's own children.
        unsafe { libc::kill(k, libc::SIGKILL) };
    }
    for &k in &kids {
        // SAFETY: as above; the status is not needed.
        unsafe { libc::waitpid(k, std::ptr::null_mut(), 0) };
    }
    std::process::exit(0);
}

/// `n` idle processes outside every test's tree, for as long as it lives:
/// dropped (also on a failure), it has them killed and reaped.
struct Load {
    child: std::process::Child,
    count: usize,
}

impl Load {
    fn start(n: usize) -> Load {
        use std::io::BufRead;
        let mut child = std::process::Command::new("/proc/self/exe")
            .args([IDLE, &n.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the idle processes");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("idle's stdout");
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let count = line
            .trim()
            .strip_prefix("ready ")
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        Load { child, count }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// A test's pid hopper: asks it to stop (its `stop` file), then kills
/// whatever process of its tree is left and reaps those that became this
/// process's children. Dropped at the end of the test, also on a failure.
struct HopperGuard {
    dir: PathBuf,
}

impl Drop for HopperGuard {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("stop"), "");
        let marker = marker(&self.dir);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            let left = tree(&marker);
            if left.is_empty() {
                break;
            }
            for pid in left {
                // SAFETY: kill has no memory-safety preconditions; `pid`
                // carries this test's marker.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            reap_orphans();
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(20));
        reap_orphans();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Reaps this process's exited children that are not watchdogs (orphans
/// of a test's tree: this process is their subreaper).
fn reap_orphans() {
    let me = std::process::id() as i32;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let zombie = fields.next() == Some("Z");
        let ppid = fields.next().and_then(|p| p.parse::<i32>().ok());
        let cmd = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let watchdog = cmd
            .split(|&b| b == 0)
            .any(|a| a == lease_exec::SUBCOMMAND.as_bytes());
        if zombie && ppid == Some(me) && !watchdog {
            // SAFETY: waitpid on an exited child of this process.
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
        }
    }
}

/// The hopper's count, as last written.
fn hops(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("count")).unwrap_or_default()
}

/// A command that starts the pid hopper in the background and then sleeps
/// (the command itself dies of SIGTERM), marked with the directory's name;
/// in a cgroup leaf if `cgroup` and one can be made.
fn with_hopper(dir: &Path, cgroup: bool) -> Command {
    let exe = std::fs::read_link("/proc/self/exe").expect("this test's executable");
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg("\"$0\" __hopper \"$1\" & exec sleep 60")
        .arg(exe)
        .arg(dir)
        .env(MARKER, marker(dir))
        .cgroup(cgroup);
    command
}

/// How the command `pid` is contained: "cgroup leaf" if it is in one of
/// the watchdog's leaves, else "tree walk" (asserted when `cgroup` is
/// false).
fn containment(pid: u32, cgroup: bool) -> &'static str {
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let in_leaf = own
        .lines()
        .any(|l| l.starts_with("0::") && l.contains("/lease-exec-"));
    assert!(cgroup || !in_leaf, "in a cgroup leaf: {own}");
    if in_leaf {
        "cgroup leaf"
    } else {
        "tree walk"
    }
}

/// Waits until the hopper has hopped at least 50 times.
async fn hopping(dir: &Path) {
    let start = Instant::now();
    while hops(dir).trim().parse::<u64>().unwrap_or(0) < 50 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the hopper does not hop"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// After a stop returned: the hopper writes nothing more for 300 ms, and
/// nothing of its tree is alive.
async fn hopper_stopped(dir: &Path, what: &str) {
    let at_stop = hops(dir);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let later = hops(dir);
    let left = tree(&marker(dir));
    assert!(
        at_stop == later && left.is_empty(),
        "{what}: the hopper went on: count {} when the stop returned, {} 300 ms later; alive: \
         {left:?}",
        at_stop.trim(),
        later.trim()
    );
}

async fn terminate_stops_a_pid_hopper(cgroup: bool) {
    let dir = scratch("hopper-terminate");
    let _guard = HopperGuard { dir: dir.clone() };
    let (dog, mut job) = spawned(&with_hopper(&dir, cgroup)).await;
    hopping(&dir).await;
    let how = containment(job.pid(), cgroup);
    dog.disarm().expect("disarm");
    let start = Instant::now();
    let stop = job.terminate(Duration::from_millis(100), std::future::pending());
    let status = tokio::time::timeout(Duration::from_secs(5), stop).await;
    let took = start.elapsed();
    assert!(
        status.is_ok(),
        "terminate did not return within 5 s (hops: {})",
        hops(&dir).trim()
    );
    hopper_stopped(&dir, "terminate").await;
    println!(
        "FIGURE pid hopper ({how}): terminate (grace 100 ms, SIGTERM ignored) returned after \
         {:.1} ms",
        took.as_secs_f64() * 1e3
    );
    dog.finish().await;
}

async fn a_dropped_watchdog_stops_a_pid_hopper(cgroup: bool) {
    let dir = scratch("hopper-drop");
    let _guard = HopperGuard { dir: dir.clone() };
    let (dog, mut job) = spawned(&with_hopper(&dir, cgroup)).await;
    hopping(&dir).await;
    let how = containment(job.pid(), cgroup);
    let watchdog = dog.pid();
    let start = Instant::now();
    drop(dog);
    let status = job.wait().await.expect("status");
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
    // The watchdog exits once it has killed the tree.
    let stat = format!("/proc/{watchdog}/stat");
    while std::fs::read_to_string(&stat).is_ok_and(|s| !s.contains(") Z ")) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the watchdog did not exit within 5 s of its runner's drop (hops: {})",
            hops(&dir).trim()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let took = start.elapsed();
    hopper_stopped(&dir, "the watchdog's kill").await;
    println!(
        "FIGURE pid hopper ({how}): the watchdog killed the tree and exited {:.1} ms after its \
         runner's drop",
        took.as_secs_f64() * 1e3
    );
}

/// One graceful stop of a tree that exits at SIGTERM (the command and an
/// escaped `setsid sleep`): how long `terminate` took, and the longest gap
/// meanwhile between two ticks of a 1 ms heartbeat on the runner's thread.
async fn one_stop(name: &str, cgroup: bool) -> (Duration, Duration) {
    let dir = scratch(name);
    let mut command = Command::new("sh");
    command
        .args([
            "-c",
            "setsid sleep 60 & echo $! > \"$0\"/escaper; exec sleep 60",
        ])
        .arg(&dir)
        .env(MARKER, marker(&dir))
        .cgroup(cgroup);
    let (dog, mut job) = spawned(&command).await;
    pid_in(&dir.join("escaper"));
    dog.disarm().expect("disarm");
    let done = std::cell::Cell::new(false);
    let stop = async {
        let start = Instant::now();
        let status = job
            .terminate(Duration::from_secs(5), std::future::pending())
            .await;
        done.set(true);
        (status, start.elapsed())
    };
    let heartbeat = async {
        let mut last = Instant::now();
        let mut gap = Duration::ZERO;
        while !done.get() {
            tokio::time::sleep(Duration::from_millis(1)).await;
            gap = gap.max(last.elapsed());
            last = Instant::now();
        }
        gap
    };
    let ((status, took), gap) = tokio::join!(stop, heartbeat);
    assert_eq!(status.and_then(|s| s.signal()), Some(libc::SIGTERM));
    let left = tree(&marker(&dir));
    assert!(left.is_empty(), "left after the stop: {left:?}");
    dog.finish().await;
    let _ = std::fs::remove_dir_all(&dir);
    (took, gap)
}

/// The median of five stops, and the longest heartbeat gap in them.
async fn median_stop(name: &str, cgroup: bool) -> (Duration, Duration) {
    let mut took = Vec::new();
    let mut gap = Duration::ZERO;
    for _ in 0..5 {
        let (t, g) = one_stop(name, cgroup).await;
        took.push(t);
        gap = gap.max(g);
    }
    took.sort();
    (took[2], gap)
}

/// How many idle processes the host-load test adds (`LEASE_EXEC_LOAD`,
/// default 10,000).
fn load_count() -> usize {
    std::env::var("LEASE_EXEC_LOAD")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000)
}

async fn a_stop_costs_the_same_with_many_host_processes(cgroup: bool) {
    let (quiet, _) = median_stop("quiet", cgroup).await;
    let load = Load::start(load_count());
    assert!(load.count > 0, "no idle process started");
    let (loaded, gap) = median_stop("loaded", cgroup).await;
    let how = if cgroup {
        "cgroup where one can be made"
    } else {
        "tree walk"
    };
    println!(
        "FIGURE stop cost ({how}): terminate of a 2-process tree that exits at SIGTERM, median of \
         5: {:.2} ms quiet, {:.2} ms with {} more processes on the host; a 1 ms heartbeat on the \
         runner's thread during these 5: longest gap {:.2} ms",
        quiet.as_secs_f64() * 1e3,
        loaded.as_secs_f64() * 1e3,
        load.count,
        gap.as_secs_f64() * 1e3
    );
    assert!(
        loaded < quiet * 3 + Duration::from_millis(50),
        "a stop took {loaded:?} with {} more processes on the host, {quiet:?} without",
        load.count
    );
    assert!(
        gap < Duration::from_millis(200),
        "the runner's thread was held up {gap:?} during the stops (a 1 ms heartbeat's longest gap)"
    );
    drop(load);
}

/// Runs [`a_job_stops_a_pid_hopper_whose_watchdog_died`] in a child of this
/// process that calls `become_subreaper` first (every descendant of a
/// subreaper runner but its other watchdogs' subtrees is a job's tree: not
/// for this process, which holds other tests' helpers).
async fn in_a_subreaper(cgroup: bool) {
    let dir = scratch(&format!("hopper-subreaper-{cgroup}"));
    let _guard = HopperGuard { dir: dir.clone() };
    let mut case = std::process::Command::new("/proc/self/exe")
        .arg(SUBREAPER_CASE)
        .arg(if cgroup { "cgroup" } else { "walk" })
        .arg(&dir)
        .spawn()
        .expect("start the case");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = case.try_wait().expect("the case's status") {
            break Some(status);
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = case.kill();
            let _ = case.wait();
            break None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(
        status.is_some_and(|s| s.success()),
        "the case in a subreaper runner failed: {status:?}"
    );
}

/// In a runner that called `become_subreaper`: the hopper's watchdog dies
/// by SIGKILL (its command with it), the hopper becomes this runner's
/// orphan, and the job's own stop (the runner's walk from itself down, and
/// the leaf's `cgroup.kill` if any) must stop it.
async fn a_job_stops_a_pid_hopper_whose_watchdog_died(dir: &Path, cgroup: bool) {
    let mut dog = Watchdog::start(&with_hopper(dir, cgroup))
        .await
        .expect("start");
    let mut job = dog
        .spawn(Instant::now() + Duration::from_secs(60))
        .await
        .expect("spawn");
    hopping(dir).await;
    let how = containment(job.pid(), cgroup);
    // SAFETY: kill has no memory-safety preconditions; the watchdog is this
    // process's child.
    unsafe { libc::kill(dog.pid() as i32, libc::SIGKILL) };
    let start = Instant::now();
    let stop = job.terminate(Duration::from_millis(100), std::future::pending());
    let stopped = tokio::time::timeout(Duration::from_secs(5), stop).await;
    let took = start.elapsed();
    assert!(
        stopped.is_ok(),
        "terminate did not return within 5 s (hops: {})",
        hops(dir).trim()
    );
    hopper_stopped(dir, "a subreaper runner's stop, its watchdog dead").await;
    println!(
        "FIGURE pid hopper ({how}), subreaper runner, watchdog SIGKILLed: terminate (grace \
         100 ms) returned after {:.1} ms",
        took.as_secs_f64() * 1e3
    );
    drop(job);
    drop(dog);
}
