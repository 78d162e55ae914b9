//! Plugins through a real OCI registry on loopback (distribution's `registry`, built by
//! `scripts/registry`): `host push`, `host pull`, `host inspect` and `--plugin oci://...`, a
//! tampered blob and an unknown digest refused, a registry that is down, credentials and a
//! private CA.

use std::path::{Path, PathBuf};

use testenv::{Registry, RegistryOptions};

use crate::support::{host_in, root};

/// As [`host_in`], asserting success; its stdout.
fn host_ok(cache: &Path, args: &[&str]) -> String {
    crate::support::succeeded(&format!("host {args:?}"), host_in(cache, args))
}

/// As [`host_in`], asserting exit 2 (could not run); its stderr.
fn host_fails(cache: &Path, args: &[&str]) -> String {
    let out = host_in(cache, args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(
        out.status.code(),
        Some(2),
        "host {args:?} should have failed: {}{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(out.stdout.is_empty(), "output on a failure: {out:?}");
    stderr
}

/// A built-in plugin written to a file, as an author's build would leave it.
fn plugin_file(dir: &Path, name: &str) -> PathBuf {
    let builtin = host::plugin::BUILTINS
        .iter()
        .find(|b| b.name == name)
        .expect("a built-in plugin");
    let path = dir.join(format!("{name}.wasm"));
    std::fs::write(&path, builtin.wasm).unwrap();
    path
}

fn kvcluster_example() -> String {
    root().join("examples/kvcluster.yaml").display().to_string()
}

#[test]
fn a_pushed_plugin_pulls_back_byte_for_byte_by_tag_and_by_digest() {
    let registry = Registry::start(RegistryOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = plugin_file(dir.path(), "kvcluster");
    let reference = format!("{}/plugins/kvcluster:1.0", registry.addr());

    let pushed = host_ok(
        dir.path(),
        &["push", &file.display().to_string(), &reference],
    );
    let pinned = pushed.trim().to_owned();
    let digest = pinned
        .rsplit_once('@')
        .expect("a pinned reference")
        .1
        .to_owned();
    assert!(
        pinned.starts_with(&format!("oci://{reference}@sha256:")),
        "{pinned}"
    );
    // The same component gives the same artifact: pushing it again changes nothing.
    let again = host_ok(
        dir.path(),
        &["push", &file.display().to_string(), &reference],
    );
    assert_eq!(again.trim(), pinned);

    for (what, from) in [("tag", reference.clone()), ("digest", pinned.clone())] {
        let out = dir.path().join(format!("by-{what}.wasm"));
        let printed = host_ok(
            dir.path(),
            &["pull", &from, "-o", &out.display().to_string()],
        );
        assert_eq!(printed.trim(), pinned, "pulled by {what}");
        assert_eq!(
            std::fs::read(&out).unwrap(),
            std::fs::read(&file).unwrap(),
            "the bytes pulled by {what}"
        );
    }

    // The manifest is the Wasm OCI artifact: inspect shows it, and what the plugin is.
    let report: serde_json::Value =
        serde_json::from_str(&host_ok(dir.path(), &["inspect", "-o", "json", &pinned])).unwrap();
    assert_eq!(report["manifest"], digest.as_str());
    assert_eq!(report["mediaType"], "application/wasm");
    assert_eq!(report["kinds"][0]["kind"], "KVCluster");
    assert_eq!(report["children"].as_array().unwrap().len(), 2);
    assert_eq!(report["contract"], "wasm-operator:plugin/reconciler@1.2.0");
    let text = host_ok(dir.path(), &["inspect", &file.display().to_string()]);
    assert!(
        text.contains("KVCluster (storage.mydatabase.io, v1alpha1)"),
        "{text}"
    );

    // `host check` takes the reference as it takes a file.
    let report: serde_json::Value = serde_json::from_str(&host_ok(
        dir.path(),
        &["check", "-o", "json", &pinned, &kvcluster_example()],
    ))
    .unwrap();
    assert_eq!(report["passed"], true, "{report}");
    assert_eq!(report["source"], pinned.as_str());

    // `--plugin oci://` serves the pulled plugin: the render names it.
    let rendered = host_ok(
        dir.path(),
        &[
            "render",
            "--no-builtins",
            "--plugin",
            &pinned,
            &kvcluster_example(),
        ],
    );
    assert!(rendered.contains("kind: StatefulSet"), "{rendered}");
}

#[test]
fn a_tampered_blob_and_an_unknown_digest_are_refused() {
    let registry = Registry::start(RegistryOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = plugin_file(dir.path(), "kvcluster");
    let reference = format!("{}/plugins/tampered:1.0", registry.addr());
    let pinned = host_ok(
        dir.path(),
        &["push", &file.display().to_string(), &reference],
    );
    let pinned = pinned.trim();

    // Unknown: a digest the registry never had.
    let unknown = format!(
        "{}/plugins/tampered@sha256:{}",
        registry.addr(),
        "0".repeat(64)
    );
    let stderr = host_fails(dir.path(), &["pull", &unknown, "-o", "/dev/null"]);
    assert!(stderr.contains("no such manifest"), "{stderr}");

    // Tampered: the registry's copy of the layer changed behind its back, same size.
    let wasm = std::fs::read(&file).unwrap();
    let layer = host::oci::digest(&wasm);
    let mut bad = wasm.clone();
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    std::fs::write(registry.blob_path(&layer), &bad).unwrap();
    let out = dir.path().join("bad.wasm");
    let stderr = host_fails(
        dir.path(),
        &["pull", pinned, "-o", &out.display().to_string()],
    );
    assert!(
        stderr.contains("does not match its digest") && stderr.contains(&layer),
        "{stderr}"
    );
    assert!(!out.exists(), "a tampered plugin was written");
    let stderr = host_fails(
        dir.path(),
        &[
            "render",
            "--no-builtins",
            "--plugin",
            pinned,
            &kvcluster_example(),
        ],
    );
    assert!(stderr.contains("does not match its digest"), "{stderr}");
}

#[test]
fn a_plugin_pinned_by_digest_loads_with_the_registry_down_and_a_tag_does_not() {
    let mut registry = Registry::start(RegistryOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = plugin_file(dir.path(), "kvcluster");
    let reference = format!("oci://{}/plugins/kvcluster:stable", registry.addr());
    let pinned = host_ok(
        dir.path(),
        &["push", &file.display().to_string(), &reference],
    );
    let pinned = pinned.trim();
    let render = |plugin: &str, extra: &[&str]| {
        let mut args = vec!["render", "--no-builtins", "--plugin", plugin];
        args.extend(extra);
        let example = kvcluster_example();
        args.push(&example);
        host_in(dir.path(), &args)
    };
    // A tag is resolved once, and the digest said.
    let by_tag = render(&reference, &[]);
    assert!(by_tag.status.success(), "{by_tag:?}");
    assert!(
        String::from_utf8_lossy(&by_tag.stderr).contains(&format!("is {pinned}")),
        "{by_tag:?}"
    );
    // --require-digest refuses the tag, and takes the digest.
    let refused = render(&reference, &["--require-digest"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("names a tag"),
        "{refused:?}"
    );
    assert!(render(pinned, &["--require-digest"]).status.success());

    registry.stop();
    // Pulled before, by digest: from the store, with no registry.
    let offline = render(pinned, &[]);
    assert!(offline.status.success(), "{offline:?}");
    // A tag needs the registry to say what it is now.
    let stderr = String::from_utf8_lossy(&render(&reference, &[]).stderr).into_owned();
    assert!(stderr.contains("cannot be reached"), "{stderr}");
    // Without the store, the digest needs the registry too.
    let stderr = String::from_utf8_lossy(&render(pinned, &["--no-cache"]).stderr).into_owned();
    assert!(stderr.contains("cannot be reached"), "{stderr}");

    registry.restart().unwrap();
    assert!(render(&reference, &[]).status.success());

    // The kept layer damaged on disk (same size), with nothing compiled to load instead: it is
    // pulled again, kept anew, and the plugin loads; a broken cache never stops the host.
    let layer = host::oci::digest(&std::fs::read(&file).unwrap());
    // The cache's layout: components/ holds the compiled plugins and oci/, the store.
    let components = dir.path().join("components");
    let blob = components
        .join("oci/blobs/sha256")
        .join(layer.strip_prefix("sha256:").unwrap());
    let mut bytes = std::fs::read(&blob).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&blob, &bytes).unwrap();
    for entry in std::fs::read_dir(&components).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "oci" {
            if entry.file_type().unwrap().is_dir() {
                std::fs::remove_dir_all(entry.path()).unwrap();
            } else {
                std::fs::remove_file(entry.path()).unwrap();
            }
        }
    }
    let healed = render(pinned, &[]);
    assert!(healed.status.success(), "{healed:?}");
    assert!(
        String::from_utf8_lossy(&healed.stderr).contains("pulling it again"),
        "{healed:?}"
    );
    assert_eq!(host::oci::digest(&std::fs::read(&blob).unwrap()), layer);
}

#[test]
fn credentials_and_a_private_ca_are_what_the_registry_asks_for() {
    let registry = Registry::start(RegistryOptions {
        user: Some(("author".into(), "s3cret-pass".into())),
        tls: true,
        ..Default::default()
    })
    .unwrap();
    let ca = registry.ca().unwrap().display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let file = plugin_file(dir.path(), "kvcluster").display().to_string();
    let reference = format!("{}/private/kvcluster:1.0", registry.addr());

    // The registry's certificate is from a CA nobody trusts yet.
    let stderr = host_fails(dir.path(), &["push", &file, &reference]);
    assert!(
        stderr.contains("cannot be reached") && stderr.contains("certificate"),
        "{stderr}"
    );
    // Trusted, but no credentials.
    let stderr = host_fails(
        dir.path(),
        &["push", "--registry-ca", &ca, &file, &reference],
    );
    assert!(stderr.contains("refused access"), "{stderr}");
    // Wrong credentials.
    let config = dir.path().join("config.json");
    let write_config = |password: &str| {
        std::fs::write(
            &config,
            serde_json::json!({ "auths": { registry.addr(): {
                "auth": base64_encode(&format!("author:{password}")) } } })
            .to_string(),
        )
        .unwrap();
    };
    write_config("wrong");
    let cfg = config.display().to_string();
    let with = |extra: &[&str]| -> Vec<String> {
        let mut args = vec![
            "--registry-ca".to_owned(),
            ca.clone(),
            "--registry-config".to_owned(),
            cfg.clone(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args
    };
    let args = [vec!["push".to_owned()], with(&[&file, &reference])].concat();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let stderr = host_fails(dir.path(), &args);
    assert!(stderr.contains("refused access"), "{stderr}");
    // The right ones, from a Docker config JSON as `docker login` writes it.
    write_config("s3cret-pass");
    let pinned = host_ok(dir.path(), &args);
    let out = dir.path().join("pulled.wasm").display().to_string();
    let pull = [vec!["pull".to_owned()], with(&[pinned.trim(), "-o", &out])].concat();
    let pull: Vec<&str> = pull.iter().map(String::as_str).collect();
    host_ok(dir.path(), &pull);
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&file).unwrap());
    // Over HTTPS, not plain HTTP: the CA was needed above, and --plain-http cannot reach it.
    let plain = [
        vec!["pull".to_owned(), "--plain-http".to_owned()],
        with(&[pinned.trim(), "-o", &out]),
    ]
    .concat();
    let plain: Vec<&str> = plain.iter().map(String::as_str).collect();
    let out = host_in(dir.path(), &plain);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// The Bearer-token flow of public registries, against distribution's registry and its token
/// server: the registry's challenge names the token service, which checks the credentials and
/// grants a token for the repository's scope. The token server grants a user the repositories
/// under its own name alone: elsewhere the registry refuses the token, and the host says so after
/// asking once more (not in a loop).
#[test]
fn a_registry_that_asks_for_bearer_tokens_gets_them_from_its_token_service() {
    let registry = Registry::start(RegistryOptions {
        user: Some(("author".into(), "t0ken-pass".into())),
        token: true,
        ..Default::default()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = plugin_file(dir.path(), "kvcluster").display().to_string();
    let config = dir.path().join("config.json");
    std::fs::write(
        &config,
        serde_json::json!({ "auths": { registry.addr(): {
            "auth": base64_encode("author:t0ken-pass") } } })
        .to_string(),
    )
    .unwrap();
    let cfg = config.display().to_string();
    let reference = format!("{}/author/kvcluster:1.0", registry.addr());

    // Without credentials the token service refuses, and the host names it.
    let stderr = host_fails(dir.path(), &["push", &file, &reference]);
    assert!(
        stderr.contains("refused access") && stderr.contains("token service"),
        "{stderr}"
    );
    // With them: pushed and pulled back byte for byte, on tokens.
    let pinned = host_ok(
        dir.path(),
        &["push", "--registry-config", &cfg, &file, &reference],
    );
    let out = dir.path().join("pulled.wasm").display().to_string();
    host_ok(
        dir.path(),
        &["pull", "--registry-config", &cfg, pinned.trim(), "-o", &out],
    );
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&file).unwrap());
    let logs = registry.token_server_logs();
    assert!(
        logs.contains("authorized client"),
        "the token server granted no token:\n{logs}"
    );
    // A repository the token does not cover: refused, saying by whom.
    let elsewhere = format!("{}/someone-else/kvcluster:1.0", registry.addr());
    let stderr = host_fails(
        dir.path(),
        &["push", "--registry-config", &cfg, &file, &elsewhere],
    );
    assert!(stderr.contains("refused access"), "{stderr}");
}

#[test]
fn older_wasm_layer_media_types_are_pulled_too() {
    let registry = Registry::start(RegistryOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let wasm = std::fs::read(plugin_file(dir.path(), "kvcluster")).unwrap();
    let config = b"{}".to_vec();
    for (i, media_type) in host::oci::OLDER_LAYER_MEDIA_TYPES.iter().enumerate() {
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": host::oci::MANIFEST_MEDIA_TYPE,
            "config": { "mediaType": "application/vnd.wasm.config.v1+json",
                "digest": host::oci::digest(&config), "size": config.len() },
            "layers": [{ "mediaType": media_type, "digest": host::oci::digest(&wasm), "size": wasm.len() }],
        });
        let reference =
            host::oci::Reference::parse(&format!("{}/older/p{i}:1", registry.addr())).unwrap();
        let options = host::oci::Options {
            timeout: std::time::Duration::from_secs(30),
            ..Default::default()
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let pinned = runtime
            .block_on(host::oci::push_manifest(
                &reference,
                &options,
                &[
                    bytes::Bytes::from(wasm.clone()),
                    bytes::Bytes::from(config.clone()),
                ],
                serde_json::to_vec(&manifest).unwrap(),
            ))
            .unwrap();
        let out = dir.path().join(format!("p{i}.wasm"));
        let _ = host_ok(
            dir.path(),
            &[
                "pull",
                &pinned.to_string(),
                "-o",
                &out.display().to_string(),
            ],
        );
        assert_eq!(std::fs::read(&out).unwrap(), wasm, "{media_type}");
    }
}

fn base64_encode(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}
