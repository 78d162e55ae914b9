//! The control plane starts, serves the right version and runs pods through kwok.

#[test]
fn starts_and_serves_the_pinned_version() {
    let started = std::time::Instant::now();
    let cp = testenv::ControlPlane::start().expect("control plane starts");
    let _logs = cp.logs_on_failure();
    eprintln!("control plane ready in {:?}", started.elapsed());
    let out = cp.kubectl(&["version", "-o", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["serverVersion"]["gitVersion"], "v1.36.3", "{v}");
    let nodes = cp.kubectl(&["get", "nodes", "-o", "name"]);
    assert_eq!(
        String::from_utf8_lossy(&nodes.stdout).trim(),
        "node/kwok-node-0"
    );
}
