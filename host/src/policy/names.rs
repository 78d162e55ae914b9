//! Names a plugin gives in `describe` are checked as the API server checks a
//! CustomResourceDefinition's, when the plugin is loaded: its groups, versions, kinds, plurals
//! and short names, and the group, version and kind of each child it declares. The host makes
//! CRD names, file names (`host crds --output-dir`), RBAC rules and watch paths out of them, so a
//! plural such as `../../x` must never get past loading.

use guest_kit::spec::{dns_label, dns_subdomain};

use crate::types::PluginInfo;

/// Checks every name of a plugin's description; the error names the Kind and the field.
pub fn check(info: &PluginInfo) -> Result<(), String> {
    for k in &info.kinds {
        let at = |field: &str| format!("Kind `{}`: {field}", k.kind);
        group(&k.group).map_err(|e| format!("{}: {e}", at("group")))?;
        kind(&k.kind).map_err(|e| format!("{}: {e}", at("kind")))?;
        label(&k.plural).map_err(|e| format!("{}: {e}", at("plural")))?;
        // The CRD's own name, `plural.group`, is a DNS subdomain too (at most 253 characters).
        let crd = format!("{}.{}", k.plural, k.group);
        subdomain(&crd).map_err(|e| format!("{}: {e}", at("CRD name")))?;
        for v in &k.versions {
            label(v).map_err(|e| format!("{}: {e}", at("version")))?;
        }
        for s in &k.short_names {
            label(s).map_err(|e| format!("{}: {e}", at("short name")))?;
        }
    }
    for c in &info.children {
        let at = |field: &str| format!("child kind `{}`: {field}", c.kind);
        if !c.group.is_empty() {
            subdomain(&c.group).map_err(|e| format!("{}: {e}", at("group")))?;
        }
        label(&c.version).map_err(|e| format!("{}: {e}", at("version")))?;
        kind(&c.kind).map_err(|e| format!("{}: {e}", at("kind")))?;
    }
    Ok(())
}

/// A DNS-1035 label: what the API server requires of a plural, a short name and a version.
fn label(value: &str) -> Result<(), String> {
    dns_label("", value).map_err(|e| e.message)
}

/// A DNS-1123 subdomain.
fn subdomain(value: &str) -> Result<(), String> {
    dns_subdomain("", value).map_err(|e| e.message)
}

/// A CRD's group: a DNS-1123 subdomain with at least one dot (the API server refuses others).
fn group(value: &str) -> Result<(), String> {
    subdomain(value)?;
    if value.contains('.') {
        Ok(())
    } else {
        Err(format!(
            "`{value}` should be a domain with at least one dot"
        ))
    }
}

/// A kind may be in mixed case, and must otherwise be a DNS-1035 label.
fn kind(value: &str) -> Result<(), String> {
    label(&value.to_ascii_lowercase())
        .map_err(|e| format!("may have mixed case, but should otherwise match: {e}"))
}

#[cfg(test)]
mod tests {
    use rstest::rstest;
    use serde_json::json;

    use super::*;
    use crate::types::{GroupVersionKind, KindInfo};

    fn info(group: &str, kind: &str, plural: &str, version: &str, short: &str) -> PluginInfo {
        PluginInfo {
            name: "p".into(),
            version: "0.1.0".into(),
            kinds: vec![KindInfo {
                group: group.into(),
                versions: vec![version.into()],
                kind: kind.into(),
                plural: plural.into(),
                short_names: if short.is_empty() {
                    vec![]
                } else {
                    vec![short.into()]
                },
                engine: None,
                spec_schema: json!({"type": "object"}),
                printer_columns: vec![],
                status_schema: None,
                references: vec![],
            }],
            children: vec![GroupVersionKind {
                group: "apps".into(),
                version: "v1".into(),
                kind: "Deployment".into(),
            }],
        }
    }

    #[rstest]
    #[case::plain("example.com", "Widget", "widgets", "v1", "wd")]
    #[case::mixed_case_kind("example.com", "HanzoService", "hanzoservices", "v1alpha1", "")]
    #[case::deep_group("kms.hanzo.ai", "KMSSecret", "kmssecrets", "v1", "")]
    fn names_the_api_server_accepts_load(
        #[case] group: &str,
        #[case] kind: &str,
        #[case] plural: &str,
        #[case] version: &str,
        #[case] short: &str,
    ) {
        assert_eq!(check(&info(group, kind, plural, version, short)), Ok(()));
    }

    #[rstest]
    #[case::plural_climbing_out("example.com", "Widget", "../../../x", "v1", "", "plural")]
    #[case::plural_with_slash("example.com", "Widget", "a/b", "v1", "", "plural")]
    #[case::plural_with_dot("example.com", "Widget", "wid.gets", "v1", "", "plural")]
    #[case::plural_starting_with_digit("example.com", "Widget", "1widgets", "v1", "", "plural")]
    #[case::group_without_dot("example", "Widget", "widgets", "v1", "", "group")]
    #[case::group_with_slash("example.com/x", "Widget", "widgets", "v1", "", "group")]
    #[case::group_in_upper_case("Example.com", "Widget", "widgets", "v1", "", "group")]
    #[case::kind_with_slash("example.com", "Wid/get", "widgets", "v1", "", "kind")]
    #[case::kind_with_dot("example.com", "Wid.get", "widgets", "v1", "", "kind")]
    #[case::empty_kind("example.com", "", "widgets", "v1", "", "kind")]
    #[case::version_with_dot("example.com", "Widget", "widgets", "v1.0", "", "version")]
    #[case::short_name_with_slash("example.com", "Widget", "widgets", "v1", "w/d", "short name")]
    fn names_the_api_server_refuses_fail_naming_the_field(
        #[case] group: &str,
        #[case] kind: &str,
        #[case] plural: &str,
        #[case] version: &str,
        #[case] short: &str,
        #[case] field: &str,
    ) {
        let e = check(&info(group, kind, plural, version, short)).unwrap_err();
        assert!(e.contains(&format!(": {field}: ")), "{e}");
    }

    #[test]
    fn a_crd_name_over_253_characters_fails() {
        let group = format!("{}.com", vec!["a".repeat(60); 4].join("."));
        let e = check(&info(&group, "Widget", "widgets", "v1", "")).unwrap_err();
        assert!(e.contains("CRD name"), "{e}");
    }

    #[rstest]
    #[case::group("apps/../..", "v1", "Deployment", "group")]
    #[case::version("apps", "v1/x", "Deployment", "version")]
    #[case::kind("apps", "v1", "Deploy ment", "kind")]
    fn child_kinds_are_checked_too(
        #[case] group: &str,
        #[case] version: &str,
        #[case] kind: &str,
        #[case] field: &str,
    ) {
        let mut i = info("example.com", "Widget", "widgets", "v1", "");
        i.children = vec![GroupVersionKind {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
        }];
        let e = check(&i).unwrap_err();
        assert!(e.starts_with("child kind") && e.contains(field), "{e}");
    }

    #[test]
    fn the_core_group_of_a_child_is_empty_and_fine() {
        let mut i = info("example.com", "Widget", "widgets", "v1", "");
        i.children[0].group = String::new();
        i.children[0].kind = "ConfigMap".into();
        assert_eq!(check(&i), Ok(()));
    }
}
