//! References checked against their author's rights, by the API server at admission.
//!
//! A plugin declares which fields of its Kinds' specs name another object of the resource's
//! namespace (contract 1.2): a Secret mounted, a ConfigMap read, a ServiceAccount the pods run
//! as. The operator would use any of them with its own rights; so a resource may name one only
//! if whoever creates or changes it could use it directly: `get` the Secret or ConfigMap, or
//! `create serviceaccounts/token` for the ServiceAccount (act as it). That is checked where the
//! requester is known, in the API server: for each Kind with references, a
//! ValidatingAdmissionPolicy whose CEL asks the `authorizer` about each name (Kubernetes 1.30
//! and later; no webhook server), and a binding that applies it everywhere.

use serde_json::{Value, json};

use crate::types::{KindInfo, Reference, ReferenceTarget};

/// The label on every policy and binding the host generates.
const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "wasm-operator");

/// The policies and bindings of each of `kinds` (those a registry serves) whose spec names other
/// objects: what `host admission` prints, the chart installs for the built-in plugins, and the
/// operator installs with a `Plugin`'s CRDs.
pub fn for_kinds<'a>(kinds: impl IntoIterator<Item = &'a KindInfo>) -> Vec<Value> {
    kinds.into_iter().filter_map(objects).flatten().collect()
}

/// The policy and its binding for `kind`, or none when its spec names no other object.
pub fn objects(kind: &KindInfo) -> Option<[Value; 2]> {
    if kind.references.is_empty() {
        return None;
    }
    let name = format!("references.{}.{}", kind.plural, kind.group);
    let validations: Vec<Value> = kind
        .references
        .iter()
        .map(|r| {
            json!({
                "expression": expression(r),
                "message": message(r),
                "reason": "Forbidden",
            })
        })
        .collect();
    // Whether the requester may use every object of a kind in the namespace: asked once per
    // request (a variable is evaluated once), and the names asked one by one only when not. An
    // authorizer check is expensive in CEL's cost model (two fit in one expression's budget), so
    // without this an admin naming three Secrets in one list would be refused for the cost.
    let variables: Vec<Value> = TARGETS
        .iter()
        .filter(|t| kind.references.iter().any(|r| r.target == **t))
        .map(|t| {
            json!({
                "name": variable(*t),
                "expression": check(*t, None),
            })
        })
        .collect();
    let labels = json!({ MANAGED_BY.0: MANAGED_BY.1 });
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": { "name": name, "labels": labels },
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [{
                    "apiGroups": [kind.group],
                    "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": [kind.plural],
                }],
            },
            // A change of metadata alone (labels, finalizers, the garbage collector's) or of a
            // resource being deleted makes the operator use nothing new: not checked.
            "matchConditions": [{
                "name": "spec-created-or-changed",
                "expression": "request.operation == 'CREATE' || (!has(object.metadata.deletionTimestamp) && (has(object.spec) != has(oldObject.spec) || (has(object.spec) && object.spec != oldObject.spec)))",
            }],
            "variables": variables,
            "validations": validations,
        },
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": { "name": name, "labels": labels },
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
        },
    });
    Some([policy, binding])
}

/// What a reference to `target` asks of the requester: the resource, its subresource (or ""),
/// the verb, and the object and the right in words.
fn right(target: ReferenceTarget) -> [&'static str; 5] {
    match target {
        ReferenceTarget::Secret => ["secrets", "", "get", "a Secret", "get"],
        ReferenceTarget::ConfigMap => ["configmaps", "", "get", "a ConfigMap", "get"],
        ReferenceTarget::ServiceAccount => [
            "serviceaccounts",
            "token",
            "create",
            "a ServiceAccount",
            "act as",
        ],
    }
}

/// What the requester must be allowed, as a sentence for the refusal.
fn message(r: &Reference) -> String {
    let [resource, subresource, verb, what, may] = right(r.target);
    let resource = if subresource.is_empty() {
        resource.to_owned()
    } else {
        format!("{resource}/{subresource}")
    };
    format!(
        "{} names {what} you may not {may} yourself ({verb} {resource}, for that name in this namespace), which the operator would use for you",
        r.path
    )
}

/// Every kind of object a reference may name.
const TARGETS: [ReferenceTarget; 3] = [
    ReferenceTarget::Secret,
    ReferenceTarget::ConfigMap,
    ReferenceTarget::ServiceAccount,
];

/// The policy variable saying whether the requester may use every object of `target`'s kind in
/// the namespace.
fn variable(target: ReferenceTarget) -> &'static str {
    match target {
        ReferenceTarget::Secret => "allSecrets",
        ReferenceTarget::ConfigMap => "allConfigMaps",
        ReferenceTarget::ServiceAccount => "allServiceAccounts",
    }
}

/// The CEL that holds when every name at the reference's path is one the requester may use:
/// all of that kind in the namespace (the policy's variable), or each name.
pub fn expression(r: &Reference) -> String {
    let segments: Vec<&str> = r.path.split('.').collect();
    let mut depth = 0;
    let each = all("object", segments.as_slice(), &mut depth, &|name: &str| {
        check(r.target, Some(name))
    });
    format!("variables.{} || ({each})", variable(r.target))
}

/// `pred` for every value at `path` under `base` (a CEL expression), absent fields and lists
/// holding vacuously.
fn all(base: &str, path: &[&str], depth: &mut usize, pred: &dyn Fn(&str) -> String) -> String {
    let Some((first, rest)) = path.split_first() else {
        return pred(base);
    };
    let (field, list) = match first.strip_suffix("[]") {
        Some(field) => (field, true),
        None => (*first, false),
    };
    let at = format!("{base}.{}", escape(field));
    let present = format!("has({at})");
    if list {
        let item = format!("x{depth}");
        *depth += 1;
        let inner = all(&item, rest, depth, pred);
        format!("!{present} || {at}.all({item}, {inner})")
    } else {
        let inner = all(&at, rest, depth, pred);
        format!("!{present} || ({inner})")
    }
}

/// Asks the authorizer whether the requester may use the object `name` (a CEL string), or with
/// none, every object of the kind in the namespace.
fn check(target: ReferenceTarget, name: Option<&str>) -> String {
    let [resource, subresource, verb, _, _] = right(target);
    let subresource = if subresource.is_empty() {
        String::new()
    } else {
        format!(".subresource('{subresource}')")
    };
    let name = name.map(|n| format!(".name({n})")).unwrap_or_default();
    format!(
        "authorizer.group('').resource('{resource}'){subresource}.namespace(object.metadata.namespace){name}.check('{verb}').allowed()"
    )
}

/// A field name as CEL in Kubernetes names it: reserved words and characters CEL identifiers
/// cannot hold are escaped (`namespace` is `__namespace__`, `-` is `__dash__`).
fn escape(field: &str) -> String {
    const RESERVED: [&str; 18] = [
        "as",
        "break",
        "const",
        "continue",
        "else",
        "false",
        "for",
        "function",
        "if",
        "import",
        "in",
        "let",
        "loop",
        "package",
        "namespace",
        "null",
        "return",
        "var",
    ];
    const MORE_RESERVED: [&str; 3] = ["true", "void", "while"];
    if RESERVED.contains(&field) || MORE_RESERVED.contains(&field) {
        return format!("__{field}__");
    }
    field
        .replace("__", "__underscores__")
        .replace('.', "__dot__")
        .replace('-', "__dash__")
        .replace('/', "__slash__")
}

/// Checks a declared reference's path: `spec.` first, then field names, each optionally
/// followed by `[]` (every item of a list).
pub fn check_path(path: &str) -> Result<(), String> {
    let mut segments = path.split('.');
    if segments.next() != Some("spec") {
        return Err(format!("reference `{path}` must start with `spec.`"));
    }
    let mut any = false;
    for s in segments {
        any = true;
        let field = s.strip_suffix("[]").unwrap_or(s);
        let ok = field.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && field
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !ok {
            return Err(format!(
                "reference `{path}`: `{s}` is not a field name (a letter or `_`, then letters, digits, `_`, `-`), optionally followed by `[]`"
            ));
        }
    }
    if !any {
        return Err(format!("reference `{path}` names no field of the spec"));
    }
    if path.ends_with("[]") {
        return Err(format!(
            "reference `{path}` must end with the field holding the name, not a list"
        ));
    }
    Ok(())
}

/// `node`, or the Kubernetes type it names by `$ref`, as a CRD inlines it.
fn resolved<'a>(node: &'a Value, path: &str) -> Result<&'a Value, String> {
    match node.get("$ref").and_then(Value::as_str) {
        Some(r) => crate::kube_schema::inlined(r).ok_or_else(|| {
            format!(
                "reference `{path}`: the spec's schema names {r}, which is not a Kubernetes type this host knows"
            )
        }),
        None => Ok(node),
    }
}

/// Checks that the field a reference's path (already checked by [`check_path`]) names is in the
/// Kind's spec `schema`, as a string, each `[]` on an array: a reference to a field the API
/// server prunes would check nothing, and one through a non-list would fail. A Kubernetes type
/// the schema names by `$ref` is followed as the CRD inlines it.
pub fn in_schema(schema: &Value, path: &str) -> Result<(), String> {
    let resolve = |node| resolved(node, path);
    let mut node = resolve(schema)?;
    for segment in path.split('.').skip(1) {
        let (field, list) = match segment.strip_suffix("[]") {
            Some(field) => (field, true),
            None => (segment, false),
        };
        if node.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
            && node.get("properties").is_none()
        {
            return Err(format!(
                "reference `{path}`: `{field}` is under a field whose schema keeps unknown fields; declare its schema"
            ));
        }
        node = resolve(
            node.get("properties")
                .and_then(|p| p.get(field))
                .ok_or_else(|| {
                    format!("reference `{path}`: the spec's schema has no `{field}` there")
                })?,
        )?;
        if list {
            if node.get("type").and_then(Value::as_str) != Some("array") {
                return Err(format!(
                    "reference `{path}`: `{field}` is not an array in the spec's schema"
                ));
            }
            node = resolve(node.get("items").unwrap_or(&Value::Null))?;
        }
    }
    if node.get("type").and_then(Value::as_str) == Some("string") {
        Ok(())
    } else {
        Err(format!(
            "reference `{path}`: the field is not a string in the spec's schema"
        ))
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    fn reference(path: &str, target: ReferenceTarget) -> Reference {
        Reference {
            path: path.into(),
            target,
        }
    }

    #[rstest]
    #[case::a_plain_field(
        "spec.serviceAccountName",
        ReferenceTarget::ServiceAccount,
        "!has(object.spec) || (!has(object.spec.serviceAccountName) || (authorizer.group('').resource('serviceaccounts').subresource('token').namespace(object.metadata.namespace).name(object.spec.serviceAccountName).check('create').allowed()))"
    )]
    #[case::a_list(
        "spec.envFrom[].secretRef.name",
        ReferenceTarget::Secret,
        "!has(object.spec) || (!has(object.spec.envFrom) || object.spec.envFrom.all(x0, !has(x0.secretRef) || (!has(x0.secretRef.name) || (authorizer.group('').resource('secrets').namespace(object.metadata.namespace).name(x0.secretRef.name).check('get').allowed()))))"
    )]
    #[case::lists_in_lists(
        "spec.sidecars[].env[].valueFrom.configMapKeyRef.name",
        ReferenceTarget::ConfigMap,
        "!has(object.spec) || (!has(object.spec.sidecars) || object.spec.sidecars.all(x0, !has(x0.env) || x0.env.all(x1, !has(x1.valueFrom) || (!has(x1.valueFrom.configMapKeyRef) || (!has(x1.valueFrom.configMapKeyRef.name) || (authorizer.group('').resource('configmaps').namespace(object.metadata.namespace).name(x1.valueFrom.configMapKeyRef.name).check('get').allowed()))))))"
    )]
    #[case::a_reserved_word(
        "spec.namespace",
        ReferenceTarget::Secret,
        "!has(object.spec) || (!has(object.spec.__namespace__) || (authorizer.group('').resource('secrets').namespace(object.metadata.namespace).name(object.spec.__namespace__).check('get').allowed()))"
    )]
    fn each_name_at_the_path_is_asked_of_the_authorizer(
        #[case] path: &str,
        #[case] target: ReferenceTarget,
        #[case] cel: &str,
    ) {
        let variable = match target {
            ReferenceTarget::Secret => "allSecrets",
            ReferenceTarget::ConfigMap => "allConfigMaps",
            ReferenceTarget::ServiceAccount => "allServiceAccounts",
        };
        assert_eq!(
            expression(&reference(path, target)),
            format!("variables.{variable} || ({cel})")
        );
    }

    #[rstest]
    #[case::a_string("spec.serviceAccountName", Ok(()))]
    #[case::through_a_list("spec.envFrom[].secretRef.name", Ok(()))]
    #[case::missing("spec.nothing", Err("has no `nothing` there"))]
    #[case::a_list_without_brackets("spec.envFrom.secretRef.name", Err("has no `secretRef` there"))]
    #[case::brackets_on_an_object(
        "spec.envFrom[].secretRef[].name",
        Err("`secretRef` is not an array")
    )]
    #[case::not_a_string("spec.envFrom[].secretRef", Err("not a string"))]
    fn paths_must_name_a_string_of_the_schema(
        #[case] path: &str,
        #[case] expected: Result<(), &str>,
    ) {
        let schema = serde_json::json!({ "type": "object", "properties": {
            "serviceAccountName": { "type": "string" },
            "envFrom": { "type": "array", "items": { "type": "object", "properties": {
                "secretRef": { "type": "object", "properties": { "name": { "type": "string" } } } } } },
        } });
        match (in_schema(&schema, path), expected) {
            (Ok(()), Ok(())) => {}
            (Err(e), Err(want)) => assert!(e.contains(want), "{e}"),
            (got, want) => panic!("{path}: {got:?}, expected {want:?}"),
        }
    }

    #[rstest]
    #[case::good("spec.envFrom[].secretRef.name", true)]
    #[case::not_under_spec("metadata.name", false)]
    #[case::only_spec("spec", false)]
    #[case::ending_in_a_list("spec.imagePullSecrets[]", false)]
    #[case::empty_field("spec..name", false)]
    #[case::odd_characters("spec.a/b", false)]
    #[case::a_digit_first("spec.1name", false)]
    fn paths_are_checked(#[case] path: &str, #[case] ok: bool) {
        assert_eq!(check_path(path).is_ok(), ok, "{:?}", check_path(path));
    }
}
