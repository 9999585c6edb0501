//! The deploy recipes of `deploy/` (Kubernetes, Docker, systemd) and the monitoring files
//! (Prometheus rules, the Grafana dashboard): each file parses, names only flags `lease run
//! --help` lists and metrics the driver exports, and leaves a stopping leader the time its
//! stop takes at the flags it sets and the defaults it relies on. No database: `cargo test -p
//! lease-cli --test recipes`. `promtool test rules` (CI) runs the rules' own unit tests.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &str) -> String {
    let p = root().join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

// ---------------------------------------------------------------------------------------------
// A YAML subset: block mappings and sequences, plain and quoted scalars, `|` and `|-` literal
// blocks, flow sequences of scalars, comments. Anything else (anchors, aliases, tags, flow
// mappings, tabs, several documents, a repeated key) is an error, so what passes here means the
// same to any YAML parser.

#[derive(Debug, Clone, PartialEq)]
enum Yaml {
    Str(String),
    Seq(Vec<Yaml>),
    Map(Vec<(String, Yaml)>),
}

impl Yaml {
    fn get(&self, key: &str) -> Option<&Yaml> {
        match self {
            Yaml::Map(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The value at a path of keys; panics naming the path when absent.
    fn at(&self, path: &[&str]) -> &Yaml {
        let mut v = self;
        for (i, k) in path.iter().enumerate() {
            v = v
                .get(k)
                .unwrap_or_else(|| panic!("no {} in the document", path[..=i].join(".")));
        }
        v
    }

    fn str(&self) -> &str {
        match self {
            Yaml::Str(s) => s,
            other => panic!("expected a scalar, found {other:?}"),
        }
    }

    fn seq(&self) -> &[Yaml] {
        match self {
            Yaml::Seq(s) => s,
            other => panic!("expected a sequence, found {other:?}"),
        }
    }
}

/// A line of content: its indentation and its text.
#[derive(Debug, Clone)]
struct Line {
    no: usize,
    indent: usize,
    text: String,
}

fn parse_yaml(src: &str) -> Result<Yaml, String> {
    let raw: Vec<&str> = src.lines().collect();
    let mut lines = Vec::new();
    let mut i = 0;
    while i < raw.len() {
        let l = raw[i];
        let no = i + 1;
        i += 1;
        let body = l.trim_start_matches(' ');
        if body.starts_with('\t') {
            return Err(format!("line {no}: a tab in the indentation"));
        }
        let text = strip_comment(body).trim_end().to_owned();
        if text.is_empty() {
            continue;
        }
        if text == "---" && lines.is_empty() {
            continue;
        }
        if text == "---" || text == "..." {
            return Err(format!("line {no}: more than one document"));
        }
        let indent = l.len() - body.len();
        // A literal block: the lines below indented deeper, verbatim.
        if text.ends_with(": |") || text.ends_with(": |-") || text == "- |" || text == "- |-" {
            let keep = !text.ends_with('-');
            let mut block = Vec::new();
            let mut block_indent = None;
            while i < raw.len() {
                let b = raw[i];
                let bi = b.len() - b.trim_start_matches(' ').len();
                if !b.trim().is_empty() && bi <= indent {
                    break;
                }
                if !b.trim().is_empty() {
                    let at = *block_indent.get_or_insert(bi);
                    if bi < at {
                        return Err(format!(
                            "line {}: a literal block's indentation shrinks",
                            i + 1
                        ));
                    }
                    block.push(b[at..].to_owned());
                } else {
                    block.push(String::new());
                }
                i += 1;
            }
            while block.last().is_some_and(String::is_empty) {
                block.pop();
            }
            let mut value = block.join("\n");
            if keep {
                value.push('\n');
            }
            let head = text.trim_end_matches('-').trim_end_matches('|').trim_end();
            lines.push(Line {
                no,
                indent,
                text: format!("{head} \u{0}{value}"),
            });
            continue;
        }
        lines.push(Line { no, indent, text });
    }
    if lines.is_empty() {
        return Err("an empty document".into());
    }
    let mut at = 0;
    let indent = lines[0].indent;
    let v = block(&mut lines, &mut at, indent)?;
    if at < lines.len() {
        return Err(format!("line {}: unexpected indentation", lines[at].no));
    }
    Ok(v)
}

/// `text` less a comment (` #` outside quotes, or `#` first).
fn strip_comment(text: &str) -> &str {
    let (mut single, mut double) = (false, false);
    let mut prev = ' ';
    for (i, c) in text.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single && prev != '\\' => double = !double,
            '#' if !single && !double && prev == ' ' => return &text[..i],
            _ => {}
        }
        prev = c;
    }
    text
}

fn block(lines: &mut [Line], at: &mut usize, indent: usize) -> Result<Yaml, String> {
    let first = &lines[*at];
    if first.text == "-" || first.text.starts_with("- ") {
        let mut items = Vec::new();
        while *at < lines.len() && lines[*at].indent == indent {
            let l = lines[*at].clone();
            if !(l.text == "-" || l.text.starts_with("- ")) {
                // The end of a sequence at its key's indentation; elsewhere the caller's
                // check of what follows refuses it.
                break;
            }
            let rest = l.text[1..].trim_start();
            if rest.is_empty() {
                *at += 1;
                items.push(nested(lines, at, indent, l.no)?);
            } else if key_split(rest).is_some() {
                // `- key: value`: a mapping whose first line is this one.
                let inner = indent + (l.text.len() - rest.len());
                lines[*at] = Line {
                    no: l.no,
                    indent: inner,
                    text: rest.to_owned(),
                };
                items.push(block(lines, at, inner)?);
            } else {
                *at += 1;
                items.push(scalar(rest, l.no)?);
            }
        }
        Ok(Yaml::Seq(items))
    } else {
        let mut map: Vec<(String, Yaml)> = Vec::new();
        while *at < lines.len() && lines[*at].indent == indent {
            let l = lines[*at].clone();
            if l.text.starts_with("- ") {
                return Err(format!("line {}: a sequence item among mapping keys", l.no));
            }
            let (key, rest) = key_split(&l.text)
                .ok_or_else(|| format!("line {}: expected `key: value`", l.no))?;
            let key = match scalar(key, l.no)? {
                Yaml::Str(k) => k,
                _ => return Err(format!("line {}: a key that is no scalar", l.no)),
            };
            if map.iter().any(|(k, _)| *k == key) {
                return Err(format!("line {}: the key {key:?} again", l.no));
            }
            *at += 1;
            let value = if let Some(literal) = rest.strip_prefix('\u{0}') {
                Yaml::Str(literal.to_owned())
            } else if rest.is_empty() {
                // A sequence may sit at its key's indentation.
                if *at < lines.len()
                    && lines[*at].indent == indent
                    && lines[*at].text.starts_with("- ")
                {
                    block(lines, at, indent)?
                } else {
                    nested(lines, at, indent, l.no)?
                }
            } else {
                scalar(rest, l.no)?
            };
            map.push((key, value));
        }
        Ok(Yaml::Map(map))
    }
}

/// The block under line `no` (indented deeper than `indent`), or an empty scalar.
fn nested(lines: &mut [Line], at: &mut usize, indent: usize, no: usize) -> Result<Yaml, String> {
    match lines.get(*at) {
        Some(next) if next.indent > indent => {
            let inner = next.indent;
            block(lines, at, inner)
        }
        _ => Err(format!(
            "line {no}: no value (write \"\" for an empty string)"
        )),
    }
}

/// `key: rest` (rest possibly empty), the colon outside quotes.
fn key_split(text: &str) -> Option<(&str, &str)> {
    let (mut single, mut double) = (false, false);
    let bytes = text.as_bytes();
    for (i, &c) in bytes.iter().enumerate() {
        match c {
            b'\'' if !double => single = !single,
            b'"' if !single => double = !double,
            b':' if !single && !double => {
                if i + 1 == bytes.len() {
                    return Some((&text[..i], ""));
                }
                if bytes[i + 1] == b' ' {
                    return Some((&text[..i], text[i + 1..].trim_start()));
                }
            }
            _ => {}
        }
    }
    None
}

fn scalar(text: &str, no: usize) -> Result<Yaml, String> {
    let t = text.trim();
    if let Some(inner) = t.strip_prefix('"') {
        let inner = inner
            .strip_suffix('"')
            .ok_or_else(|| format!("line {no}: an unterminated string"))?;
        return Ok(Yaml::Str(inner.replace("\\\"", "\"").replace("\\\\", "\\")));
    }
    if let Some(inner) = t.strip_prefix('\'') {
        let inner = inner
            .strip_suffix('\'')
            .ok_or_else(|| format!("line {no}: an unterminated string"))?;
        return Ok(Yaml::Str(inner.replace("''", "'")));
    }
    if let Some(inner) = t.strip_prefix('[') {
        let inner = inner
            .strip_suffix(']')
            .ok_or_else(|| format!("line {no}: an unterminated flow sequence"))?;
        if inner.contains(['[', '{']) {
            return Err(format!("line {no}: a nested flow collection"));
        }
        let items = inner.split(',').map(str::trim).filter(|s| !s.is_empty());
        return items
            .map(|s| scalar(s, no))
            .collect::<Result<_, _>>()
            .map(Yaml::Seq);
    }
    if t.starts_with(['{', '&', '*', '!', '|', '>', '%', '@', '`']) {
        return Err(format!("line {no}: {t:?} is outside the YAML subset"));
    }
    Ok(Yaml::Str(t.to_owned()))
}

#[test]
fn the_yaml_subset_parses_what_it_should_and_refuses_the_rest() {
    let doc = "a: 1 # one\nb:\n  - x\n  - k: v\n    l: \"q # r\"\nc:\n- [p, 'q']\nd: |\n  line 1\n\n  line 2\ne: f\n";
    let v = parse_yaml(doc).unwrap();
    assert_eq!(v.at(&["a"]).str(), "1");
    assert_eq!(v.at(&["b"]).seq()[0].str(), "x");
    assert_eq!(v.at(&["b"]).seq()[1].at(&["l"]).str(), "q # r");
    assert_eq!(v.at(&["c"]).seq()[0].seq()[1].str(), "q");
    assert_eq!(v.at(&["d"]).str(), "line 1\n\nline 2\n");
    assert_eq!(v.at(&["e"]).str(), "f");
    for bad in [
        "a: 1\na: 2\n",
        "a: &x 1\n",
        "a: {b: 1}\n",
        "a:\n\tb: 1\n",
        "a: 1\n---\nb: 2\n",
        "a:\n  b: 1\n c: 2\n",
        "a:\n",
        "- a\nb: 1\n",
    ] {
        assert!(parse_yaml(bad).is_err(), "{bad:?} parsed");
    }
}

// ---------------------------------------------------------------------------------------------
// `lease run`'s flags and defaults, from the binary's own help.

struct RunHelp {
    /// Every long flag of `lease run`.
    flags: BTreeSet<String>,
    text: String,
}

impl RunHelp {
    fn get() -> RunHelp {
        let out = Command::new(env!("CARGO_BIN_EXE_lease"))
            .args(["run", "--help"])
            .output()
            .expect("run lease");
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).expect("utf-8");
        let flags = text
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("--"))
            .filter_map(|l| l.split([' ', ',']).next())
            .filter(|f| !f.is_empty())
            .map(|f| format!("--{f}"))
            .collect();
        RunHelp { flags, text }
    }

    /// The `[default: D]` of flag `--name` (the first in its description).
    fn default(&self, name: &str) -> Duration {
        let head = format!("      {name} <");
        let at = self
            .text
            .find(&head)
            .unwrap_or_else(|| panic!("{name} in lease run --help"));
        let rest = &self.text[at..];
        let d = rest
            .find("[default: ")
            .unwrap_or_else(|| panic!("{name}'s default"));
        let value = rest[d + "[default: ".len()..]
            .split([']', ','])
            .next()
            .unwrap();
        humantime::parse_duration(value)
            .unwrap_or_else(|e| panic!("{name}'s default {value:?}: {e}"))
    }
}

/// What a recipe's `lease run` command line says: its flags (before `--`) and the command.
struct RunLine {
    flags: Vec<(String, Option<String>)>,
    name: String,
    command: Vec<String>,
}

/// The flags of `lease run` that take no value.
const SWITCHES: [&str; 8] = [
    "--quiet",
    "--no-server-guard",
    "--no-notify",
    "--no-wait-on-server",
    "--observer",
    "--try",
    "-q",
    "--help",
];

impl RunLine {
    /// `args` after the program: `run`, options, NAME, `--`, COMMAND.
    fn parse(args: &[String], help: &RunHelp) -> RunLine {
        assert_eq!(args.first().map(String::as_str), Some("run"), "{args:?}");
        let sep = args
            .iter()
            .position(|a| a == "--")
            .expect("a `--` before the command");
        let (mut flags, mut name) = (Vec::new(), None);
        let mut it = args[1..sep].iter();
        while let Some(a) = it.next() {
            if a.starts_with('-') {
                let (flag, value) = match a.split_once('=') {
                    Some((f, v)) => (f.to_owned(), Some(v.to_owned())),
                    None if SWITCHES.contains(&a.as_str()) => (a.clone(), None),
                    None => (a.clone(), it.next().cloned()),
                };
                assert!(
                    help.flags.contains(&flag),
                    "{flag} is no flag of lease run --help"
                );
                flags.push((flag, value));
            } else {
                assert!(
                    name.replace(a.clone()).is_none(),
                    "two lease names in {args:?}"
                );
            }
        }
        let command = args[sep + 1..].to_vec();
        assert!(!command.is_empty(), "no command after `--`");
        RunLine {
            flags,
            name: name.expect("a lease name"),
            command,
        }
    }

    fn value(&self, flag: &str) -> Option<&str> {
        self.flags
            .iter()
            .rev()
            .find(|(f, _)| f == flag)
            .and_then(|(_, v)| v.as_deref())
    }

    fn duration(&self, flag: &str, help: &RunHelp) -> Duration {
        match self.value(flag) {
            Some(v) => humantime::parse_duration(v).unwrap_or_else(|e| panic!("{flag} {v}: {e}")),
            None => help.default(flag),
        }
    }

    /// The longest graceful stop of `lease run` (SIGTERM while leading): the command's tree gets
    /// `--grace` after SIGTERM, the release is one statement (at most `--query-timeout`), and
    /// closing the session at most 1 s (run.rs). A supervisor's stop timeout shorter than this
    /// may SIGKILL a leader that still holds the lease: the standbys then wait for the server
    /// to end the dead session instead of taking over at the release.
    fn stop_time(&self, help: &RunHelp) -> Duration {
        self.duration("--grace", help) + self.duration("--query-timeout", help) + CLOSE
    }

    /// The port of `--metrics-addr`, if set.
    fn metrics_port(&self) -> Option<u16> {
        let addr: std::net::SocketAddr = self.value("--metrics-addr")?.parse().expect("IP:PORT");
        Some(addr.port())
    }
}

/// `lease run`'s bound on closing its session at exit (`contend` in run.rs).
const CLOSE: Duration = Duration::from_secs(1);

fn secs(v: &str, what: &str) -> Duration {
    let t = v.trim();
    let d = match t.parse::<u64>() {
        Ok(n) => Duration::from_secs(n),
        Err(_) => humantime::parse_duration(t).unwrap_or_else(|e| panic!("{what} {t:?}: {e}")),
    };
    assert!(d > Duration::ZERO, "{what} is 0");
    d
}

// ---------------------------------------------------------------------------------------------
// Kubernetes.

/// Checks the Deployment; `Err` says what is wrong with its numbers.
fn check_deployment(doc: &Yaml, help: &RunHelp) -> Result<(), String> {
    assert_eq!(doc.at(&["kind"]).str(), "Deployment");
    let pod = doc.at(&["spec", "template", "spec"]);
    let containers = pod.at(&["containers"]).seq();
    let c = &containers[0];
    let args: Vec<String> = c
        .at(&["args"])
        .seq()
        .iter()
        .map(|a| a.str().to_owned())
        .collect();
    let run = RunLine::parse(&args, help);
    let mut needed = run.stop_time(help);
    // A preStop hook runs before the SIGTERM, within the same period.
    if let Some(hook) = c.get("lifecycle").and_then(|l| l.get("preStop")) {
        let words: Vec<&str> = hook
            .at(&["exec", "command"])
            .seq()
            .iter()
            .map(Yaml::str)
            .collect();
        let sleep = words
            .iter()
            .position(|w| *w == "sleep")
            .ok_or("a preStop hook other than sleep")?;
        needed += secs(words[sleep + 1], "the preStop sleep");
    }
    let period = secs(
        pod.at(&["terminationGracePeriodSeconds"]).str(),
        "terminationGracePeriodSeconds",
    );
    if period < needed {
        return Err(format!(
            "terminationGracePeriodSeconds {period:?} is shorter than a leader's stop: --grace + \
             --query-timeout + {CLOSE:?} (+ preStop) = {needed:?}"
        ));
    }
    // The probes reach `--metrics-addr`'s port, by name or number.
    let port = run
        .metrics_port()
        .ok_or("no --metrics-addr: the probes have nothing to ask")?;
    let named: Vec<(&str, u16)> = c
        .at(&["ports"])
        .seq()
        .iter()
        .map(|p| {
            (
                p.get("name").map_or("", Yaml::str),
                p.at(&["containerPort"]).str().parse().unwrap(),
            )
        })
        .collect();
    for probe in ["readinessProbe", "livenessProbe"] {
        let get = c.at(&[probe, "httpGet"]);
        let p = get.at(&["port"]).str();
        let p = named
            .iter()
            .find(|(n, _)| *n == p)
            .map_or_else(|| p.parse().unwrap(), |(_, n)| *n);
        if p != port {
            return Err(format!(
                "{probe} asks port {p}, --metrics-addr serves {port}"
            ));
        }
        let path = get.at(&["path"]).str();
        match (probe, path) {
            // A standby must be ready (a rollout waits for it) and a database outage must not
            // restart every replica.
            ("readinessProbe", "/healthz") | ("livenessProbe", "/metrics") => {}
            _ => {
                return Err(format!(
                    "{probe} on {path}: not a probe that fits a standby"
                ))
            }
        }
    }
    // The pod name in application_name, from the downward API, defined before its use.
    let env = c.at(&["env"]).seq();
    let names: Vec<&str> = env.iter().map(|e| e.at(&["name"]).str()).collect();
    let pod_name = names
        .iter()
        .position(|n| *n == "POD_NAME")
        .ok_or("no POD_NAME")?;
    assert_eq!(
        env[pod_name]
            .at(&["valueFrom", "fieldRef", "fieldPath"])
            .str(),
        "metadata.name"
    );
    // The identity comes from POD_NAME; an application_name of its own would hide it
    // (and a form other than lease:NAME[@ID] names no lease in `lease status`).
    assert!(
        !names.contains(&"PGAPPNAME"),
        "PGAPPNAME overrides the identity (POD_NAME)"
    );
    assert_eq!(run.name, "nightly-sweeper");
    check_resources(c)?;
    check_security_context(pod, c)
}

/// `lease run`'s own memory (about 13 MiB for a leader: bench/resources.sh) fits in the
/// request, and no CPU limit throttles its heartbeats.
fn check_resources(c: &Yaml) -> Result<(), String> {
    let resources = c.at(&["resources"]);
    if resources.get("limits").and_then(|l| l.get("cpu")).is_some() {
        return Err("a CPU limit: a throttled runner may send its heartbeat late".into());
    }
    let memory = resources.at(&["requests", "memory"]).str();
    let mib: u32 = (memory.strip_suffix("Mi"))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("memory request {memory:?}: expected NMi"))?;
    if mib < 16 {
        return Err(format!(
            "memory request {memory}: below lease run's own 13 MiB"
        ));
    }
    Ok(())
}

/// The pod's and the container's `securityContext`: what the test
/// `lease_run_needs_no_root_no_capability_and_no_writable_root_filesystem` runs `lease run`
/// under (lease-cli's behaviour tests). A read-only root filesystem needs a writable `/tmp`,
/// where `lease valid`'s socket goes (else a warning at every start, and no `lease valid`).
fn check_security_context(pod: &Yaml, c: &Yaml) -> Result<(), String> {
    let pod_ctx = pod.at(&["securityContext"]);
    if pod_ctx.at(&["runAsNonRoot"]).str() != "true" {
        return Err("runAsNonRoot is not true".into());
    }
    let ctx = c.at(&["securityContext"]);
    for (key, want) in [
        ("allowPrivilegeEscalation", "false"),
        ("readOnlyRootFilesystem", "true"),
    ] {
        if ctx.at(&[key]).str() != want {
            return Err(format!("securityContext.{key} is not {want}"));
        }
    }
    let dropped: Vec<&str> = ctx
        .at(&["capabilities", "drop"])
        .seq()
        .iter()
        .map(Yaml::str)
        .collect();
    if dropped != ["ALL"] {
        return Err(format!("capabilities dropped: {dropped:?}, not [ALL]"));
    }
    let tmp = (c.get("volumeMounts").map_or(&[][..], Yaml::seq).iter())
        .find(|m| m.at(&["mountPath"]).str() == "/tmp")
        .ok_or("a read-only root filesystem and no volume on /tmp: `lease valid` has no socket")?;
    let volume = tmp.at(&["name"]).str();
    let empty_dir = (pod.get("volumes").map_or(&[][..], Yaml::seq).iter())
        .find(|v| v.at(&["name"]).str() == volume)
        .and_then(|v| v.get("emptyDir"));
    if empty_dir.is_none() {
        return Err(format!("the volume {volume} on /tmp is not an emptyDir"));
    }
    Ok(())
}

#[test]
fn the_kubernetes_deployment_leaves_a_leader_its_stop_and_probes_fit_a_standby() {
    let help = RunHelp::get();
    let text = read("deploy/kubernetes/deployment.yaml");
    let doc = parse_yaml(&text).unwrap_or_else(|e| panic!("deployment.yaml: {e}"));
    check_deployment(&doc, &help).unwrap();
    // The container's image is the Dockerfile's: its command's program is there.
    let args = doc.at(&["spec", "template", "spec", "containers"]).seq()[0].at(&["args"]);
    let args: Vec<String> = args.seq().iter().map(|a| a.str().to_owned()).collect();
    let run = RunLine::parse(&args, &help);
    assert!(read("deploy/Dockerfile").contains(&format!(" {}\n", run.command[0])));

    // A period one second short of the stop fails the check.
    let needed = run.stop_time(&help).as_secs();
    let short = text.replace(
        "terminationGracePeriodSeconds: 35",
        &format!("terminationGracePeriodSeconds: {}", needed - 1),
    );
    assert_ne!(short, text);
    let err = check_deployment(&parse_yaml(&short).unwrap(), &help).unwrap_err();
    assert!(err.contains("shorter than a leader's stop"), "{err}");
    // So does a longer --grace without a longer period, and a preStop sleep not counted.
    let graceful = text.replace("- 20s\n", "- 30s\n");
    assert_ne!(graceful, text);
    assert!(check_deployment(&parse_yaml(&graceful).unwrap(), &help).is_err());
    let hooked = text.replace(
        "          readinessProbe:",
        "          lifecycle:\n            preStop:\n              exec:\n                command: [sleep, \"5\"]\n          readinessProbe:",
    );
    assert!(check_deployment(&parse_yaml(&hooked).unwrap(), &help).is_err());
    // And /leader as the readiness probe: a standby would never be ready.
    let leader = text.replace("path: /healthz", "path: /leader");
    assert!(check_deployment(&parse_yaml(&leader).unwrap(), &help).is_err());
    // And a CPU limit.
    let throttled = text.replace(
        "            limits:\n",
        "            limits:\n              cpu: 100m\n",
    );
    assert_ne!(throttled, text);
    let err = check_deployment(&parse_yaml(&throttled).unwrap(), &help).unwrap_err();
    assert!(err.contains("CPU limit"), "{err}");
    // And a read-only root filesystem without its /tmp.
    let no_tmp = text.replace("mountPath: /tmp", "mountPath: /scratch");
    assert_ne!(no_tmp, text);
    let err = check_deployment(&parse_yaml(&no_tmp).unwrap(), &help).unwrap_err();
    assert!(err.contains("no volume on /tmp"), "{err}");
    // The user is the image's (the Dockerfile's USER).
    let pod = doc.at(&["spec", "template", "spec", "securityContext"]);
    let user = format!(
        "USER {}:{}\n",
        pod.at(&["runAsUser"]).str(),
        pod.at(&["runAsGroup"]).str()
    );
    assert!(
        read("deploy/Dockerfile").contains(&user),
        "no {user:?} in the Dockerfile"
    );
}

/// The PodDisruptionBudget: a drain evicts one replica at a time, so a standby is up to take
/// the lease over; it selects the Deployment's pods, and the Deployment has a standby to spare.
#[test]
fn the_disruption_budget_keeps_a_standby_through_a_drain() {
    let pdb =
        parse_yaml(&read("deploy/kubernetes/pdb.yaml")).unwrap_or_else(|e| panic!("pdb.yaml: {e}"));
    let deployment = parse_yaml(&read("deploy/kubernetes/deployment.yaml")).unwrap();
    assert_eq!(pdb.at(&["kind"]).str(), "PodDisruptionBudget");
    assert_eq!(pdb.at(&["apiVersion"]).str(), "policy/v1");
    assert_eq!(
        pdb.at(&["spec", "selector", "matchLabels"]),
        deployment.at(&["spec", "selector", "matchLabels"])
    );
    assert_eq!(pdb.at(&["spec", "maxUnavailable"]).str(), "1");
    let replicas: u32 = deployment.at(&["spec", "replicas"]).str().parse().unwrap();
    assert!(
        replicas >= 2,
        "{replicas} replica: a drain leaves no standby"
    );
}

// ---------------------------------------------------------------------------------------------
// Docker.

#[test]
fn the_dockerfile_is_multi_stage_and_its_stop_timeout_covers_a_leaders_stop() {
    let help = RunHelp::get();
    let text = read("deploy/Dockerfile");
    let mut stages = Vec::new();
    let (mut entrypoint, mut cmd) = (None, None);
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (op, rest) = line.split_once(' ').unwrap_or((line, ""));
        match op {
            "FROM" => stages.push(rest.to_owned()),
            "ENTRYPOINT" => entrypoint = Some(rest.to_owned()),
            "CMD" => cmd = Some(rest.to_owned()),
            _ => {}
        }
    }
    assert!(stages.len() >= 2, "not multi-stage: {stages:?}");
    let build = stages[0].rsplit(' ').next().unwrap();
    assert!(
        stages[0].starts_with("rust:") && stages[0].contains(" AS "),
        "{stages:?}"
    );
    assert!(
        text.contains(&format!(
            "COPY --from={build} /usr/local/bin/lease /usr/local/bin/lease"
        )),
        "the final stage copies the binary from {build}"
    );
    assert!(text.contains("cargo build --release --locked -p lease-cli"));
    // The final stage is Debian as the build stage's (the binary links its glibc).
    let (build_os, final_os) = (
        stages[0].split('-').next_back().unwrap(),
        &stages[stages.len() - 1],
    );
    let build_os = build_os.split(' ').next().unwrap();
    assert!(
        final_os.contains(build_os),
        "built on {build_os}, run on {final_os}"
    );
    // Exec form: `lease` is PID 1 and gets the signals (a shell form would put sh first).
    let exec = |s: Option<String>| -> Vec<String> {
        serde_json::from_str(&s.expect("ENTRYPOINT and CMD")).expect("exec form (a JSON array)")
    };
    assert_eq!(exec(entrypoint), ["/usr/local/bin/lease"]);
    let cmd = exec(cmd);
    let run = RunLine::parse(&cmd, &help);
    assert!(text.contains(&format!("COPY deploy/sweep {}", run.command[0])));
    let sweep = root().join("deploy/sweep");
    use std::os::unix::fs::PermissionsExt;
    assert!(std::fs::metadata(&sweep).unwrap().permissions().mode() & 0o111 != 0);
    assert!(text.contains("STOPSIGNAL SIGTERM"));
    // The `docker run` line's stop timeout (Docker's default, 10 s, is shorter than a stop at
    // the default --grace).
    let timeout = text
        .split("--stop-timeout ")
        .nth(1)
        .expect("a --stop-timeout in the comment");
    let timeout = secs(timeout.split(' ').next().unwrap(), "--stop-timeout");
    assert!(
        timeout >= run.stop_time(&help),
        "--stop-timeout {timeout:?} < {:?}",
        run.stop_time(&help)
    );
    // The Kubernetes recipe runs the same command.
    let k8s = parse_yaml(&read("deploy/kubernetes/deployment.yaml")).unwrap();
    let args = k8s.at(&["spec", "template", "spec", "containers"]).seq()[0].at(&["args"]);
    let args: Vec<&str> = args.seq().iter().map(Yaml::str).collect();
    assert_eq!(args, cmd, "the Deployment's args and the Dockerfile's CMD");
}

// ---------------------------------------------------------------------------------------------
// systemd.

/// The `[Service]` settings of a unit (key, value), in order.
fn unit_service(text: &str) -> Vec<(String, String)> {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(s) = line.strip_prefix('[') {
            section = s.strip_suffix(']').expect("a section header").to_owned();
            continue;
        }
        assert!(!line.ends_with('\\'), "continued lines are not read here");
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("not key=value: {line}"));
        assert!(!section.is_empty(), "{line} outside a section");
        if section == "Service" {
            out.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
    out
}

fn check_unit(text: &str, help: &RunHelp) -> Result<(), String> {
    let service = unit_service(text);
    let get = |k: &str| {
        service
            .iter()
            .rev()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    };
    let exec: Vec<String> = get("ExecStart")
        .ok_or("no ExecStart")?
        .split(' ')
        .map(str::to_owned)
        .collect();
    assert!(exec[0].ends_with("/lease"), "{exec:?}");
    let run = RunLine::parse(&exec[1..], help);
    // SIGTERM to `lease run` alone; it stops the tree.
    if get("KillMode") != Some("mixed") {
        return Err(format!(
            "KillMode {:?}: the tree would get SIGTERM behind lease run's back",
            get("KillMode")
        ));
    }
    if get("KillSignal").is_some_and(|s| s != "SIGTERM" && s != "SIGINT") {
        return Err("KillSignal is neither SIGTERM nor SIGINT".into());
    }
    let timeout = secs(
        get("TimeoutStopSec").ok_or("no TimeoutStopSec (default 90s: say it)")?,
        "TimeoutStopSec",
    );
    if timeout < run.stop_time(help) {
        return Err(format!(
            "TimeoutStopSec {timeout:?} is shorter than a leader's stop {:?}",
            run.stop_time(help)
        ));
    }
    match get("Restart") {
        Some("always" | "on-failure") => {}
        other => return Err(format!("Restart={other:?}: a replica would not come back")),
    }
    if get("RestartPreventExitStatus") != Some("2") {
        return Err("exit 2 (bad usage) would be restarted in a loop".into());
    }
    assert!(
        !get("Environment").is_some_and(|e| e.starts_with("PGAPPNAME=")),
        "PGAPPNAME overrides the identity (the host name)"
    );
    Ok(())
}

#[test]
fn the_systemd_unit_signals_lease_run_alone_and_waits_for_a_leaders_stop() {
    let help = RunHelp::get();
    let text = read("deploy/systemd/nightly-sweeper.service");
    check_unit(&text, &help).unwrap();
    let short = text.replace("TimeoutStopSec=30s", "TimeoutStopSec=20s");
    assert_ne!(short, text);
    assert!(check_unit(&short, &help).unwrap_err().contains("shorter"));
    let group = text.replace("KillMode=mixed", "KillMode=control-group");
    assert!(check_unit(&group, &help).is_err());
}

// ---------------------------------------------------------------------------------------------
// Prometheus rules and the Grafana dashboard: every metric they name is one the driver exports.

/// The series names the driver exports (its `describe_*!` calls; a histogram's as `_bucket`,
/// `_sum` and `_count`).
fn exported() -> BTreeSet<String> {
    let src = read("lease-driver/src/metrics.rs");
    let mut out = BTreeSet::new();
    for (kind, suffixes) in [
        ("describe_counter!(", &[""][..]),
        ("describe_gauge!(", &[""][..]),
        ("describe_histogram!(", &["_bucket", "_sum", "_count"][..]),
    ] {
        for part in src.split(kind).skip(1) {
            let name = part.split('"').nth(1).expect("a metric name");
            for s in suffixes {
                out.insert(format!("{name}{s}"));
            }
        }
    }
    assert!(out.contains("lease_leader") && out.len() > 15, "{out:?}");
    out
}

/// The `lease_*` names a PromQL expression uses as metrics (not label names: those are
/// followed by `=`, `!=` or `=~`, or sit in `by (...)`).
fn metrics_in(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("lease_") {
        let before = rest[..i].chars().last();
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$') {
            out.insert(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    out
}

#[test]
fn the_alert_rules_name_only_exported_metrics_and_each_has_a_unit_test() {
    let known = exported();
    let rules = parse_yaml(&read("deploy/prometheus/lease-rules.yaml")).unwrap();
    let mut alerts = BTreeSet::new();
    for group in rules.at(&["groups"]).seq() {
        for rule in group.at(&["rules"]).seq() {
            let expr = rule.at(&["expr"]).str();
            let used = metrics_in(expr);
            assert!(!used.is_empty(), "{expr}");
            for m in &used {
                assert!(
                    known.contains(m),
                    "{m} (in {expr}) is no metric the driver exports"
                );
            }
            let alert = rule.at(&["alert"]).str().to_owned();
            assert!(rule.at(&["annotations", "summary"]).str().len() > 10);
            assert!(["critical", "warning"].contains(&rule.at(&["labels", "severity"]).str()));
            assert!(alerts.insert(alert));
        }
    }
    // `promtool test rules` runs the tests file; here: every alert is tested firing.
    let tests = parse_yaml(&read("deploy/prometheus/lease-rules.test.yaml")).unwrap();
    assert_eq!(tests.at(&["rule_files"]).seq()[0].str(), "lease-rules.yaml");
    let mut fired = BTreeSet::new();
    for t in tests.at(&["tests"]).seq() {
        for s in t.at(&["input_series"]).seq() {
            let series = s.at(&["series"]).str();
            let name = series.split('{').next().unwrap();
            assert!(
                known.contains(name),
                "{name} is no metric the driver exports"
            );
        }
        for a in t.get("alert_rule_test").map_or(&[][..], Yaml::seq) {
            let name = a.at(&["alertname"]).str();
            assert!(alerts.contains(name), "a test of {name}, which is no rule");
            if a.get("exp_alerts").is_some_and(|e| !e.seq().is_empty()) {
                fired.insert(name.to_owned());
            }
        }
    }
    assert_eq!(fired, alerts, "alerts no test sees firing");
}

#[test]
fn the_dashboard_queries_only_exported_metrics() {
    let known = exported();
    let text = read("deploy/grafana/lease-dashboard.json");
    let dash: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert!(
        dash["title"].is_string() && dash["uid"].is_string(),
        "title and uid"
    );
    let panels = dash["panels"].as_array().expect("panels");
    let mut queried = BTreeSet::new();
    let mut ids = BTreeSet::new();
    for p in panels {
        assert!(
            ids.insert(p["id"].as_u64().expect("a panel id")),
            "panel ids are unique"
        );
        for t in p["targets"].as_array().map_or(&[][..], Vec::as_slice) {
            let expr = t["expr"].as_str().expect("a PromQL target");
            let used = metrics_in(expr);
            assert!(!used.is_empty(), "{expr}");
            for m in used {
                assert!(
                    known.contains(&m),
                    "{m} (in {expr}) is no metric the driver exports"
                );
                queried.insert(m);
            }
        }
    }
    // The variables' queries too.
    for v in dash["templating"]["list"].as_array().expect("templating") {
        if let Some(q) = v["definition"].as_str() {
            for m in metrics_in(q) {
                assert!(
                    known.contains(&m),
                    "{m} (variable {}) is no metric the driver exports",
                    v["name"]
                );
            }
        }
    }
    // The rules' metrics are on the dashboard too.
    let rules = parse_yaml(&read("deploy/prometheus/lease-rules.yaml")).unwrap();
    for group in rules.at(&["groups"]).seq() {
        for rule in group.at(&["rules"]).seq() {
            for m in metrics_in(rule.at(&["expr"]).str()) {
                assert!(
                    queried.contains(&m),
                    "{m} is alerted on but not on the dashboard"
                );
            }
        }
    }
}
