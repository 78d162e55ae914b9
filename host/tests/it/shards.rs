//! Shards (`host run --shards K`): replicas that share the resources, each shard on its own
//! Lease. The replicas run as processes of the `host` binary, on the RBAC `host rbac --shards`
//! prints, so that one can be killed as a node's failure would; the API server's audit log says
//! who wrote what, and when.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use host::operator::shard::{SHARD_LABEL, ShardBy, Sharding};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;
use testenv::ControlPlane;

use crate::support::cluster::*;

/// The namespace of the replicas' ServiceAccount and Leases.
const SYSTEM: &str = "wasm-operator";
/// Their ServiceAccount (and roles).
const ACCOUNT: &str = "sharded";

/// A replica: `host run --shards K`, a process of its own.
struct Replica {
    identity: String,
    child: Child,
    metrics: SocketAddr,
    log: PathBuf,
}

impl Replica {
    fn start(cluster: &Sharded, identity: &str, shards: u32) -> Self {
        let metrics = free_addr();
        let log = cluster.dir.path().join(format!("{identity}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_host"))
            .args([
                "run",
                "--kubeconfig",
                &cluster.kubeconfig.display().to_string(),
                "--shards",
                &shards.to_string(),
                "--identity",
                identity,
                "--lease-namespace",
                SYSTEM,
                "--watch-namespace",
                &cluster.ns,
                "--metrics-addr",
                &metrics.to_string(),
                "--metrics-secure=false",
            ])
            .env(
                "WASM_OPERATOR_CACHE",
                Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
            )
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("host run starts");
        Self {
            identity: identity.to_owned(),
            child,
            metrics,
            log,
        }
    }

    /// The shards this replica says it holds (`wasm_operator_shards_held`).
    fn held(&self) -> BTreeSet<u32> {
        testenv::shards_held(&http_get(self.metrics, "/metrics"))
            .into_iter()
            .collect()
    }

    /// SIGKILL: no shutdown, no Lease released, as when its node dies.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, and the process's end: it finishes its reconciliations and releases its Leases.
    fn stop(&mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                assert!(
                    status.success(),
                    "{} exited with {status}:\n{}",
                    self.identity,
                    self.logs()
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "{} did not stop within 60 s:\n{}",
            self.identity,
            self.logs()
        );
    }

    /// The TCP connections this replica holds open to the API server: its sockets (by inode,
    /// from its file descriptors) that `/proc/net/tcp` and `tcp6` list as established to `port`.
    fn connections_to(&self, port: u16) -> usize {
        let pid = self.child.id();
        let sockets: BTreeSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
            .filter_map(|target| {
                let target = target.to_str()?;
                Some(
                    target
                        .strip_prefix("socket:[")?
                        .strip_suffix(']')?
                        .to_owned(),
                )
            })
            .collect();
        ["tcp", "tcp6"]
            .iter()
            .flat_map(|table| {
                std::fs::read_to_string(format!("/proc/{pid}/net/{table}"))
                    .unwrap_or_default()
                    .lines()
                    .skip(1)
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .filter(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let remote_port = fields
                    .get(2)
                    .and_then(|a| a.rsplit(':').next())
                    .and_then(|p| u16::from_str_radix(p, 16).ok());
                // State 01 is ESTABLISHED; field 9 the socket's inode.
                remote_port == Some(port)
                    && fields.get(3) == Some(&"01")
                    && fields.get(9).is_some_and(|inode| sockets.contains(*inode))
            })
            .count()
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- {} ---\n{}", self.identity, self.logs());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A control plane of its own (its audit log holds this test's writes alone), the CRDs, a
/// namespace of resources, and a kubeconfig of the replicas' ServiceAccount bound to what
/// `host rbac --shards` grants.
struct Sharded {
    cp: ControlPlane,
    ns: String,
    kubeconfig: PathBuf,
    dir: tempfile::TempDir,
}

async fn sharded(prefix: &str) -> Sharded {
    let cp = ControlPlane::start().unwrap();
    let root = crate::support::root();
    kubectl_ok(
        &cp,
        &[
            "apply",
            "--server-side",
            "-f",
            &root.join("crds").display().to_string(),
        ],
    );
    kubectl_ok(
        &cp,
        &[
            "wait",
            "--for=condition=Established",
            "crd",
            "--all",
            "--timeout=60s",
        ],
    );
    let admin = cp.client().await.unwrap();
    let ns = cp.namespace(&admin, prefix).await.unwrap();
    kubectl_ok(&cp, &["create", "namespace", SYSTEM]);
    let rbac = crate::support::host_ok(&[
        "rbac",
        "--shards",
        "2",
        "-n",
        SYSTEM,
        "--name",
        ACCOUNT,
        "--watch-namespace",
        &ns,
        "--metrics-secure=false",
    ]);
    apply_cluster(&cp, &rbac);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    cp.write_service_account_kubeconfig(&admin, SYSTEM, ACCOUNT, &kubeconfig)
        .await
        .unwrap();
    Sharded {
        cp,
        ns,
        kubeconfig,
        dir,
    }
}

/// A ValidatingAdmissionPolicy (and its binding) that refuses the shard label on the Service
/// named `refused`.
const REFUSE_LABEL: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: refuse-shard-label
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: ["hanzo.ai"]
      apiVersions: ["*"]
      operations: ["CREATE", "UPDATE"]
      resources: ["services"]
  validations:
  - expression: >-
      object.metadata.name != 'refused' || !has(object.metadata.labels) ||
      !('SHARD_LABEL' in object.metadata.labels)
    message: this Service takes no shard label
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: refuse-shard-label
spec:
  policyName: refuse-shard-label
  validationActions: [Deny]
"#;

/// The events.k8s.io events with the reason `ShardLabelRefused` regarding the Service `name`:
/// each one's replica (reportingInstance), and whether it happened more than once (a series).
fn label_refused_events(cp: &ControlPlane, ns: &str, name: &str) -> Vec<(String, bool)> {
    let out = cp.kubectl(&["get", "events.events.k8s.io", "-n", ns, "-o", "json"]);
    let list: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| {
            e["reason"] == "ShardLabelRefused"
                && e["type"] == "Warning"
                && e["regarding"]["kind"] == "Service"
                && e["regarding"]["name"] == name
        })
        .map(|e| {
            (
                e["reportingInstance"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                !e["series"].is_null(),
            )
        })
        .collect()
}

/// The resources' names: fixed width, so that no name is the start of another's child's.
fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("s-{i:02}")).collect()
}

fn service(name: &str, replicas: u32) -> String {
    WEB.replace("name: web", &format!("name: {name}"))
        .replace("web.example.com", &format!("{name}.example.com"))
        .replace("replicas: 2", &format!("replicas: {replicas}"))
}

fn shard_label(obj: &Value) -> Option<String> {
    obj["metadata"]["labels"][SHARD_LABEL]
        .as_str()
        .map(str::to_owned)
}

/// A write the API server accepted from one of the replicas.
#[derive(Debug)]
struct Write {
    /// The replica's identity (its user agent says it).
    by: String,
    at: Timestamp,
    /// `resource.group` (`services.hanzo.ai`, `deployments.apps`, `services`).
    resource: String,
    subresource: String,
    name: String,
    verb: String,
}

/// Every write to `ns` that the replicas made and the API server accepted, events aside.
fn writes(cp: &ControlPlane, ns: &str) -> Vec<Write> {
    cp.audit_log()
        .iter()
        .filter(|e| e["objectRef"]["namespace"] == ns)
        .filter(|e| {
            e["responseStatus"]["code"]
                .as_i64()
                .is_some_and(|c| c < 300)
        })
        .filter(|e| e["objectRef"]["resource"] != "events")
        .filter_map(|e| {
            let agent = e["userAgent"].as_str()?;
            let by = agent
                .strip_prefix("wasm-operator/")?
                .split_once(" (")?
                .1
                .strip_suffix(')')?
                .to_owned();
            let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            let group = text(&e["objectRef"]["apiGroup"]);
            let resource = text(&e["objectRef"]["resource"]);
            Some(Write {
                by,
                at: e["requestReceivedTimestamp"].as_str()?.parse().ok()?,
                resource: if group.is_empty() {
                    resource
                } else {
                    format!("{resource}.{group}")
                },
                subresource: text(&e["objectRef"]["subresource"]),
                name: text(&e["objectRef"]["name"]),
                verb: text(&e["verb"]),
            })
        })
        .collect()
}

/// The resource among `names` an object named `object` belongs to: itself, or the one whose
/// name starts it (its children's names do).
fn owner_of<'a>(names: &'a [String], object: &str) -> Option<&'a String> {
    names
        .iter()
        .find(|n| object == n.as_str() || object.starts_with(&format!("{n}-")))
}

/// Who wrote each object (`resource`, `name`), in turns: the replicas in the order they wrote
/// it, each once for as long as it kept writing it. Two replicas writing one object at once
/// would make more turns than the handoffs a test expects.
fn turns(writes: &[Write]) -> BTreeMap<(String, String), Vec<String>> {
    let mut sorted: Vec<&Write> = writes.iter().collect();
    sorted.sort_by_key(|w| w.at);
    let mut turns: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for w in sorted {
        let t = turns
            .entry((w.resource.clone(), w.name.clone()))
            .or_default();
        if t.last() != Some(&w.by) {
            t.push(w.by.clone());
        }
    }
    turns
}

/// Whether `turns` are some turns of `expected`, in order and with none between: an object
/// already labelled right, or with nothing to write after a handoff, has fewer.
fn part_of(expected: &[String], turns: &[String]) -> bool {
    !turns.is_empty() && expected.windows(turns.len()).any(|w| w == turns)
}

/// `writers` without a writer repeated right after itself.
fn in_turn(writers: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for w in writers {
        if out.last().map(String::as_str) != Some(*w) {
            out.push((*w).to_owned());
        }
    }
    out
}

/// A replica whose member Lease was renewed after its shard's last renewal (by anyone: before
/// the rounds renewed the member Lease last, a replica killed between the two writes of a
/// round) has its shard taken when the shard's Lease expires, not when its member Lease does;
/// and the replica that took it keeps it meanwhile (it gave it back at once when the member
/// Lease still counted). The ghost is stopped (SIGSTOP), and the test renews its member Lease
/// once, 5 s later: the member's expiry comes 20 s after the stop, the shard's within 15 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_replicas_shard_is_taken_when_its_lease_expires_not_its_member_lease() {
    let cluster = sharded("silent").await;
    let cp = &cluster.cp;
    let _logs = cp.logs_on_failure();
    let a = Replica::start(&cluster, "replica-a", 2);
    let mut ghost = Replica::start(&cluster, "replica-ghost", 2);
    eventually_or(
        "each replica to hold one shard",
        Duration::from_secs(60),
        || a.held().len() == 1 && ghost.held().len() == 1,
        || format!("a holds {:?}, the ghost {:?}", a.held(), ghost.held()),
    )
    .await;
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(cp.client().await.unwrap(), SYSTEM);
    let members = leases
        .list(&kube::api::ListParams::default().labels("wasm-operator.dev/lease-role=member"))
        .await
        .unwrap();
    let member = members
        .items
        .iter()
        .find(|l| {
            l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some("replica-ghost")
        })
        .and_then(|l| l.metadata.name.clone())
        .expect("the ghost's member Lease");
    let status = Command::new("kill")
        .args(["-STOP", &ghost.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let stopped = Instant::now();
    // What replica-a logs from here on (at its start it may take both shards and give one back,
    // should it not yet see the ghost's member Lease).
    let logged = a.logs().len();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(Timestamp::now());
    leases
        .patch(
            &member,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&serde_json::json!({ "spec": { "renewTime": now } })),
        )
        .await
        .unwrap();
    eventually_or(
        "replica-a to take the stopped replica's shard",
        Duration::from_secs(40),
        || a.held().len() == 2,
        || format!("a holds {:?}:\n{}", a.held(), a.logs()),
    )
    .await;
    let took = stopped.elapsed();
    eprintln!("the stopped replica's shard taken {took:?} after the stop");
    assert!(
        took < Duration::from_secs(18),
        "taken {took:?} after the stop: after the member Lease's expiry (20 s), not the shard's (within 15 s):\n{}",
        a.logs()
    );
    // Held on through the member Lease's expiry: nothing given back.
    tokio::time::sleep(Duration::from_secs(20).saturating_sub(took) + Duration::from_secs(3)).await;
    assert_eq!(a.held().len(), 2, "{}", a.logs());
    let since = a.logs().get(logged..).unwrap_or_default().to_owned();
    assert!(
        !since.contains("giving shard"),
        "a shard given back:\n{since}"
    );
    ghost.kill();
}

/// Two replicas, two shards: each holds one, every resource and child is labelled with the
/// shard its hash names and written by its holder alone. One replica is killed: the other takes
/// its shard within the Lease's duration and serves its resources, while those of its own shard
/// see no write and no pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replicas_shard_is_taken_over_and_the_other_shard_never_notices() {
    let cluster = sharded("shards").await;
    let (cp, ns) = (&cluster.cp, cluster.ns.as_str());
    let _logs = cp.logs_on_failure();
    // An admission policy that refuses the shard label on one resource, `refused`: its author is
    // told so on the resource.
    apply_cluster(cp, &REFUSE_LABEL.replace("SHARD_LABEL", SHARD_LABEL));
    let mut a = Replica::start(&cluster, "replica-a", 2);
    let mut b = Replica::start(&cluster, "replica-b", 2);
    // Neither takes a shard in its first round, so each sees the other and takes its share.
    eventually_or(
        "each replica to hold one shard",
        Duration::from_secs(60),
        || a.held().len() == 1 && b.held().len() == 1,
        || format!("a holds {:?}, b {:?}", a.held(), b.held()),
    )
    .await;
    let names = names(16);
    for n in &names {
        apply(cp, ns, &service(n, 2));
    }
    for n in &names {
        wait_ready(cp, ns, &format!("services.hanzo.ai/{n}"));
    }
    let sharding = Sharding {
        count: 2,
        by: ShardBy::Name,
    };
    for n in &names {
        let want = sharding.of(ns, n).to_string();
        let svc = get(cp, ns, &format!("services.hanzo.ai/{n}")).unwrap();
        // Each labelled with its shard, 0 included, by shard 0's holder.
        assert_eq!(shard_label(&svc).as_deref(), Some(want.as_str()), "{n}");
        let deployment = get(cp, ns, &format!("deployment/{n}")).unwrap();
        assert_eq!(
            shard_label(&deployment).as_deref(),
            Some(want.as_str()),
            "{n}'s Deployment"
        );
    }
    let a_shard = *a.held().iter().next().unwrap();
    let (a_names, b_names): (Vec<&String>, Vec<&String>) =
        names.iter().partition(|n| sharding.of(ns, n) == a_shard);
    assert!(
        !a_names.is_empty() && !b_names.is_empty(),
        "both shards have resources: {a_names:?} {b_names:?}"
    );
    // New resources are shard 0's until labelled: its holder labels each (one write, whatever
    // its shard), and everything else of a resource is written by its own shard's holder alone.
    let holder = |shard: u32| {
        if shard == a_shard {
            "replica-a"
        } else {
            "replica-b"
        }
    };
    let before = writes(cp, ns);
    for replica in ["replica-a", "replica-b"] {
        assert!(
            before.iter().any(|w| w.by == replica),
            "{replica} wrote nothing (or its writes were not recognized)"
        );
    }
    for n in &names {
        let labels = before
            .iter()
            .filter(|w| {
                w.resource == "services.hanzo.ai"
                    && w.subresource.is_empty()
                    && w.verb == "patch"
                    && w.name == *n
            })
            .count();
        assert_eq!(labels, 1, "{n}'s label written {labels} times");
    }
    for w in before {
        let Some(owner) = owner_of(&names, &w.name) else {
            continue;
        };
        let label =
            w.resource == "services.hanzo.ai" && w.subresource.is_empty() && w.verb == "patch";
        let shard = if label { 0 } else { sharding.of(ns, owner) };
        assert_eq!(w.by, holder(shard), "{w:?}");
    }

    // Each replica reaches the API server over three connections (`host::connection`): HTTP/2
    // for its requests, HTTP/2 for its watches (its shard's served and child Kinds, the Leases,
    // and for shard 0's holder each served Kind's labelling: fewer than 50), and HTTP/1.1 for
    // its Leases' reads and writes. Over HTTP/1.1 alone each watch and each concurrent request
    // held one of its own (31 and 32 here).
    let port = cp
        .server()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse::<u16>().ok())
        .unwrap();
    // (A connection opened at the start, in a race to be the HTTP/2 one, closes once lost.)
    eventually_or(
        "each replica to hold three connections to the API server",
        Duration::from_secs(10),
        || a.connections_to(port) == 3 && b.connections_to(port) == 3,
        || {
            format!(
                "replica-a holds {}, replica-b {}",
                a.connections_to(port),
                b.connections_to(port)
            )
        },
    )
    .await;

    // A resource whose label the API server refuses is served by no replica, and says why.
    apply(cp, ns, &service("refused", 2));
    eventually_or(
        "a ShardLabelRefused event on services.hanzo.ai/refused",
        Duration::from_secs(60),
        || !label_refused_events(cp, ns, "refused").is_empty(),
        || kubectl(cp, &["get", "events", "-n", ns]).1,
    )
    .await;
    let refused = get(cp, ns, "services.hanzo.ai/refused").unwrap();
    assert_eq!(shard_label(&refused), None, "{refused}");
    assert!(refused["status"].is_null(), "served unlabelled: {refused}");

    a.kill();
    let killed = Timestamp::now();
    let cut = Instant::now();
    // B's shard goes on at once: not held up for the Lease's 15 s.
    let (b_changed, a_changed) = (b_names[0], a_names[0]);
    apply(cp, ns, &service(b_changed, 3));
    eventually(
        "replica-b to apply a change in its own shard at once",
        Duration::from_secs(10),
        || {
            get(cp, ns, &format!("deployment/{b_changed}"))
                .is_some_and(|d| d["spec"]["replicas"] == 3)
        },
    )
    .await;
    println!(
        "replica-b applied a change in its shard {:?} after the kill",
        cut.elapsed()
    );
    // A's shard is taken over within the Lease's duration and one reconciliation.
    apply(cp, ns, &service(a_changed, 3));
    eventually(
        "replica-b to take replica-a's shard and apply its change",
        Duration::from_secs(30),
        || {
            get(cp, ns, &format!("deployment/{a_changed}"))
                .is_some_and(|d| d["spec"]["replicas"] == 3)
        },
    )
    .await;
    let took = cut.elapsed();
    println!("replica-b applied a change in replica-a's shard {took:?} after the kill");
    assert_eq!(
        b.held(),
        BTreeSet::from([0, 1]),
        "replica-b holds both shards"
    );
    // Its watches of A's shard started once A's Lease had gone unrenewed a while, before the
    // Lease expired: the take found them listed.
    let logs = b.logs();
    let (warm, took) = (
        logs.find("has not been renewed for"),
        logs.find("took the shard's Lease, its watches started already"),
    );
    assert!(
        warm.is_some() && took.is_some() && warm < took,
        "replica-b did not start A's shard's watches before taking it:\n{logs}"
    );
    // It saw A's renewals as they were made (the RBAC grants the watch on the Leases), so
    // A's Lease expired 15 s after A's last renewal, not after the first list to show it.
    assert!(
        !logs.contains("the watch of the shards' Leases failed"),
        "replica-b could not watch the Leases:\n{logs}"
    );

    let writes = writes(cp, ns);
    // Each object in turn: the resource labelled by shard 0's holder, then served by its own
    // shard's; replica-a's taken over by replica-b once, after the kill.
    for ((resource, object), writers) in turns(&writes) {
        let Some(owner) = owner_of(&names, &object) else {
            continue;
        };
        let shard = sharding.of(ns, owner);
        let mut expected = Vec::new();
        if resource == "services.hanzo.ai" {
            expected.push(holder(0));
        }
        expected.push(holder(shard));
        if shard == a_shard {
            expected.push("replica-b");
        }
        let expected = in_turn(&expected);
        assert!(
            part_of(&expected, &writers),
            "{resource} {object} written by {writers:?} in turn; expected {expected:?}"
        );
    }
    // The failover wrote nothing of B's shard but the change asked for.
    for w in &writes {
        let Some(owner) = owner_of(&names, &w.name) else {
            continue;
        };
        if b_names.contains(&owner) && owner != b_changed {
            assert!(
                w.at < killed,
                "the failover wrote {w:?} of replica-b's shard"
            );
        }
    }
    let ok = |n: &String| wait_ready(cp, ns, &format!("services.hanzo.ai/{n}"));
    names.iter().for_each(ok);
    // A child deleted by hand wakes its owner in the pipeline of the owner's shard (each
    // pipeline wakes only its own shard's resources), and is made again at once: the periodic
    // look at every resource is minutes away.
    for gone in [a_names.last(), b_names.last()].into_iter().flatten() {
        let uid = |d: &Value| d["metadata"]["uid"].as_str().map(str::to_owned);
        let before = get(cp, ns, &format!("deployment/{gone}")).and_then(|d| uid(&d));
        kubectl_ok(
            cp,
            &[
                "-n",
                ns,
                "delete",
                "deployment",
                gone.as_str(),
                "--wait=false",
            ],
        );
        eventually(
            &format!("{gone}'s Deployment, deleted by hand, to be made again"),
            Duration::from_secs(15),
            || {
                get(cp, ns, &format!("deployment/{gone}"))
                    .is_some_and(|d| uid(&d).is_some() && uid(&d) != before)
            },
        )
        .await;
    }
    // More new resources in one namespace than the labeller keeps waiting (256), there before
    // a replica starts: it keeps 256, lists the rest again once those are labelled, and every
    // one is labelled.
    b.stop();
    let bulk: Vec<String> = (0..300).map(|i| format!("bulk-{i:03}")).collect();
    let yaml: Vec<String> = bulk.iter().map(|n| service(n, 1)).collect();
    apply(cp, ns, &yaml.join("---\n"));
    let c = Replica::start(&cluster, "replica-c", 2);
    let unlabelled = || {
        let out = cp.kubectl(&[
            "get",
            "services.hanzo.ai",
            "-n",
            ns,
            "-l",
            &format!("!{SHARD_LABEL}"),
            "-o",
            "name",
        ]);
        let out = String::from_utf8_lossy(&out.stdout).into_owned();
        out.lines()
            .filter(|l| l.contains("/bulk-"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    eventually_or(
        "each of 300 new Services to be labelled with its shard",
        Duration::from_secs(120),
        || unlabelled().is_empty(),
        || format!("still unlabelled: {:?}", unlabelled()),
    )
    .await;
    let logs = c.logs();
    assert!(
        logs.contains("resources of the namespace wait for their shard label")
            && logs.contains("listed the namespace's resources with no shard label again"),
        "the labeller kept every one of the 300 (nothing was listed again):\n{logs}"
    );
    // Each labelled once: a list that ran while labels were written queued none again.
    let audit = self::writes(cp, ns);
    for n in &bulk {
        let labels = audit
            .iter()
            .filter(|w| w.resource == "services.hanzo.ai" && w.subresource.is_empty())
            .filter(|w| w.verb == "patch" && w.name == *n)
            .count();
        assert_eq!(labels, 1, "{n}'s label written {labels} times");
    }
    // The resource whose label is refused: still served by none, told once.
    let refused = get(cp, ns, "services.hanzo.ai/refused").unwrap();
    assert!(refused["status"].is_null(), "served unlabelled: {refused}");
    // Once by each replica that labelled (each holder of shard 0 in turn), never repeated.
    let told = label_refused_events(cp, ns, "refused");
    let by: BTreeSet<&str> = told.iter().map(|(by, _)| by.as_str()).collect();
    assert!(
        !told.is_empty() && by.len() == told.len() && told.iter().all(|(_, again)| !again),
        "ShardLabelRefused events: {told:?}"
    );
    for n in &bulk {
        let svc = get(cp, ns, &format!("services.hanzo.ai/{n}")).unwrap();
        let want = sharding.of(ns, n).to_string();
        assert_eq!(shard_label(&svc).as_deref(), Some(want.as_str()), "{n}");
    }
    drop(c);
}

/// A reshard: two replicas with two shards, then a third with three starts while they run. It
/// takes nothing while a Lease of two shards is held; once the two stop, it takes all three and
/// moves each resource whose shard changed, with one write of its label, and none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reshard_moves_each_resource_once_and_never_two_shard_counts_at_once() {
    let cluster = sharded("reshard").await;
    let (cp, ns) = (&cluster.cp, cluster.ns.as_str());
    let _logs = cp.logs_on_failure();
    let mut a = Replica::start(&cluster, "replica-a", 2);
    let mut b = Replica::start(&cluster, "replica-b", 2);
    eventually(
        "each replica to hold one shard",
        Duration::from_secs(60),
        || a.held().len() == 1 && b.held().len() == 1,
    )
    .await;
    let names = names(12);
    for n in &names {
        apply(cp, ns, &service(n, 2));
    }
    for n in &names {
        wait_ready(cp, ns, &format!("services.hanzo.ai/{n}"));
    }
    let (two, three) = (
        Sharding {
            count: 2,
            by: ShardBy::Name,
        },
        Sharding {
            count: 3,
            by: ShardBy::Name,
        },
    );
    let a_shard = *a.held().iter().next().unwrap();
    let c = Replica::start(&cluster, "replica-c", 3);
    // Several rounds of its campaign: it stands by.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(
        c.held().is_empty(),
        "replica-c took {:?} while replicas of two shards ran",
        c.held()
    );
    assert!(
        c.logs().contains("taking no shard"),
        "replica-c does not say why it waits:\n{}",
        c.logs()
    );
    a.stop();
    b.stop();
    let stopped = Timestamp::now();
    eventually_or(
        "replica-c to take all three shards",
        Duration::from_secs(30),
        || c.held().len() == 3,
        || format!("replica-c holds {:?}", c.held()),
    )
    .await;
    for n in &names {
        let want = three.of(ns, n).to_string();
        eventually(
            &format!("{n} to be labelled with its shard of three"),
            Duration::from_secs(30),
            || {
                get(cp, ns, &format!("deployment/{n}"))
                    .is_some_and(|d| shard_label(&d).as_deref() == Some(want.as_str()))
            },
        )
        .await;
        wait_ready(cp, ns, &format!("services.hanzo.ai/{n}"));
    }
    let writes = writes(cp, ns);
    // Each object in turn: the resource labelled by shard 0's holder of two, served by its
    // shard's, then replica-c's alone.
    let holder = |shard: u32| {
        if a_shard == shard {
            "replica-a"
        } else {
            "replica-b"
        }
    };
    for ((resource, object), writers) in turns(&writes) {
        let Some(owner) = owner_of(&names, &object) else {
            continue;
        };
        let mut expected = Vec::new();
        if resource == "services.hanzo.ai" {
            expected.push(holder(0));
        }
        expected.push(holder(two.of(ns, owner)));
        expected.push("replica-c");
        let expected = in_turn(&expected);
        assert!(
            part_of(&expected, &writers),
            "{resource} {object} written by {writers:?} in turn; expected {expected:?}"
        );
    }
    // Never two shard counts at once: replica-c writes nothing before the replicas of two have
    // written their last (they release their Leases a write timeout after it, and may still be
    // exiting when replica-c starts, so their exit is no bound).
    let last_of_two = writes
        .iter()
        .filter(|w| w.by != "replica-c")
        .map(|w| w.at)
        .max()
        .expect("writes by the replicas of two");
    assert!(last_of_two < stopped);
    for w in &writes {
        if w.by == "replica-c" {
            assert!(
                w.at > last_of_two,
                "replica-c wrote before the replicas of two wrote their last ({last_of_two}): {w:?}"
            );
        }
    }
    // Each resource's label written once by replica-c where its shard changed, else never.
    let mut moved = 0;
    for n in &names {
        let labelled = writes
            .iter()
            .filter(|w| {
                w.by == "replica-c"
                    && w.resource == "services.hanzo.ai"
                    && w.subresource.is_empty()
                    && w.verb == "patch"
                    && w.name == *n
            })
            .count();
        let changed = two.of(ns, n) != three.of(ns, n);
        assert_eq!(
            labelled,
            usize::from(changed),
            "{n}: moved {labelled} times"
        );
        moved += labelled;
    }
    assert!(moved > 0, "no resource changed shard");
    println!("{moved} of {} resources moved", names.len());

    // And back to one leader: it waits while a shard's Lease is held, then serves everything,
    // its children no longer labelled.
    let mut c = c;
    let d = Replica::start(&cluster, "replica-d", 1);
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(
        d.logs()
            .contains("not taking the Lease: replica-c holds the shard's Lease"),
        "replica-d does not wait for the shards:\n{}",
        d.logs()
    );
    let single = || {
        get(cp, SYSTEM, "lease/wasm-operator")
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
    };
    assert_eq!(
        single(),
        None,
        "replica-d took the Lease while replica-c held shards"
    );
    c.stop();
    let c_stopped = Timestamp::now();
    eventually("replica-d to lead", Duration::from_secs(30), || {
        single().as_deref() == Some("replica-d")
    })
    .await;
    for n in &names {
        eventually(
            &format!("{n}'s Deployment to lose its shard label"),
            Duration::from_secs(30),
            || get(cp, ns, &format!("deployment/{n}")).is_some_and(|d| shard_label(&d).is_none()),
        )
        .await;
    }
    for w in &self::writes(cp, ns) {
        match w.by.as_str() {
            "replica-c" => assert!(w.at < c_stopped, "replica-c wrote after it stopped: {w:?}"),
            "replica-d" => assert!(
                w.at > c_stopped,
                "replica-d wrote while replica-c served: {w:?}"
            ),
            _ => {}
        }
    }

    // Back to two shards, with a resource's ingress turned off meanwhile: the resource moves
    // to shard 1, whose replica knows its children (unlabelled, another pipeline's) by name
    // only. It reads them, takes those its render returns with its label, and prunes the
    // ingress that its status records and its render no longer returns.
    let mut d = d;
    d.stop();
    let moving = names
        .iter()
        .find(|n| two.of(ns, n) == 1 && three.of(ns, n) != 1)
        .expect("a resource of shard 1 of two, labelled with another of three");
    assert!(get(cp, ns, &format!("ingress/{moving}")).is_some());
    apply(
        cp,
        ns,
        &service(moving, 2).replace("ingress: { hosts:", "ingress: { enabled: false, hosts:"),
    );
    let e = Replica::start(&cluster, "replica-e", 2);
    eventually_or(
        &format!("{moving}'s ingress to be pruned by the holder of its new shard"),
        Duration::from_secs(60),
        || get(cp, ns, &format!("ingress/{moving}")).is_none(),
        || e.logs(),
    )
    .await;
    // It read them (they were in no store of its own), counted by kind.
    let metrics = http_get(e.metrics, "/metrics");
    let read = |resource: &str| {
        let series = format!("wasm_operator_api_reads_total{{resource=\"{resource}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    assert!(
        read("ingresses.networking.k8s.io") >= 1.0 && read("deployments.apps") >= 1.0,
        "replica-e's reads of objects known by name only were not counted:\n{metrics}"
    );
    eventually(
        &format!("{moving}'s Deployment to be labelled with shard 1"),
        Duration::from_secs(30),
        || {
            get(cp, ns, &format!("deployment/{moving}"))
                .is_some_and(|d| shard_label(&d).as_deref() == Some("1"))
        },
    )
    .await;
    wait_ready(cp, ns, &format!("services.hanzo.ai/{moving}"));
    drop(e);
}
