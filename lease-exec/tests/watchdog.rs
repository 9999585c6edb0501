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
    let mut dog = Watchdog::start(&command).await.expect("start");
    let mut job = dog
        .spawn(Instant::now() + Duration::from_secs(60))
        .await
        .expect("spawn");
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

async fn a_dropped_watchdog_kills_the_whole_tree_at_once() {
    let dir = scratch("drop");
    let command = with_escaper(&dir, "", "exec sleep 60");
    let mut dog = Watchdog::start(&command).await.expect("start");
    let mut job = dog
        .spawn(Instant::now() + Duration::from_secs(60))
        .await
        .expect("spawn");
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
    let mut dog = Watchdog::start(&command).await.expect("start");
    let mut job = dog
        .spawn(Instant::now() + Duration::from_secs(60))
        .await
        .expect("spawn");
    // Written after the command's trap.
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
