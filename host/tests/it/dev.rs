//! `host dev` as a newcomer runs it: the examples go Ready on a control plane of its own, Ctrl-C
//! tears everything down, and `--keep` leaves the control plane running until its stop command.

use std::io::{BufRead as _, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::support::root;

struct Dev {
    child: Child,
    stdout: mpsc::Receiver<String>,
    stderr: PathBuf,
    _dir: tempfile::TempDir,
}

impl Dev {
    fn start(args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let stderr = dir.path().join("stderr");
        let mut child = Command::new(env!("CARGO_BIN_EXE_host"))
            .arg("dev")
            .args(args)
            .current_dir(root())
            .env(
                "WASM_OPERATOR_CACHE",
                PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("host dev starts");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            stdout: rx,
            stderr,
            _dir: dir,
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Every line printed up to the one saying all resources are Ready.
    fn until_all_ready(&self) -> Vec<String> {
        let mut lines = Vec::new();
        loop {
            match self.stdout.recv_timeout(Duration::from_secs(240)) {
                Ok(line) => {
                    let done = line.starts_with("All ") && line.contains("are Ready");
                    lines.push(line);
                    if done {
                        return lines;
                    }
                }
                Err(e) => panic!(
                    "host dev: not all Ready ({e}); stdout:\n{}\nstderr:\n{}",
                    lines.join("\n"),
                    self.stderr()
                ),
            }
        }
    }

    fn kubeconfig(&self) -> String {
        self.stderr()
            .lines()
            .find_map(|l| l.trim().strip_prefix("export KUBECONFIG="))
            .and_then(|l| l.split_whitespace().next())
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("no KUBECONFIG in:\n{}", self.stderr()))
    }

    /// Ctrl-C, and how it ended.
    fn interrupt(mut self) -> (bool, String) {
        let status = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        for _ in 0..300 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (status.success(), self.stderr());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        panic!(
            "host dev did not stop within 30 s of Ctrl-C:\n{}",
            self.stderr()
        );
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn kubectl(kubeconfig: &str, args: &[&str]) -> (bool, String) {
    let bin = testenv::binaries().unwrap().join("kubectl");
    let out = Command::new(bin)
        .arg(format!("--kubeconfig={kubeconfig}"))
        .args(args)
        .arg("--request-timeout=5s")
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn every_example_goes_ready_and_ctrl_c_tears_it_all_down() {
    let dev = Dev::start(&[]);
    let lines = dev.until_all_ready();
    let stderr = dev.stderr();
    assert!(stderr.contains("kwok simulates"), "{stderr}");
    // The last table, just above the summary: every example, Ready.
    let last_header = lines
        .iter()
        .rposition(|l| l.starts_with("NAMESPACE"))
        .expect("a table");
    let rows: Vec<&String> = lines[last_header + 1..]
        .iter()
        .take_while(|l| !l.is_empty())
        .collect();
    assert!(!rows.is_empty(), "an empty table");
    for (kind, name) in [
        ("Service", "example"),
        ("Service", "api"),
        ("Datastore", "datastore"),
        ("KVCluster", "my-raft-db"),
    ] {
        let row = rows
            .iter()
            .find(|r| {
                let cells: Vec<&str> = r.split_whitespace().collect();
                cells.get(1) == Some(&kind) && cells.get(2) == Some(&name)
            })
            .unwrap_or_else(|| panic!("no {kind} {name} in {rows:?}"));
        assert_eq!(row.split_whitespace().nth(3), Some("True"), "{row}");
    }
    // The printed KUBECONFIG reaches the control plane, where the operator's work is.
    let kubeconfig = dev.kubeconfig();
    let (ok, out) = kubectl(
        &kubeconfig,
        &["get", "statefulset", "-n", "hanzo", "datastore"],
    );
    assert!(ok, "{out}");

    let (ok, stderr) = dev.interrupt();
    assert!(ok, "host dev failed:\n{stderr}");
    assert!(
        !std::path::Path::new(&kubeconfig).exists(),
        "the control plane's files are left behind"
    );
    let (ok, _) = kubectl(&kubeconfig, &["get", "namespaces"]);
    assert!(!ok, "the control plane still answers after Ctrl-C");
}

/// Ctrl-C while the control plane has just come up (the CRDs being installed, the operator not
/// started yet) still stops it and removes its files.
#[test]
fn ctrl_c_during_start_up_tears_down_what_started() {
    let dev = Dev::start(&[]);
    let mut waited = 0;
    while !dev.stderr().contains("export KUBECONFIG=") {
        assert!(
            waited < 1200,
            "the control plane did not come up:\n{}",
            dev.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
        waited += 1;
    }
    let kubeconfig = dev.kubeconfig();
    let (_, stderr) = dev.interrupt();
    assert!(
        stderr.contains("the control plane is stopped and its files removed"),
        "{stderr}"
    );
    assert!(
        !std::path::Path::new(&kubeconfig).exists(),
        "the control plane's files are left behind:\n{stderr}"
    );
    let (ok, _) = kubectl(&kubeconfig, &["get", "namespaces"]);
    assert!(!ok, "the control plane still answers after Ctrl-C");
}

#[test]
fn keep_leaves_the_control_plane_running_until_its_stop_command() {
    let dev = Dev::start(&["--keep", "examples/kvcluster.yaml"]);
    dev.until_all_ready();
    let kubeconfig = dev.kubeconfig();
    let (ok, stderr) = dev.interrupt();
    assert!(ok, "host dev failed:\n{stderr}");
    let (ok, out) = kubectl(&kubeconfig, &["get", "kvclusters", "-A"]);
    assert!(ok && out.contains("my-raft-db"), "{out}");
    let stop = stderr
        .lines()
        .filter_map(|l| {
            l.trim()
                .split_once("    #")
                .map(|(c, _)| c.trim().to_owned())
        })
        .find(|c| c.starts_with("kill "))
        .unwrap_or_else(|| panic!("no stop command in:\n{stderr}"));
    let status = Command::new("bash").args(["-c", &stop]).status().unwrap();
    assert!(status.success(), "{stop}");
    let (ok, _) = kubectl(&kubeconfig, &["get", "namespaces"]);
    assert!(
        !ok,
        "the control plane still answers after its stop command"
    );
}
