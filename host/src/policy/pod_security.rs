//! The Pod Security Standards, applied to every pod template a plugin renders before it reaches
//! the API server. This is a port of `k8s.io/pod-security-admission` (Kubernetes v1.36) that
//! follows it check for check at the "latest" version: the same checks, in the same order, with
//! the same forbidden reasons and details, so a refusal here reads exactly like the one the API
//! server would have given for a namespace labelled `pod-security.kubernetes.io/enforce`.

use std::collections::BTreeSet;
use std::fmt::{self, Write as _};
use std::str::FromStr;

use serde_json::Value;

/// A Pod Security Standards level, as the namespace label `pod-security.kubernetes.io/enforce` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Unrestricted: no check applies.
    Privileged,
    /// Prevents known privilege escalations while allowing the default pod configuration.
    Baseline,
    /// Baseline plus the hardening best practices.
    Restricted,
}

impl Level {
    fn as_str(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }
}

impl FromStr for Level {
    type Err = String;

    /// Parses a label value; like the API server, only the exact lowercase words are accepted.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "privileged" => Ok(Level::Privileged),
            "baseline" => Ok(Level::Baseline),
            "restricted" => Ok(Level::Restricted),
            other => Err(format!(
                "{other:?} is not a Pod Security level: must be one of privileged, baseline, restricted"
            )),
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The namespace label whose value is the [`Level`] the API server enforces there.
pub const ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";

/// One failed check, named as the API server names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The reference's forbidden reason, e.g. `privileged`, `hostPath volumes`, `hostPort`,
    /// `runAsNonRoot != true`, `forbidden AppArmor profile(s)`.
    pub reason: String,
    /// The reference's forbidden detail, naming the containers / volumes, e.g.
    /// `container "app" must not set securityContext.privileged=true`.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)?;
        if !self.detail.is_empty() {
            write!(f, " ({})", self.detail)?;
        }
        Ok(())
    }
}

static NULL: Value = Value::Null;

/// The pod metadata and pod spec of a rendered object, if it has a pod template:
/// Pod (metadata/spec), Deployment, StatefulSet, DaemonSet, ReplicaSet, ReplicationController, Job (spec.template),
/// CronJob (spec.jobTemplate.spec.template). Matched on `kind` and an apiVersion group of "" / "apps" / "batch" only.
///
/// A missing (or non-object) metadata or spec inside the template comes back as `null`, which
/// every check reads as "nothing set"; a workload without a template has none.
pub fn pod_template(object: &Value) -> Option<(&Value, &Value)> {
    let kind = object.get("kind")?.as_str()?;
    let api_version = object.get("apiVersion")?.as_str()?;
    let group = api_version.split_once('/').map_or("", |(group, _)| group);
    let template = match (group, kind) {
        ("", "Pod") => object,
        ("", "ReplicationController")
        | ("apps", "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet")
        | ("batch", "Job") => object_at(object, &["spec", "template"])?,
        ("batch", "CronJob") => object_at(object, &["spec", "jobTemplate", "spec", "template"])?,
        _ => return None,
    };
    let part = |key: &str| object_at(template, &[key]).unwrap_or(&NULL);
    Some((part("metadata"), part("spec")))
}

/// Every check of `level` (privileged: none; baseline: the baseline checks; restricted: baseline and restricted)
/// that the object's pod template fails, in the reference's order. Empty for an object with no pod template.
pub fn check(level: Level, object: &Value) -> Vec<Violation> {
    if level == Level::Privileged {
        return Vec::new();
    }
    let Some((metadata, spec)) = pod_template(object) else {
        return Vec::new();
    };
    let pod = Pod { metadata, spec };
    let applies = |c: &&Check| c.level <= level;
    let overridden: Vec<&str> = CHECKS
        .iter()
        .filter(applies)
        .filter_map(|c| c.overrides)
        .collect();
    CHECKS
        .iter()
        .filter(applies)
        .filter(|c| !overridden.contains(&c.id))
        .filter_map(|c| (c.run)(pod))
        .collect()
}

/// The API server's wording: `violates PodSecurity "baseline:latest": privileged (container "a" must not set securityContext.privileged=true), hostPath volumes (volume "root")`.
pub fn message(level: Level, violations: &[Violation]) -> String {
    let details = violations
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    format!("violates PodSecurity \"{level}:latest\": {details}")
}

/// One check of the reference, under its check ID.
struct Check {
    id: &'static str,
    level: Level,
    /// The baseline check this restricted check replaces when restricted is evaluated.
    overrides: Option<&'static str>,
    run: fn(Pod<'_>) -> Option<Violation>,
}

/// The reference's evaluation order: baseline IDs sorted, then restricted IDs sorted (byte order).
/// At restricted, a baseline check that a restricted one overrides is left out.
static CHECKS: [Check; 19] = [
    baseline("appArmorProfile", app_armor_profile),
    baseline("capabilities_baseline", capabilities_baseline),
    baseline("hostNamespaces", host_namespaces),
    baseline("hostPathVolumes", host_path_volumes),
    baseline("hostPorts", host_ports),
    baseline("hostProbesAndHostLifecycle", host_probes_and_host_lifecycle),
    baseline("privileged", privileged),
    baseline("procMount", proc_mount_baseline),
    baseline("seLinuxOptions", se_linux_options),
    baseline("seccompProfile_baseline", seccomp_profile_baseline),
    baseline("sysctls", sysctls),
    baseline("windowsHostProcess", windows_host_process),
    restricted("allowPrivilegeEscalation", None, allow_privilege_escalation),
    restricted(
        "capabilities_restricted",
        Some("capabilities_baseline"),
        capabilities_restricted,
    ),
    restricted(
        "procMount_restricted",
        Some("procMount"),
        proc_mount_restricted,
    ),
    restricted(
        "restrictedVolumes",
        Some("hostPathVolumes"),
        restricted_volumes,
    ),
    restricted("runAsNonRoot", None, run_as_non_root),
    restricted("runAsUser", None, run_as_user),
    restricted(
        "seccompProfile_restricted",
        Some("seccompProfile_baseline"),
        seccomp_profile_restricted,
    ),
];

const fn baseline(id: &'static str, run: fn(Pod<'_>) -> Option<Violation>) -> Check {
    Check {
        id,
        level: Level::Baseline,
        overrides: None,
        run,
    }
}

const fn restricted(
    id: &'static str,
    overrides: Option<&'static str>,
    run: fn(Pod<'_>) -> Option<Violation>,
) -> Check {
    Check {
        id,
        level: Level::Restricted,
        overrides,
        run,
    }
}

#[derive(Clone, Copy)]
struct Pod<'a> {
    metadata: &'a Value,
    spec: &'a Value,
}

impl<'a> Pod<'a> {
    /// Init containers, containers, then ephemeral containers, as the reference visits them.
    fn containers(self) -> impl Iterator<Item = &'a Value> {
        ["initContainers", "containers", "ephemeralContainers"]
            .into_iter()
            .flat_map(move |key| items(self.spec, &[key]))
    }

    fn is_windows(self) -> bool {
        text(self.spec, &["os", "name"]) == "windows"
    }

    /// `hostUsers: false`: the pod runs in its own user namespace, which relaxes some checks.
    fn in_user_namespace(self) -> bool {
        flag(self.spec, &["hostUsers"]) == Some(false)
    }

    fn annotations(self) -> impl Iterator<Item = (&'a str, &'a str)> {
        object_at(self.metadata, &["annotations"])
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(key, value)| Some((key.as_str(), value.as_str()?)))
    }
}

// Reading the rendered JSON. A missing field, a null and a value of the wrong type all read as
// unset, which is what the API server's decoding and defaults amount to for these fields.

fn at<'a>(value: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter()
        .try_fold(value, |v, key| v.get(key))
        .filter(|v| !v.is_null())
}

fn object_at<'a>(value: &'a Value, path: &[&str]) -> Option<&'a Value> {
    at(value, path).filter(|v| v.is_object())
}

fn flag(value: &Value, path: &[&str]) -> Option<bool> {
    at(value, path).and_then(Value::as_bool)
}

fn text<'a>(value: &'a Value, path: &[&str]) -> &'a str {
    at(value, path).and_then(Value::as_str).unwrap_or("")
}

fn items<'a>(value: &'a Value, path: &[&str]) -> impl Iterator<Item = &'a Value> + use<'a> {
    at(value, path)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

fn strings<'a>(value: &'a Value, path: &[&str]) -> impl Iterator<Item = &'a str> + use<'a> {
    items(value, path).filter_map(Value::as_str)
}

fn name(container: &Value) -> &str {
    text(container, &["name"])
}

// The reference's wording helpers.

fn pluralize<'s>(singular: &'s str, plural: &'s str, count: usize) -> &'s str {
    if count == 1 { singular } else { plural }
}

/// Each item in double quotes, joined with ", " (no escaping, as in the reference).
fn join_quote<I>(items: I) -> String
where
    I: IntoIterator,
    I::Item: AsRef<str>,
{
    let mut out = String::new();
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push('"');
        out.push_str(item.as_ref());
        out.push('"');
    }
    out
}

fn join<I>(items: I, separator: &str) -> String
where
    I: IntoIterator,
    I::Item: AsRef<str>,
{
    let mut out = String::new();
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push_str(separator);
        }
        out.push_str(item.as_ref());
    }
    out
}

/// `container "a"` / `containers "a", "b"`.
fn containers_named(names: &[&str]) -> String {
    format!(
        "{} {}",
        pluralize("container", "containers", names.len()),
        join_quote(names)
    )
}

/// Go's `%q` of a string: double-quoted with backslash escapes.
fn go_quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if c < ' ' || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c if go_printable(c) => out.push(c),
            c if u32::from(c) < 0x1_0000 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => {
                let _ = write!(out, "\\U{:08x}", u32::from(c));
            }
        }
    }
    out.push('"');
    out
}

/// Close to Go's `unicode.IsPrint`: not a control, space other than ' ', format or private-use
/// character. (Unassigned code points, which Go also escapes, are kept.)
fn go_printable(c: char) -> bool {
    c == ' '
        || !(c.is_control()
            || c.is_whitespace()
            || matches!(
                c,
                '\u{ad}'
                    | '\u{600}'..='\u{605}'
                    | '\u{61c}'
                    | '\u{6dd}'
                    | '\u{70f}'
                    | '\u{180e}'
                    | '\u{200b}'..='\u{200f}'
                    | '\u{202a}'..='\u{202e}'
                    | '\u{2060}'..='\u{206f}'
                    | '\u{e000}'..='\u{f8ff}'
                    | '\u{feff}'
                    | '\u{fff9}'..='\u{fffb}'
            ))
}

fn violation(reason: &str, detail: String) -> Option<Violation> {
    Some(Violation {
        reason: reason.to_owned(),
        detail,
    })
}

// The checks, one function per check ID, at the latest version of each.

const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

/// Baseline: AppArmor may only be RuntimeDefault or Localhost (fields), or `runtime/default`,
/// `localhost/*` or empty (the deprecated annotations).
fn app_armor_profile(pod: Pod<'_>) -> Option<Violation> {
    let allowed =
        |profile: &Value| matches!(text(profile, &["type"]), "RuntimeDefault" | "Localhost");
    let mut setters: Vec<String> = Vec::new();
    let mut values: BTreeSet<&str> = BTreeSet::new();

    if let Some(profile) = object_at(pod.spec, &["securityContext", "appArmorProfile"])
        && !allowed(profile)
    {
        setters.push("pod".to_owned());
        values.insert(text(profile, &["type"]));
    }
    let mut bad = Vec::new();
    for container in pod.containers() {
        if let Some(profile) = object_at(container, &["securityContext", "appArmorProfile"])
            && !allowed(profile)
        {
            bad.push(name(container));
            values.insert(text(profile, &["type"]));
        }
    }
    if !bad.is_empty() {
        setters.push(containers_named(&bad));
    }

    let mut annotations: Vec<String> = pod
        .annotations()
        .filter(|(key, profile)| {
            key.starts_with(APPARMOR_ANNOTATION_PREFIX)
                && !(profile.is_empty()
                    || *profile == "runtime/default"
                    || profile.starts_with("localhost/"))
        })
        .map(|(key, profile)| format!("{key}={}", go_quote(profile)))
        .collect();
    let mut listed: Vec<String> = values.into_iter().map(str::to_owned).collect();
    if !annotations.is_empty() {
        annotations.sort();
        setters.push(pluralize("annotation", "annotations", annotations.len()).to_owned());
        listed.extend(annotations);
    }

    if setters.is_empty() {
        return None;
    }
    violation(
        pluralize(
            "forbidden AppArmor profile",
            "forbidden AppArmor profiles",
            listed.len(),
        ),
        format!(
            "{} must not set AppArmor profile type to {}",
            setters.join(" and "),
            join_quote(&listed)
        ),
    )
}

const DEFAULT_CAPABILITIES: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Baseline: capabilities may only be added from the container runtime's default set.
fn capabilities_baseline(pod: Pod<'_>) -> Option<Violation> {
    let mut bad = Vec::new();
    let mut added: BTreeSet<&str> = BTreeSet::new();
    for container in pod.containers() {
        let Some(capabilities) = object_at(container, &["securityContext", "capabilities"]) else {
            continue;
        };
        let mut valid = true;
        for capability in strings(capabilities, &["add"]) {
            if !DEFAULT_CAPABILITIES.contains(&capability) {
                valid = false;
                added.insert(capability);
            }
        }
        if !valid {
            bad.push(name(container));
        }
    }
    if bad.is_empty() {
        return None;
    }
    violation(
        "non-default capabilities",
        format!(
            "{} must not include {} in securityContext.capabilities.add",
            containers_named(&bad),
            join_quote(&added)
        ),
    )
}

/// Baseline: no host network, PID or IPC namespace.
fn host_namespaces(pod: Pod<'_>) -> Option<Violation> {
    let shared: Vec<String> = ["hostNetwork", "hostPID", "hostIPC"]
        .into_iter()
        .filter(|key| flag(pod.spec, &[*key]) == Some(true))
        .map(|key| format!("{key}=true"))
        .collect();
    if shared.is_empty() {
        return None;
    }
    violation("host namespaces", shared.join(", "))
}

/// Baseline: no hostPath volume.
fn host_path_volumes(pod: Pod<'_>) -> Option<Violation> {
    let volumes: Vec<&str> = items(pod.spec, &["volumes"])
        .filter(|volume| object_at(volume, &["hostPath"]).is_some())
        .map(name)
        .collect();
    if volumes.is_empty() {
        return None;
    }
    violation(
        "hostPath volumes",
        format!(
            "{} {}",
            pluralize("volume", "volumes", volumes.len()),
            join_quote(&volumes)
        ),
    )
}

/// Baseline: no container port bound on the host.
fn host_ports(pod: Pod<'_>) -> Option<Violation> {
    let mut bad = Vec::new();
    // Sorted as strings, as the reference does.
    let mut ports: BTreeSet<String> = BTreeSet::new();
    for container in pod.containers() {
        let mut valid = true;
        for port in items(container, &["ports"]) {
            let host_port = at(port, &["hostPort"]).and_then(Value::as_i64).unwrap_or(0);
            if host_port != 0 {
                valid = false;
                ports.insert(host_port.to_string());
            }
        }
        if !valid {
            bad.push(name(container));
        }
    }
    if bad.is_empty() {
        return None;
    }
    violation(
        "hostPort",
        format!(
            "{} {} {} {}",
            containers_named(&bad),
            pluralize("uses", "use", bad.len()),
            pluralize("hostPort", "hostPorts", ports.len()),
            join(&ports, ", ")
        ),
    )
}

/// Baseline: probes and lifecycle handlers must not aim at a host other than the pod's own.
fn host_probes_and_host_lifecycle(pod: Pod<'_>) -> Option<Violation> {
    const HANDLERS: [&[&str]; 5] = [
        &["livenessProbe"],
        &["readinessProbe"],
        &["startupProbe"],
        &["lifecycle", "postStart"],
        &["lifecycle", "preStop"],
    ];
    // Both sorted and without repeats, as the reference does.
    let mut bad: BTreeSet<&str> = BTreeSet::new();
    let mut hosts: BTreeSet<&str> = BTreeSet::new();
    for container in pod.containers() {
        for path in HANDLERS {
            let Some(handler) = object_at(container, path) else {
                continue;
            };
            for action in ["httpGet", "tcpSocket"] {
                if let Some(action) = object_at(handler, &[action]) {
                    let host = text(action, &["host"]);
                    if !host.is_empty() {
                        bad.insert(name(container));
                        hosts.insert(host);
                    }
                }
            }
        }
    }
    if bad.is_empty() {
        return None;
    }
    violation(
        "probe or lifecycle host",
        format!(
            "{} {} {} {} {}",
            pluralize("container", "containers", bad.len()),
            join_quote(&bad),
            pluralize("uses", "use", bad.len()),
            pluralize(
                "probe or lifecycle host",
                "probe or lifecycle hosts",
                hosts.len()
            ),
            join_quote(&hosts)
        ),
    )
}

/// Baseline: no privileged container.
fn privileged(pod: Pod<'_>) -> Option<Violation> {
    let bad: Vec<&str> = pod
        .containers()
        .filter(|c| flag(c, &["securityContext", "privileged"]) == Some(true))
        .map(name)
        .collect();
    if bad.is_empty() {
        return None;
    }
    violation(
        "privileged",
        format!(
            "{} must not set securityContext.privileged=true",
            containers_named(&bad)
        ),
    )
}

/// Baseline: the default /proc mount only, unless the pod has its own user namespace.
fn proc_mount_baseline(pod: Pod<'_>) -> Option<Violation> {
    if pod.in_user_namespace() {
        return None;
    }
    proc_mount_restricted(pod)
}

/// Restricted: the default /proc mount only, user namespace or not.
fn proc_mount_restricted(pod: Pod<'_>) -> Option<Violation> {
    let mut bad = Vec::new();
    let mut types: BTreeSet<&str> = BTreeSet::new();
    for container in pod.containers() {
        if let Some(proc_mount) =
            at(container, &["securityContext", "procMount"]).and_then(Value::as_str)
            && proc_mount != "Default"
        {
            bad.push(name(container));
            types.insert(proc_mount);
        }
    }
    if bad.is_empty() {
        return None;
    }
    violation(
        "procMount",
        format!(
            "{} must not set securityContext.procMount to {}",
            containers_named(&bad),
            join_quote(&types)
        ),
    )
}

const SELINUX_TYPES: [&str; 5] = [
    "",
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// What the SELinux options of the pod and its containers set that they may not.
#[derive(Default)]
struct SeLinuxFindings<'a> {
    types: BTreeSet<&'a str>,
    user: bool,
    role: bool,
}

impl<'a> SeLinuxFindings<'a> {
    fn allows(&mut self, options: &'a Value) -> bool {
        let mut valid = true;
        let selinux_type = text(options, &["type"]);
        if !SELINUX_TYPES.contains(&selinux_type) {
            valid = false;
            self.types.insert(selinux_type);
        }
        if !text(options, &["user"]).is_empty() {
            valid = false;
            self.user = true;
        }
        if !text(options, &["role"]).is_empty() {
            valid = false;
            self.role = true;
        }
        valid
    }
}

/// Baseline: SELinux options may only pick a container type, never a user or a role.
fn se_linux_options(pod: Pod<'_>) -> Option<Violation> {
    let mut findings = SeLinuxFindings::default();
    let mut setters: Vec<String> = Vec::new();
    if let Some(options) = object_at(pod.spec, &["securityContext", "seLinuxOptions"])
        && !findings.allows(options)
    {
        setters.push("pod".to_owned());
    }
    let mut bad = Vec::new();
    for container in pod.containers() {
        if let Some(options) = object_at(container, &["securityContext", "seLinuxOptions"])
            && !findings.allows(options)
        {
            bad.push(name(container));
        }
    }
    if !bad.is_empty() {
        setters.push(containers_named(&bad));
    }
    if setters.is_empty() {
        return None;
    }
    let mut data: Vec<String> = Vec::new();
    if !findings.types.is_empty() {
        data.push(format!(
            "{} {}",
            pluralize("type", "types", findings.types.len()),
            join_quote(&findings.types)
        ));
    }
    if findings.user {
        data.push("user may not be set".to_owned());
    }
    if findings.role {
        data.push("role may not be set".to_owned());
    }
    violation(
        "seLinuxOptions",
        format!(
            "{} set forbidden securityContext.seLinuxOptions: {}",
            setters.join(" and "),
            data.join("; ")
        ),
    )
}

fn valid_seccomp(profile: &Value) -> bool {
    matches!(text(profile, &["type"]), "Localhost" | "RuntimeDefault")
}

/// The pod and the containers that set a seccomp profile other than RuntimeDefault or
/// Localhost, in the reference's detail wording.
fn explicit_bad_seccomp(
    setters: &mut Vec<String>,
    bad: &[&str],
    values: &BTreeSet<&str>,
) -> Option<Violation> {
    if !bad.is_empty() {
        setters.push(containers_named(bad));
    }
    if setters.is_empty() {
        return None;
    }
    violation(
        "seccompProfile",
        format!(
            "{} must not set securityContext.seccompProfile.type to {}",
            setters.join(" and "),
            join_quote(values)
        ),
    )
}

/// Baseline: a seccomp profile, where set, must be RuntimeDefault or Localhost.
fn seccomp_profile_baseline(pod: Pod<'_>) -> Option<Violation> {
    let mut setters: Vec<String> = Vec::new();
    let mut values: BTreeSet<&str> = BTreeSet::new();
    if let Some(profile) = object_at(pod.spec, &["securityContext", "seccompProfile"])
        && !valid_seccomp(profile)
    {
        setters.push("pod".to_owned());
        values.insert(text(profile, &["type"]));
    }
    let mut bad = Vec::new();
    for container in pod.containers() {
        if let Some(profile) = object_at(container, &["securityContext", "seccompProfile"])
            && !valid_seccomp(profile)
        {
            bad.push(name(container));
            values.insert(text(profile, &["type"]));
        }
    }
    explicit_bad_seccomp(&mut setters, &bad, &values)
}

/// Restricted: every container runs under RuntimeDefault or Localhost seccomp, set on it or
/// on the pod (Windows pods exempt).
fn seccomp_profile_restricted(pod: Pod<'_>) -> Option<Violation> {
    if pod.is_windows() {
        return None;
    }
    let mut setters: Vec<String> = Vec::new();
    let mut values: BTreeSet<&str> = BTreeSet::new();
    let mut pod_set = false;
    if let Some(profile) = object_at(pod.spec, &["securityContext", "seccompProfile"]) {
        if valid_seccomp(profile) {
            pod_set = true;
        } else {
            setters.push("pod".to_owned());
            values.insert(text(profile, &["type"]));
        }
    }
    let mut explicit = Vec::new();
    let mut implicit = Vec::new();
    for container in pod.containers() {
        match object_at(container, &["securityContext", "seccompProfile"]) {
            Some(profile) if !valid_seccomp(profile) => {
                explicit.push(name(container));
                values.insert(text(profile, &["type"]));
            }
            Some(_) => {}
            None if !pod_set => implicit.push(name(container)),
            None => {}
        }
    }
    if let Some(found) = explicit_bad_seccomp(&mut setters, &explicit, &values) {
        return Some(found);
    }
    if implicit.is_empty() {
        return None;
    }
    violation(
        "seccompProfile",
        format!(
            "pod or {} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\"",
            containers_named(&implicit)
        ),
    )
}

/// The namespaced, isolated sysctls the latest version allows (as of v1.32).
const SAFE_SYSCTLS: [&str; 12] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

/// Baseline: only the safe sysctls.
fn sysctls(pod: Pod<'_>) -> Option<Violation> {
    let forbidden: Vec<&str> = items(pod.spec, &["securityContext", "sysctls"])
        .map(name)
        .filter(|sysctl| !SAFE_SYSCTLS.contains(sysctl))
        .collect();
    if forbidden.is_empty() {
        return None;
    }
    violation("forbidden sysctls", forbidden.join(", "))
}

/// Baseline: no Windows HostProcess pod or container.
fn windows_host_process(pod: Pod<'_>) -> Option<Violation> {
    const PATH: [&str; 3] = ["securityContext", "windowsOptions", "hostProcess"];
    let bad: Vec<&str> = pod
        .containers()
        .filter(|c| flag(c, &PATH) == Some(true))
        .map(name)
        .collect();
    let mut setters: Vec<String> = Vec::new();
    if flag(pod.spec, &PATH) == Some(true) {
        setters.push("pod".to_owned());
    }
    if !bad.is_empty() {
        setters.push(containers_named(&bad));
    }
    if setters.is_empty() {
        return None;
    }
    violation(
        "hostProcess",
        format!(
            "{} must not set securityContext.windowsOptions.hostProcess=true",
            setters.join(" and ")
        ),
    )
}

/// Restricted: every container sets allowPrivilegeEscalation=false (Windows pods exempt).
fn allow_privilege_escalation(pod: Pod<'_>) -> Option<Violation> {
    if pod.is_windows() {
        return None;
    }
    let bad: Vec<&str> = pod
        .containers()
        .filter(|c| flag(c, &["securityContext", "allowPrivilegeEscalation"]) != Some(false))
        .map(name)
        .collect();
    if bad.is_empty() {
        return None;
    }
    violation(
        "allowPrivilegeEscalation != false",
        format!(
            "{} must set securityContext.allowPrivilegeEscalation=false",
            containers_named(&bad)
        ),
    )
}

/// Restricted: every container drops ALL and adds at most NET_BIND_SERVICE (Windows pods exempt).
fn capabilities_restricted(pod: Pod<'_>) -> Option<Violation> {
    if pod.is_windows() {
        return None;
    }
    let mut missing_drop_all = Vec::new();
    let mut adding = Vec::new();
    let mut added: BTreeSet<&str> = BTreeSet::new();
    for container in pod.containers() {
        let Some(capabilities) = object_at(container, &["securityContext", "capabilities"]) else {
            missing_drop_all.push(name(container));
            continue;
        };
        if !strings(capabilities, &["drop"]).any(|c| c == "ALL") {
            missing_drop_all.push(name(container));
        }
        let mut adds_forbidden = false;
        for capability in strings(capabilities, &["add"]) {
            if capability != "NET_BIND_SERVICE" {
                adds_forbidden = true;
                added.insert(capability);
            }
        }
        if adds_forbidden {
            adding.push(name(container));
        }
    }
    let mut details = Vec::new();
    if !missing_drop_all.is_empty() {
        details.push(format!(
            "{} must set securityContext.capabilities.drop=[\"ALL\"]",
            containers_named(&missing_drop_all)
        ));
    }
    if !adding.is_empty() {
        details.push(format!(
            "{} must not include {} in securityContext.capabilities.add",
            containers_named(&adding),
            join_quote(&added)
        ));
    }
    if details.is_empty() {
        return None;
    }
    violation("unrestricted capabilities", details.join("; "))
}

/// The volume sources restricted allows.
const ALLOWED_VOLUME_SOURCES: [&str; 9] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "image",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// The other volume sources, in the order the reference names the first one a volume sets.
const RESTRICTED_VOLUME_SOURCES: [&str; 21] = [
    "hostPath",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "gitRepo",
    "nfs",
    "iscsi",
    "glusterfs",
    "rbd",
    "flexVolume",
    "cinder",
    "cephfs",
    "flocker",
    "fc",
    "azureFile",
    "vsphereVolume",
    "quobyte",
    "azureDisk",
    "photonPersistentDisk",
    "portworxVolume",
    "scaleIO",
    "storageos",
];

/// Restricted: only the allowed volume sources (this replaces the baseline hostPath check).
fn restricted_volumes(pod: Pod<'_>) -> Option<Violation> {
    let mut bad = Vec::new();
    let mut types: BTreeSet<&str> = BTreeSet::new();
    for volume in items(pod.spec, &["volumes"]) {
        let sets = |source: &str| object_at(volume, &[source]).is_some();
        if ALLOWED_VOLUME_SOURCES.into_iter().any(sets) {
            continue;
        }
        bad.push(name(volume));
        types.insert(
            RESTRICTED_VOLUME_SOURCES
                .into_iter()
                .find(|source| sets(source))
                .unwrap_or("unknown"),
        );
    }
    if bad.is_empty() {
        return None;
    }
    violation(
        "restricted volume types",
        format!(
            "{} {} {} {} {}",
            pluralize("volume", "volumes", bad.len()),
            join_quote(&bad),
            pluralize("uses", "use", bad.len()),
            pluralize(
                "restricted volume type",
                "restricted volume types",
                types.len()
            ),
            join_quote(&types)
        ),
    )
}

/// Restricted: runAsNonRoot=true on the pod or on every container, and false nowhere (pods in
/// their own user namespace exempt).
fn run_as_non_root(pod: Pod<'_>) -> Option<Violation> {
    const PATH: [&str; 2] = ["securityContext", "runAsNonRoot"];
    if pod.in_user_namespace() {
        return None;
    }
    let mut setters: Vec<String> = Vec::new();
    let mut pod_non_root = false;
    match flag(pod.spec, &PATH) {
        Some(false) => setters.push("pod".to_owned()),
        Some(true) => pod_non_root = true,
        None => {}
    }
    let mut explicit = Vec::new();
    let mut implicit = Vec::new();
    for container in pod.containers() {
        match flag(container, &PATH) {
            Some(false) => explicit.push(name(container)),
            Some(true) => {}
            None if !pod_non_root => implicit.push(name(container)),
            None => {}
        }
    }
    if !explicit.is_empty() {
        setters.push(containers_named(&explicit));
    }
    if !setters.is_empty() {
        return violation(
            "runAsNonRoot != true",
            format!(
                "{} must not set securityContext.runAsNonRoot=false",
                setters.join(" and ")
            ),
        );
    }
    if implicit.is_empty() {
        return None;
    }
    violation(
        "runAsNonRoot != true",
        format!(
            "pod or {} must set securityContext.runAsNonRoot=true",
            containers_named(&implicit)
        ),
    )
}

/// Restricted: runAsUser is never 0 (pods in their own user namespace exempt).
fn run_as_user(pod: Pod<'_>) -> Option<Violation> {
    const PATH: [&str; 2] = ["securityContext", "runAsUser"];
    if pod.in_user_namespace() {
        return None;
    }
    let is_root = |value: &Value| at(value, &PATH).and_then(Value::as_i64) == Some(0);
    let mut setters: Vec<String> = Vec::new();
    if is_root(pod.spec) {
        setters.push("pod".to_owned());
    }
    let bad: Vec<&str> = pod.containers().filter(|c| is_root(c)).map(name).collect();
    if !bad.is_empty() {
        setters.push(containers_named(&bad));
    }
    if setters.is_empty() {
        return None;
    }
    violation(
        "runAsUser=0",
        format!("{} must not set runAsUser=0", setters.join(" and ")),
    )
}

#[cfg(test)]
mod tests {
    use rstest::rstest;
    use serde_json::json;

    use super::*;

    /// Runs the check registered under the reference's check ID on `{metadata, spec}`.
    fn run(id: &str, pod: &Value) -> Option<(String, String)> {
        let check = CHECKS
            .iter()
            .find(|c| c.id == id)
            .expect("a check ID of the reference");
        let pod = Pod {
            metadata: pod.get("metadata").unwrap_or(&NULL),
            spec: pod.get("spec").unwrap_or(&NULL),
        };
        (check.run)(pod).map(|v| (v.reason, v.detail))
    }

    fn pod(spec: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec})
    }

    fn reasons(violations: &[Violation]) -> Vec<&str> {
        violations.iter().map(|v| v.reason.as_str()).collect()
    }

    // The fail cases of the reference's check_*_test.go, with their expected reason and detail.
    #[rstest]
    #[case::privileged("privileged", json!({"spec": {"containers": [
        {"name": "a"},
        {"name": "b", "securityContext": {}},
        {"name": "c", "securityContext": {"privileged": false}},
        {"name": "d", "securityContext": {"privileged": true}},
        {"name": "e", "securityContext": {"privileged": true}},
    ]}}), "privileged", r#"containers "d", "e" must not set securityContext.privileged=true"#)]
    #[case::host_namespaces("hostNamespaces", json!({"spec": {
        "hostNetwork": true, "hostIPC": true, "hostPID": true,
    }}), "host namespaces", "hostNetwork=true, hostPID=true, hostIPC=true")]
    #[case::host_path_volumes("hostPathVolumes", json!({"spec": {"volumes": [
        {"name": "a", "hostPath": {}},
        {"name": "b", "hostPath": {}},
        {"name": "c", "emptyDir": {}},
    ]}}), "hostPath volumes", r#"volumes "a", "b""#)]
    #[case::host_port_one("hostPorts", json!({"spec": {"containers": [
        {"name": "a", "ports": [{"hostPort": 0}]},
        {"name": "b", "ports": [{"hostPort": 0}, {"hostPort": 20}]},
    ]}}), "hostPort", r#"container "b" uses hostPort 20"#)]
    #[case::host_ports_many("hostPorts", json!({"spec": {"containers": [
        {"name": "a", "ports": [{"hostPort": 0}]},
        {"name": "b", "ports": [{"hostPort": 0}, {"hostPort": 10}, {"hostPort": 20}]},
        {"name": "c", "ports": [{"hostPort": 0}, {"hostPort": 10}, {"hostPort": 30}]},
    ]}}), "hostPort", r#"containers "b", "c" use hostPorts 10, 20, 30"#)]
    #[case::capabilities_baseline("capabilities_baseline", json!({"spec": {"containers": [
        {"name": "a", "securityContext": {"capabilities": {"add": ["FOO", "BAR"]}}},
        {"name": "b", "securityContext": {"capabilities": {"add": ["BAR", "BAZ"]}}},
    ]}}), "non-default capabilities",
        r#"containers "a", "b" must not include "BAR", "BAZ", "FOO" in securityContext.capabilities.add"#)]
    #[case::capabilities_restricted("capabilities_restricted", json!({"spec": {"containers": [
        {"name": "a", "securityContext": {"capabilities": {"add": ["FOO", "BAR"]}}},
        {"name": "b", "securityContext": {"capabilities": {"add": ["BAR", "BAZ"]}}},
        {"name": "c", "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE", "CHOWN"], "drop": ["ALL", "FOO"]}}},
    ]}}), "unrestricted capabilities",
        r#"containers "a", "b" must set securityContext.capabilities.drop=["ALL"]; containers "a", "b", "c" must not include "BAR", "BAZ", "CHOWN", "FOO" in securityContext.capabilities.add"#)]
    #[case::capabilities_restricted_linux_pod("capabilities_restricted", json!({"spec": {
        "os": {"name": "linux"}, "containers": [{"name": "a"}],
    }}), "unrestricted capabilities", r#"container "a" must set securityContext.capabilities.drop=["ALL"]"#)]
    #[case::allow_privilege_escalation("allowPrivilegeEscalation", json!({"spec": {"containers": [
        {"name": "a"},
        {"name": "b", "securityContext": {"allowPrivilegeEscalation": null}},
        {"name": "c", "securityContext": {"allowPrivilegeEscalation": true}},
        {"name": "d", "securityContext": {"allowPrivilegeEscalation": false}},
    ]}}), "allowPrivilegeEscalation != false",
        r#"containers "a", "b", "c" must set securityContext.allowPrivilegeEscalation=false"#)]
    #[case::allow_privilege_escalation_linux_pod("allowPrivilegeEscalation", json!({"spec": {
        "os": {"name": "linux"}, "containers": [{"name": "a"}],
    }}), "allowPrivilegeEscalation != false",
        r#"container "a" must set securityContext.allowPrivilegeEscalation=false"#)]
    #[case::app_armor_unconfined_pod("appArmorProfile", json!({"spec": {
        "securityContext": {"appArmorProfile": {"type": "Unconfined"}},
    }}), "forbidden AppArmor profile", r#"pod must not set AppArmor profile type to "Unconfined""#)]
    #[case::app_armor_unconfined_container("appArmorProfile", json!({"spec": {
        "securityContext": {"appArmorProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "foo", "securityContext": {"appArmorProfile": {"type": "Unconfined"}}}],
    }}), "forbidden AppArmor profile", r#"container "foo" must not set AppArmor profile type to "Unconfined""#)]
    #[case::app_armor_unconfined_init_container("appArmorProfile", json!({"spec": {
        "securityContext": {"appArmorProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "foo"}],
        "initContainers": [{"name": "bar", "securityContext": {"appArmorProfile": {"type": "Unconfined"}}}],
    }}), "forbidden AppArmor profile", r#"container "bar" must not set AppArmor profile type to "Unconfined""#)]
    #[case::app_armor_annotations("appArmorProfile", json!({"metadata": {"annotations": {
        "container.apparmor.security.beta.kubernetes.io/": "bogus",
        "container.apparmor.security.beta.kubernetes.io/a": "",
        "container.apparmor.security.beta.kubernetes.io/b": "runtime/default",
        "container.apparmor.security.beta.kubernetes.io/c": "localhost/",
        "container.apparmor.security.beta.kubernetes.io/d": "localhost/foo",
        "container.apparmor.security.beta.kubernetes.io/e": "unconfined",
        "container.apparmor.security.beta.kubernetes.io/f": "unknown",
    }}}), "forbidden AppArmor profiles", concat!(
        "annotations must not set AppArmor profile type to ",
        r#""container.apparmor.security.beta.kubernetes.io/="bogus"", "#,
        r#""container.apparmor.security.beta.kubernetes.io/e="unconfined"", "#,
        r#""container.apparmor.security.beta.kubernetes.io/f="unknown"""#,
    ))]
    #[case::probe_hosts_local("hostProbesAndHostLifecycle", json!({"spec": {"containers": [{
        "name": "a",
        "livenessProbe": {"httpGet": {"host": "127.0.0.1"}},
        "readinessProbe": {"tcpSocket": {"host": "::1"}},
        "startupProbe": {"httpGet": {"host": "localhost"}},
    }]}}), "probe or lifecycle host",
        r#"container "a" uses probe or lifecycle hosts "127.0.0.1", "::1", "localhost""#)]
    #[case::probe_host_liveness_http("hostProbesAndHostLifecycle", json!({"spec": {"containers": [
        {"name": "a", "livenessProbe": {"httpGet": {"host": "invalid.host"}}},
    ]}}), "probe or lifecycle host", r#"container "a" uses probe or lifecycle host "invalid.host""#)]
    #[case::probe_host_readiness_tcp("hostProbesAndHostLifecycle", json!({"spec": {"containers": [
        {"name": "b", "readinessProbe": {"tcpSocket": {"host": "invalid.host"}}},
    ]}}), "probe or lifecycle host", r#"container "b" uses probe or lifecycle host "invalid.host""#)]
    #[case::probe_host_startup_http("hostProbesAndHostLifecycle", json!({"spec": {"containers": [
        {"name": "c", "startupProbe": {"httpGet": {"host": "invalid.host"}}},
    ]}}), "probe or lifecycle host", r#"container "c" uses probe or lifecycle host "invalid.host""#)]
    #[case::lifecycle_host_post_start_tcp("hostProbesAndHostLifecycle", json!({"spec": {"containers": [
        {"name": "d", "lifecycle": {"postStart": {"tcpSocket": {"host": "invalid.host"}}}},
    ]}}), "probe or lifecycle host", r#"container "d" uses probe or lifecycle host "invalid.host""#)]
    #[case::lifecycle_host_pre_stop_http("hostProbesAndHostLifecycle", json!({"spec": {"containers": [
        {"name": "e", "lifecycle": {"preStop": {"httpGet": {"host": "another.invalid.host"}}}},
    ]}}), "probe or lifecycle host", r#"container "e" uses probe or lifecycle host "another.invalid.host""#)]
    #[case::probe_hosts_many_containers("hostProbesAndHostLifecycle", json!({"spec": {"containers": [
        {"name": "valid"},
        {"name": "invalid1", "livenessProbe": {"httpGet": {"host": "a.com"}}},
        {"name": "invalid2",
         "lifecycle": {"preStop": {"tcpSocket": {"host": "b.com"}}},
         "startupProbe": {"httpGet": {"host": "a.com"}}},
    ]}}), "probe or lifecycle host",
        r#"containers "invalid1", "invalid2" use probe or lifecycle hosts "a.com", "b.com""#)]
    #[case::probe_host_ipv4("hostProbesAndHostLifecycle", json!({"spec": {"containers": [
        {"name": "a", "livenessProbe": {"httpGet": {"host": "8.8.8.8"}}},
    ]}}), "probe or lifecycle host", r#"container "a" uses probe or lifecycle host "8.8.8.8""#)]
    #[case::probe_host_ipv6("hostProbesAndHostLifecycle", json!({"spec": {"containers": [
        {"name": "a", "livenessProbe": {"tcpSocket": {"host": "2001:4860:4860::8888"}}},
    ]}}), "probe or lifecycle host", r#"container "a" uses probe or lifecycle host "2001:4860:4860::8888""#)]
    #[case::probe_host_init_container("hostProbesAndHostLifecycle", json!({"spec": {"initContainers": [
        {"name": "init", "livenessProbe": {"httpGet": {"host": "invalid.init.host"}}},
    ]}}), "probe or lifecycle host", r#"container "init" uses probe or lifecycle host "invalid.init.host""#)]
    #[case::proc_mount_baseline("procMount", json!({"spec": {"hostUsers": true, "containers": [
        {"name": "a"},
        {"name": "b", "securityContext": {}},
        {"name": "c", "securityContext": {"procMount": "Default"}},
        {"name": "d", "securityContext": {"procMount": "Unmasked"}},
        {"name": "e", "securityContext": {"procMount": "other"}},
    ]}}), "procMount", r#"containers "d", "e" must not set securityContext.procMount to "Unmasked", "other""#)]
    #[case::proc_mount_restricted_host_users("procMount_restricted", json!({"spec": {"hostUsers": true, "containers": [
        {"name": "a"},
        {"name": "b", "securityContext": {}},
        {"name": "c", "securityContext": {"procMount": "Default"}},
        {"name": "d", "securityContext": {"procMount": "Unmasked"}},
        {"name": "e", "securityContext": {"procMount": "other"}},
    ]}}), "procMount", r#"containers "d", "e" must not set securityContext.procMount to "Unmasked", "other""#)]
    #[case::proc_mount_restricted_user_namespace("procMount_restricted", json!({"spec": {"hostUsers": false, "containers": [
        {"name": "a"},
        {"name": "b", "securityContext": {}},
        {"name": "c", "securityContext": {"procMount": "Default"}},
        {"name": "d", "securityContext": {"procMount": "Unmasked"}},
        {"name": "e", "securityContext": {"procMount": "other"}},
    ]}}), "procMount", r#"containers "d", "e" must not set securityContext.procMount to "Unmasked", "other""#)]
    #[case::restricted_volumes("restrictedVolumes", json!({"spec": {"volumes": [
        {"name": "a1", "emptyDir": {}},
        {"name": "a2", "secret": {}},
        {"name": "a3", "persistentVolumeClaim": {}},
        {"name": "a4", "downwardAPI": {}},
        {"name": "a5", "configMap": {}},
        {"name": "a6", "projected": {}},
        {"name": "a7", "csi": {}},
        {"name": "a8", "ephemeral": {}},
        {"name": "a9", "image": {}},
        {"name": "b1", "hostPath": {}},
        {"name": "b2", "gcePersistentDisk": {}},
        {"name": "b3", "awsElasticBlockStore": {}},
        {"name": "b4", "gitRepo": {}},
        {"name": "b5", "nfs": {}},
        {"name": "b6", "iscsi": {}},
        {"name": "b7", "glusterfs": {}},
        {"name": "b8", "rbd": {}},
        {"name": "b9", "flexVolume": {}},
        {"name": "b10", "cinder": {}},
        {"name": "b11", "cephfs": {}},
        {"name": "b12", "flocker": {}},
        {"name": "b13", "fc": {}},
        {"name": "b14", "azureFile": {}},
        {"name": "b15", "vsphereVolume": {}},
        {"name": "b16", "quobyte": {}},
        {"name": "b17", "azureDisk": {}},
        {"name": "b18", "photonPersistentDisk": {}},
        {"name": "b19", "portworxVolume": {}},
        {"name": "b20", "scaleIO": {}},
        {"name": "b21", "storageos": {}},
        {"name": "c1"},
    ]}}), "restricted volume types", concat!(
        "volumes ",
        r#""b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8", "b9", "b10", "b11", "b12", "b13", "b14", "b15", "b16", "b17", "b18", "b19", "b20", "b21", "c1""#,
        " use restricted volume types ",
        r#""awsElasticBlockStore", "azureDisk", "azureFile", "cephfs", "cinder", "fc", "flexVolume", "flocker", "gcePersistentDisk", "gitRepo", "glusterfs", "#,
        r#""hostPath", "iscsi", "nfs", "photonPersistentDisk", "portworxVolume", "quobyte", "rbd", "scaleIO", "storageos", "unknown", "vsphereVolume""#,
    ))]
    #[case::run_as_non_root_unset("runAsNonRoot", json!({"spec": {"containers": [{"name": "a"}]}}),
        "runAsNonRoot != true", r#"pod or container "a" must set securityContext.runAsNonRoot=true"#)]
    #[case::run_as_non_root_pod_false("runAsNonRoot", json!({"spec": {
        "securityContext": {"runAsNonRoot": false}, "containers": [{"name": "a"}],
    }}), "runAsNonRoot != true", "pod must not set securityContext.runAsNonRoot=false")]
    #[case::run_as_non_root_containers_false("runAsNonRoot", json!({"spec": {
        "securityContext": {"runAsNonRoot": true},
        "containers": [
            {"name": "a"},
            {"name": "b", "securityContext": {}},
            {"name": "c", "securityContext": {"runAsNonRoot": false}},
            {"name": "d", "securityContext": {"runAsNonRoot": false}},
            {"name": "e", "securityContext": {"runAsNonRoot": true}},
            {"name": "f", "securityContext": {"runAsNonRoot": true}},
        ],
    }}), "runAsNonRoot != true", r#"containers "c", "d" must not set securityContext.runAsNonRoot=false"#)]
    #[case::run_as_non_root_container_fallthrough("runAsNonRoot", json!({"spec": {"containers": [
        {"name": "a"},
        {"name": "b", "securityContext": {}},
        {"name": "d", "securityContext": {"runAsNonRoot": true}},
        {"name": "e", "securityContext": {"runAsNonRoot": true}},
    ]}}), "runAsNonRoot != true", r#"pod or containers "a", "b" must set securityContext.runAsNonRoot=true"#)]
    #[case::run_as_user_pod_root("runAsUser", json!({"spec": {
        "securityContext": {"runAsUser": 0}, "containers": [{"name": "a"}],
    }}), "runAsUser=0", "pod must not set runAsUser=0")]
    #[case::run_as_user_containers_root("runAsUser", json!({"spec": {
        "securityContext": {"runAsUser": 1000},
        "containers": [
            {"name": "a"},
            {"name": "b", "securityContext": {}},
            {"name": "c", "securityContext": {"runAsUser": 0}},
            {"name": "d", "securityContext": {"runAsUser": 0}},
            {"name": "e", "securityContext": {"runAsUser": 1}},
            {"name": "f", "securityContext": {"runAsUser": 1}},
        ],
    }}), "runAsUser=0", r#"containers "c", "d" must not set runAsUser=0"#)]
    #[case::se_linux_pod_and_containers("seLinuxOptions", json!({"spec": {
        "securityContext": {"seLinuxOptions": {"type": "foo", "user": "bar", "role": "baz"}},
        "containers": [
            {"name": "a", "securityContext": {"seLinuxOptions": {"type": "container_t"}}},
            {"name": "b", "securityContext": {"seLinuxOptions": {"type": "container_init_t"}}},
            {"name": "c", "securityContext": {"seLinuxOptions": {"type": "container_kvm_t"}}},
            {"name": "d", "securityContext": {"seLinuxOptions": {"type": "container_engine_t"}}},
            {"name": "e", "securityContext": {"seLinuxOptions": {"type": "bar"}}},
            {"name": "f", "securityContext": {"seLinuxOptions": {"user": "bar"}}},
            {"name": "g", "securityContext": {"seLinuxOptions": {"role": "baz"}}},
        ],
    }}), "seLinuxOptions",
        r#"pod and containers "e", "f", "g" set forbidden securityContext.seLinuxOptions: types "bar", "foo"; user may not be set; role may not be set"#)]
    #[case::se_linux_pod("seLinuxOptions", json!({"spec": {
        "securityContext": {"seLinuxOptions": {"type": "foo", "user": "bar", "role": "baz"}},
        "containers": [
            {"name": "a", "securityContext": {"seLinuxOptions": {"type": "container_t"}}},
            {"name": "b", "securityContext": {"seLinuxOptions": {"type": "container_init_t"}}},
            {"name": "c", "securityContext": {"seLinuxOptions": {"type": "container_kvm_t"}}},
            {"name": "d", "securityContext": {"seLinuxOptions": {"type": "container_engine_t"}}},
        ],
    }}), "seLinuxOptions",
        r#"pod set forbidden securityContext.seLinuxOptions: type "foo"; user may not be set; role may not be set"#)]
    #[case::se_linux_containers("seLinuxOptions", json!({"spec": {
        "securityContext": {"seLinuxOptions": {}},
        "containers": [
            {"name": "a", "securityContext": {"seLinuxOptions": {"type": "container_t"}}},
            {"name": "b", "securityContext": {"seLinuxOptions": {"type": "container_init_t"}}},
            {"name": "c", "securityContext": {"seLinuxOptions": {"type": "container_kvm_t"}}},
            {"name": "d", "securityContext": {"seLinuxOptions": {"type": "container_engine_t"}}},
            {"name": "e", "securityContext": {"seLinuxOptions": {"type": "bar"}}},
            {"name": "f", "securityContext": {"seLinuxOptions": {"user": "bar"}}},
            {"name": "g", "securityContext": {"seLinuxOptions": {"role": "baz"}}},
        ],
    }}), "seLinuxOptions",
        r#"containers "e", "f", "g" set forbidden securityContext.seLinuxOptions: type "bar"; user may not be set; role may not be set"#)]
    #[case::se_linux_bad_type("seLinuxOptions", json!({"spec": {
        "securityContext": {"seLinuxOptions": {"type": "bad"}},
    }}), "seLinuxOptions", r#"pod set forbidden securityContext.seLinuxOptions: type "bad""#)]
    #[case::se_linux_bad_user("seLinuxOptions", json!({"spec": {
        "securityContext": {"seLinuxOptions": {"user": "bad"}},
    }}), "seLinuxOptions", "pod set forbidden securityContext.seLinuxOptions: user may not be set")]
    #[case::se_linux_bad_role("seLinuxOptions", json!({"spec": {
        "securityContext": {"seLinuxOptions": {"role": "bad"}},
    }}), "seLinuxOptions", "pod set forbidden securityContext.seLinuxOptions: role may not be set")]
    #[case::seccomp_baseline_pod("seccompProfile_baseline", json!({"spec": {
        "securityContext": {"seccompProfile": {"type": "Unconfined"}}, "containers": [{"name": "a"}],
    }}), "seccompProfile", r#"pod must not set securityContext.seccompProfile.type to "Unconfined""#)]
    #[case::seccomp_baseline_containers("seccompProfile_baseline", json!({"spec": {
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {"name": "a"},
            {"name": "b", "securityContext": {}},
            {"name": "c", "securityContext": {"seccompProfile": {"type": "Unconfined"}}},
            {"name": "d", "securityContext": {"seccompProfile": {"type": "Unconfined"}}},
            {"name": "e", "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}},
            {"name": "f", "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}},
        ],
    }}), "seccompProfile", r#"containers "c", "d" must not set securityContext.seccompProfile.type to "Unconfined""#)]
    #[case::seccomp_baseline_pod_and_containers("seccompProfile_baseline", json!({"spec": {
        "securityContext": {"seccompProfile": {"type": "Unconfined"}},
        "containers": [
            {"name": "a"},
            {"name": "b", "securityContext": {}},
            {"name": "c", "securityContext": {"seccompProfile": {"type": "Unconfined"}}},
            {"name": "d", "securityContext": {"seccompProfile": {"type": "Unconfined"}}},
            {"name": "e", "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}},
            {"name": "f", "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}},
        ],
    }}), "seccompProfile",
        r#"pod and containers "c", "d" must not set securityContext.seccompProfile.type to "Unconfined""#)]
    #[case::seccomp_restricted_unset("seccompProfile_restricted", json!({"spec": {"containers": [{"name": "a"}]}}),
        "seccompProfile",
        r#"pod or container "a" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost""#)]
    #[case::seccomp_restricted_linux_pod("seccompProfile_restricted", json!({"spec": {
        "os": {"name": "linux"}, "containers": [{"name": "a"}],
    }}), "seccompProfile",
        r#"pod or container "a" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost""#)]
    #[case::seccomp_restricted_pod("seccompProfile_restricted", json!({"spec": {
        "securityContext": {"seccompProfile": {"type": "Unconfined"}}, "containers": [{"name": "a"}],
    }}), "seccompProfile", r#"pod must not set securityContext.seccompProfile.type to "Unconfined""#)]
    #[case::seccomp_restricted_containers("seccompProfile_restricted", json!({"spec": {
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {"name": "a"},
            {"name": "b", "securityContext": {}},
            {"name": "c", "securityContext": {"seccompProfile": {"type": "Unconfined"}}},
            {"name": "d", "securityContext": {"seccompProfile": {"type": "Unconfined"}}},
            {"name": "e", "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}},
            {"name": "f", "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}},
        ],
    }}), "seccompProfile", r#"containers "c", "d" must not set securityContext.seccompProfile.type to "Unconfined""#)]
    #[case::seccomp_restricted_container_fallthrough("seccompProfile_restricted", json!({"spec": {"containers": [
        {"name": "a"},
        {"name": "b", "securityContext": {}},
        {"name": "d", "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}},
        {"name": "e", "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}},
    ]}}), "seccompProfile",
        r#"pod or containers "a", "b" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost""#)]
    #[case::sysctls("sysctls", json!({"spec": {"securityContext": {"sysctls": [{"name": "a"}, {"name": "b"}]}}}),
        "forbidden sysctls", "a, b")]
    #[case::windows_host_process("windowsHostProcess", json!({"spec": {
        "securityContext": {"windowsOptions": {"hostProcess": true}},
        "containers": [
            {"name": "a"},
            {"name": "b", "securityContext": {}},
            {"name": "c", "securityContext": {"windowsOptions": {}}},
            {"name": "d", "securityContext": {"windowsOptions": {"hostProcess": false}}},
            {"name": "e", "securityContext": {"windowsOptions": {"hostProcess": true}}},
            {"name": "f", "securityContext": {"windowsOptions": {"hostProcess": true}}},
        ],
    }}), "hostProcess",
        r#"pod and containers "e", "f" must not set securityContext.windowsOptions.hostProcess=true"#)]
    #[case::privileged_ephemeral_container("privileged", json!({"spec": {"ephemeralContainers": [
        {"name": "debug", "securityContext": {"privileged": true}},
    ]}}), "privileged", r#"container "debug" must not set securityContext.privileged=true"#)]
    #[case::containers_in_reference_order("allowPrivilegeEscalation", json!({"spec": {
        "ephemeralContainers": [{"name": "e"}],
        "containers": [{"name": "c"}],
        "initContainers": [{"name": "i"}],
    }}), "allowPrivilegeEscalation != false",
        r#"containers "i", "c", "e" must set securityContext.allowPrivilegeEscalation=false"#)]
    fn reference_fail_cases(
        #[case] id: &str,
        #[case] pod: Value,
        #[case] reason: &str,
        #[case] detail: &str,
    ) {
        assert_eq!(run(id, &pod), Some((reason.to_owned(), detail.to_owned())));
    }

    // The pass cases of the reference's check_*_test.go.
    #[rstest]
    #[case::privileged_unset_or_false("privileged", json!({"spec": {"containers": [
        {"name": "a"}, {"name": "b", "securityContext": {"privileged": false}},
    ]}}))]
    #[case::app_armor_runtime_default_annotation("appArmorProfile", json!({"metadata": {"annotations": {
        "container.apparmor.security.beta.kubernetes.io/test": "runtime/default", "env": "prod",
    }}}))]
    #[case::app_armor_localhost_annotation("appArmorProfile", json!({"metadata": {"annotations": {
        "container.apparmor.security.beta.kubernetes.io/test": "localhost/sec-profile01", "env": "dev",
    }}}))]
    #[case::app_armor_no_apparmor_annotations("appArmorProfile", json!({"metadata": {"annotations": {"env": "dev"}}}))]
    #[case::app_armor_no_annotations("appArmorProfile", json!({"metadata": {}, "spec": {}}))]
    #[case::app_armor_pod_runtime_default("appArmorProfile", json!({"spec": {
        "securityContext": {"appArmorProfile": {"type": "RuntimeDefault"}},
    }}))]
    #[case::app_armor_container_runtime_default("appArmorProfile", json!({"spec": {"containers": [
        {"name": "foo", "securityContext": {"appArmorProfile": {"type": "RuntimeDefault"}}},
    ]}}))]
    #[case::allow_privilege_escalation_windows("allowPrivilegeEscalation", json!({"spec": {
        "os": {"name": "windows"}, "containers": [{"name": "a"}],
    }}))]
    #[case::capabilities_restricted_windows("capabilities_restricted", json!({"spec": {
        "os": {"name": "windows"}, "containers": [{"name": "a"}],
    }}))]
    #[case::capabilities_baseline_default_set("capabilities_baseline", json!({"spec": {"containers": [
        {"name": "a", "securityContext": {"capabilities": {"add": ["CHOWN", "NET_BIND_SERVICE", "SYS_CHROOT"]}}},
    ]}}))]
    #[case::probe_hosts_unset("hostProbesAndHostLifecycle", json!({"spec": {"containers": [{
        "name": "a",
        "livenessProbe": {"httpGet": {}},
        "readinessProbe": {"tcpSocket": {}},
        "lifecycle": {"postStart": {"httpGet": {}}},
    }]}}))]
    #[case::proc_mount_baseline_user_namespace("procMount", json!({"spec": {"hostUsers": false, "containers": [
        {"name": "a"},
        {"name": "b", "securityContext": {}},
        {"name": "c", "securityContext": {"procMount": "Default"}},
        {"name": "d", "securityContext": {"procMount": "Unmasked"}},
        {"name": "e", "securityContext": {"procMount": "other"}},
    ]}}))]
    #[case::run_as_non_root_user_namespace("runAsNonRoot", json!({"spec": {"hostUsers": false}}))]
    #[case::run_as_user_pod_non_zero("runAsUser", json!({"spec": {
        "securityContext": {"runAsUser": 1000}, "containers": [{"name": "a"}],
    }}))]
    #[case::run_as_user_pod_unset("runAsUser", json!({"spec": {
        "securityContext": {"runAsUser": null}, "containers": [{"name": "a"}],
    }}))]
    #[case::run_as_user_containers_non_zero("runAsUser", json!({"spec": {"containers": [
        {"name": "c", "securityContext": {"runAsUser": 1}},
        {"name": "d", "securityContext": {"runAsUser": 2}},
        {"name": "e", "securityContext": {"runAsUser": 3}},
        {"name": "f", "securityContext": {"runAsUser": 4}},
    ]}}))]
    #[case::run_as_user_user_namespace("runAsUser", json!({"spec": {"hostUsers": false}}))]
    #[case::seccomp_restricted_windows("seccompProfile_restricted", json!({"spec": {
        "os": {"name": "windows"}, "containers": [{"name": "a"}],
    }}))]
    #[case::seccomp_restricted_pod_localhost("seccompProfile_restricted", json!({"spec": {
        "securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}},
        "containers": [{"name": "a"}],
    }}))]
    #[case::sysctls_v1_0("sysctls", json!({"spec": {"securityContext": {"sysctls": [
        {"name": "kernel.shm_rmid_forced"}, {"name": "net.ipv4.ip_local_port_range"},
        {"name": "net.ipv4.tcp_syncookies"}, {"name": "net.ipv4.ping_group_range"},
        {"name": "net.ipv4.ip_unprivileged_port_start"},
    ]}}}))]
    #[case::sysctls_v1_27("sysctls", json!({"spec": {"securityContext": {"sysctls": [
        {"name": "net.ipv4.ip_local_reserved_ports", "value": "1024-4999"},
    ]}}}))]
    #[case::sysctls_v1_29_keepalive_time("sysctls", json!({"spec": {"securityContext": {"sysctls": [
        {"name": "net.ipv4.tcp_keepalive_time", "value": "7200"},
    ]}}}))]
    #[case::sysctls_v1_29_fin_timeout("sysctls", json!({"spec": {"securityContext": {"sysctls": [
        {"name": "net.ipv4.tcp_fin_timeout", "value": "60"},
    ]}}}))]
    #[case::sysctls_v1_29_keepalive_intvl("sysctls", json!({"spec": {"securityContext": {"sysctls": [
        {"name": "net.ipv4.tcp_keepalive_intvl", "value": "75"},
    ]}}}))]
    #[case::sysctls_v1_29_keepalive_probes("sysctls", json!({"spec": {"securityContext": {"sysctls": [
        {"name": "net.ipv4.tcp_keepalive_probes", "value": "9"},
    ]}}}))]
    #[case::sysctls_v1_32_rmem("sysctls", json!({"spec": {"securityContext": {"sysctls": [
        {"name": "net.ipv4.tcp_rmem", "value": "4096 87380 16777216"},
    ]}}}))]
    #[case::sysctls_v1_32_wmem("sysctls", json!({"spec": {"securityContext": {"sysctls": [
        {"name": "net.ipv4.tcp_wmem", "value": "4096 65536 16777216"},
    ]}}}))]
    #[case::se_linux_allowed_types("seLinuxOptions", json!({"spec": {
        "securityContext": {"seLinuxOptions": {"level": "s0:c123,c456"}},
        "containers": [{"name": "a", "securityContext": {"seLinuxOptions": {"type": "container_engine_t"}}}],
    }}))]
    fn reference_pass_cases(#[case] id: &str, #[case] pod: Value) {
        assert_eq!(run(id, &pod), None);
    }

    #[test]
    fn checks_run_in_the_reference_order() {
        let baseline: Vec<&str> = CHECKS
            .iter()
            .filter(|c| c.level == Level::Baseline)
            .map(|c| c.id)
            .collect();
        let restricted: Vec<&str> = CHECKS
            .iter()
            .filter(|c| c.level == Level::Restricted)
            .map(|c| c.id)
            .collect();
        let mut sorted = baseline.clone();
        sorted.sort_unstable();
        assert_eq!(baseline, sorted);
        let mut sorted = restricted.clone();
        sorted.sort_unstable();
        assert_eq!(restricted, sorted);
        assert_eq!(
            [baseline, restricted].concat(),
            CHECKS.iter().map(|c| c.id).collect::<Vec<_>>()
        );
        for overridden in CHECKS.iter().filter_map(|c| c.overrides) {
            assert!(
                CHECKS
                    .iter()
                    .any(|c| c.id == overridden && c.level == Level::Baseline)
            );
        }
    }

    fn everything_forbidden() -> Value {
        pod(json!({
            "hostNetwork": true,
            "securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]},
            "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
            "containers": [{
                "name": "a",
                "ports": [{"containerPort": 80, "hostPort": 80}],
                "livenessProbe": {"httpGet": {"host": "example.com", "port": 80}},
                "securityContext": {
                    "privileged": true,
                    "capabilities": {"add": ["SYS_ADMIN"]},
                    "procMount": "Unmasked",
                    "seLinuxOptions": {"user": "u"},
                    "seccompProfile": {"type": "Unconfined"},
                    "appArmorProfile": {"type": "Unconfined"},
                    "windowsOptions": {"hostProcess": true},
                    "runAsUser": 0,
                },
            }],
        }))
    }

    #[rstest]
    #[case::baseline(Level::Baseline, &[
        "forbidden AppArmor profile", "non-default capabilities", "host namespaces", "hostPath volumes",
        "hostPort", "probe or lifecycle host", "privileged", "procMount", "seLinuxOptions",
        "seccompProfile", "forbidden sysctls", "hostProcess",
    ])]
    #[case::restricted(Level::Restricted, &[
        "forbidden AppArmor profile", "host namespaces", "hostPort", "probe or lifecycle host",
        "privileged", "seLinuxOptions", "forbidden sysctls", "hostProcess",
        "allowPrivilegeEscalation != false", "unrestricted capabilities", "procMount",
        "restricted volume types", "runAsNonRoot != true", "runAsUser=0", "seccompProfile",
    ])]
    #[case::privileged(Level::Privileged, &[])]
    fn every_failed_check_in_the_reference_order(#[case] level: Level, #[case] expected: &[&str]) {
        assert_eq!(reasons(&check(level, &everything_forbidden())), expected);
    }

    #[test]
    fn restricted_replaces_the_baseline_checks_it_overrides() {
        let violations = check(Level::Restricted, &everything_forbidden());
        let detail = |reason: &str| {
            violations
                .iter()
                .find(|v| v.reason == reason)
                .map(|v| v.detail.clone())
        };
        assert_eq!(
            detail("restricted volume types").as_deref(),
            Some(r#"volume "root" uses restricted volume type "hostPath""#)
        );
        assert_eq!(
            detail("unrestricted capabilities").as_deref(),
            Some(
                r#"container "a" must set securityContext.capabilities.drop=["ALL"]; container "a" must not include "SYS_ADMIN" in securityContext.capabilities.add"#
            )
        );
        assert!(detail("hostPath volumes").is_none());
        assert!(detail("non-default capabilities").is_none());
    }

    fn template_spec() -> Value {
        json!({"containers": [{"name": "w", "securityContext": {"privileged": true}}]})
    }

    fn template() -> Value {
        json!({"metadata": {"labels": {"app": "w"}}, "spec": template_spec()})
    }

    #[rstest]
    #[case::pod(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"labels": {"app": "w"}}, "spec": template_spec()}))]
    #[case::deployment(json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"template": template()}}))]
    #[case::stateful_set(json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "spec": {"template": template()}}))]
    #[case::daemon_set(json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "spec": {"template": template()}}))]
    #[case::replica_set(json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "spec": {"template": template()}}))]
    #[case::replication_controller(json!({"apiVersion": "v1", "kind": "ReplicationController", "spec": {"template": template()}}))]
    #[case::job(json!({"apiVersion": "batch/v1", "kind": "Job", "spec": {"template": template()}}))]
    #[case::cron_job(json!({"apiVersion": "batch/v1", "kind": "CronJob", "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template()}}}}))]
    fn pod_template_of_each_workload_kind(#[case] object: Value) {
        let expected_metadata = json!({"labels": {"app": "w"}});
        let expected_spec = template_spec();
        assert_eq!(
            pod_template(&object),
            Some((&expected_metadata, &expected_spec))
        );
        assert_eq!(
            check(Level::Baseline, &object),
            vec![Violation {
                reason: "privileged".into(),
                detail: r#"container "w" must not set securityContext.privileged=true"#.into(),
            }]
        );
    }

    #[rstest]
    #[case::config_map(json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"spec": "x"}}))]
    #[case::deployment_of_another_group(json!({"apiVersion": "example.com/v1", "kind": "Deployment", "spec": {"template": template()}}))]
    #[case::pod_of_another_group(json!({"apiVersion": "apps/v1", "kind": "Pod", "spec": template_spec()}))]
    #[case::no_api_version(json!({"kind": "Deployment", "spec": {"template": template()}}))]
    #[case::deployment_without_template(json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 1}}))]
    #[case::not_an_object(json!(["Pod"]))]
    fn no_pod_template(#[case] object: Value) {
        assert_eq!(pod_template(&object), None);
        assert!(check(Level::Restricted, &object).is_empty());
    }

    #[test]
    fn pod_template_without_metadata_reads_as_null() {
        let object =
            json!({"apiVersion": "batch/v1", "kind": "Job", "spec": {"template": {"spec": {}}}});
        assert_eq!(pod_template(&object), Some((&Value::Null, &json!({}))));
    }

    #[test]
    fn restricted_compliant_deployment_passes_restricted() {
        let deployment = json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {"template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                    "initContainers": [{
                        "name": "migrate",
                        "image": "web:1",
                        "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
                    }],
                    "containers": [{
                        "name": "app",
                        "image": "web:1",
                        "ports": [{"containerPort": 8080}],
                        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}},
                        "securityContext": {
                            "allowPrivilegeEscalation": false,
                            "runAsUser": 1000,
                            "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
                        },
                    }],
                    "volumes": [
                        {"name": "config", "configMap": {"name": "web"}},
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            }},
        });
        assert_eq!(check(Level::Restricted, &deployment), vec![]);
        assert_eq!(check(Level::Baseline, &deployment), vec![]);
    }

    #[test]
    fn windows_pods_are_exempt_only_where_the_reference_exempts_them() {
        let windows = pod(json!({"os": {"name": "windows"}, "containers": [{"name": "a"}]}));
        assert_eq!(
            check(Level::Restricted, &windows),
            vec![Violation {
                reason: "runAsNonRoot != true".into(),
                detail: r#"pod or container "a" must set securityContext.runAsNonRoot=true"#.into(),
            }]
        );
        let windows_non_root = pod(json!({
            "os": {"name": "windows"},
            "securityContext": {"runAsNonRoot": true},
            "containers": [{"name": "a"}],
        }));
        assert_eq!(check(Level::Restricted, &windows_non_root), vec![]);
    }

    #[test]
    fn privileged_level_checks_nothing() {
        assert!(check(Level::Privileged, &everything_forbidden()).is_empty());
    }

    #[test]
    fn message_reads_as_the_api_servers() {
        let violations = check(
            Level::Baseline,
            &pod(json!({
                "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
                "containers": [{"name": "a", "securityContext": {"privileged": true}}],
            })),
        );
        assert_eq!(
            message(Level::Baseline, &violations),
            r#"violates PodSecurity "baseline:latest": hostPath volumes (volume "root"), privileged (container "a" must not set securityContext.privileged=true)"#
        );
        assert_eq!(
            message(
                Level::Restricted,
                &[
                    Violation {
                        reason: "privileged".into(),
                        detail: r#"container "a" must not set securityContext.privileged=true"#
                            .into(),
                    },
                    Violation {
                        reason: "hostPath volumes".into(),
                        detail: r#"volume "root""#.into(),
                    },
                ]
            ),
            r#"violates PodSecurity "restricted:latest": privileged (container "a" must not set securityContext.privileged=true), hostPath volumes (volume "root")"#
        );
    }

    #[test]
    fn annotation_values_are_quoted_as_go_does() {
        let object = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"annotations": {
                "container.apparmor.security.beta.kubernetes.io/a": "un\"conf\\ined\n\u{7f}\u{a0}é",
            }},
        });
        assert_eq!(
            check(Level::Baseline, &object),
            vec![Violation {
                reason: "forbidden AppArmor profile".into(),
                detail: r#"annotation must not set AppArmor profile type to "container.apparmor.security.beta.kubernetes.io/a="un\"conf\\ined\n\x7f\u00a0é"""#.into(),
            }]
        );
    }

    #[rstest]
    #[case::null(json!(null))]
    #[case::pod_with_string_spec(pod(json!("spec")))]
    #[case::containers_not_a_list(pod(json!({"containers": "a", "volumes": 3, "securityContext": []})))]
    #[case::containers_of_every_type(pod(json!({"containers": [null, 1, "a", [], {"securityContext": "x"}]})))]
    #[case::fields_of_the_wrong_type(pod(json!({
        "hostNetwork": "true",
        "hostUsers": "false",
        "os": "windows",
        "securityContext": {"runAsNonRoot": "yes", "sysctls": [null, {"name": 5}], "seccompProfile": "RuntimeDefault"},
        "volumes": [null, {"name": 1, "hostPath": "/"}],
        "containers": [{
            "name": 7,
            "ports": [{"hostPort": "80"}, {"hostPort": 1.5}, null],
            "livenessProbe": {"httpGet": {"host": 1}},
            "lifecycle": "x",
            "securityContext": {"privileged": 1, "capabilities": {"add": [1, null], "drop": "ALL"}, "procMount": 3},
        }],
    })))]
    fn odd_input_never_panics(#[case] object: Value) {
        for level in [Level::Privileged, Level::Baseline, Level::Restricted] {
            let violations = check(level, &object);
            let _ = message(level, &violations);
        }
    }

    #[test]
    fn wrong_types_read_as_unset() {
        let object = pod(json!({
            "hostNetwork": "true",
            "securityContext": {"runAsNonRoot": "yes"},
            "containers": [{"name": "a", "securityContext": {"privileged": 1, "runAsNonRoot": true}}],
        }));
        assert_eq!(check(Level::Baseline, &object), vec![]);
    }

    #[rstest]
    #[case::privileged("privileged", Level::Privileged)]
    #[case::baseline("baseline", Level::Baseline)]
    #[case::restricted("restricted", Level::Restricted)]
    fn level_round_trips_through_its_label_value(#[case] label: &str, #[case] level: Level) {
        assert_eq!(label.parse::<Level>(), Ok(level));
        assert_eq!(level.to_string(), label);
    }

    #[rstest]
    #[case::capitalized("Restricted")]
    #[case::empty("")]
    #[case::unknown("strict")]
    fn level_refuses_other_words(#[case] label: &str) {
        let error = label.parse::<Level>().err().unwrap_or_default();
        assert!(
            error.contains("privileged, baseline, restricted"),
            "{error}"
        );
    }

    #[test]
    fn levels_are_ordered_by_strictness() {
        assert!(Level::Privileged < Level::Baseline && Level::Baseline < Level::Restricted);
        assert_eq!(ENFORCE_LABEL, "pod-security.kubernetes.io/enforce");
    }
}
