//! Prune: the children this resource controls that the render no longer returns, deleted, each
//! delete preconditioned on the child's uid.

use super::*;

/// A child to delete: where, its name, and the uid the delete is preconditioned on.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Stale {
    pub kind_key: String,
    pub name: String,
    pub uid: String,
}

/// The children `owner_uid` controls in `namespace` that the render no longer returns: those the
/// owner index lists, that the watch still shows controlled by it and not being deleted.
pub(crate) fn stale_children(
    owned: Vec<ChildId>,
    owner_uid: &str,
    namespace: &str,
    desired: &BTreeSet<(String, String)>,
    view: &impl View,
) -> Vec<Stale> {
    owned
        .into_iter()
        .filter(|(_, ns, _)| ns == namespace)
        .filter(|(key, _, name)| !desired.contains(&(key.clone(), name.clone())))
        .filter_map(|(key, ns, name)| {
            let live = view.live(&key, &ns, &name)?;
            let ours = controller_uid(&live) == Some(owner_uid);
            let uid = live.metadata.uid.clone()?;
            (ours && live.metadata.deletion_timestamp.is_none()).then_some(Stale {
                kind_key: key,
                name,
                uid,
            })
        })
        .collect()
}

/// What prune did.
#[derive(Debug, Default)]
pub(crate) struct Pruned {
    pub deleted: Vec<String>,
    pub failed: Vec<String>,
}

/// Deletes the stale children, each only if it still is the object we saw (uid precondition).
/// The candidates are the children the owner index lists, and those `seen` read from the API
/// server (a recorded child the store does not keep: see `read_name_only`).
pub(super) async fn prune(
    owner: &Owner,
    ctx: &KindCtx,
    desired: &BTreeSet<(String, String)>,
    reads: &WithReads<'_, Shared>,
) -> Pruned {
    let shared = &ctx.shared;
    let r = &owner.resource;
    let mut owned = lock(&shared.owned).owned_by(&r.uid);
    owned.extend(
        reads
            .read
            .keys()
            .filter(|id| !owned.contains(id))
            .cloned()
            .collect::<Vec<_>>(),
    );
    let mut pruned = Pruned::default();
    for stale in stale_children(owned, &r.uid, &r.namespace, desired, reads) {
        let Some(ar) = read(&shared.watched)
            .get(&stale.kind_key)
            .map(|w| w.ar.clone())
        else {
            continue;
        };
        let api: Api<LiveChild> = Api::namespaced_with(shared.client.clone(), &r.namespace, &ar);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(stale.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        let what = format!("{} {}", ar.kind, stale.name);
        match shared
            .write(
                "delete",
                &r.namespace,
                &ar,
                api.delete(&stale.name, &params),
            )
            .await
        {
            Ok(_) => {
                lock(&shared.applied).remove(&applied_key(&r.uid, &stale.kind_key, &stale.name));
                pruned.deleted.push(what);
            }
            // Already gone, or replaced by another object of that name: nothing of ours to delete.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => pruned.failed.push(format!("could not delete {what}: {e}")),
        }
    }
    pruned
}

#[cfg(test)]
mod tests {
    use super::super::plan::tests::{caches, key, live};
    use super::*;

    #[test]
    fn only_children_this_resource_controls_are_stale() {
        let mut c = caches();
        let ours = live("uid-old", Some(("Service", "web", "uid-web")));
        let theirs = live("uid-theirs", Some(("Service", "other", "uid-other")));
        c.live.insert(key("Ingress", "old"), ours);
        c.live.insert(key("Ingress", "theirs"), theirs);
        let owned = vec![
            key("Ingress", "old"),
            key("Ingress", "theirs"),
            key("Service", "web"),
            // Listed, but gone from the watch: nothing to delete.
            key("Ingress", "gone"),
        ];
        let desired = BTreeSet::from([("/Service".to_owned(), "web".to_owned())]);
        let stale = stale_children(owned, "uid-web", "ns", &desired, &c);
        assert_eq!(
            stale,
            vec![Stale {
                kind_key: "/Ingress".into(),
                name: "old".into(),
                uid: "uid-old".into()
            }]
        );
    }
}
