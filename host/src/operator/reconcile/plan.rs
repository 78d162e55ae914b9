//! Plan: per rendered child, create, update, leave as it is, or refuse (an object this resource
//! does not control). It only reads the caches ([`View`]), so it is unit-tested on its own.

use super::*;

/// What the plan reads of the operator's caches (the shared state, or a test's maps).
pub(crate) trait View {
    /// Where children of `group/version/Kind` are applied, or why they cannot be.
    fn target(&self, gvk: &str) -> Option<Result<ApiResource, Unserved>>;
    /// The live object of kind `group/Kind` in `namespace` named `name`, as the watch shows it.
    fn live(&self, kind_key: &str, namespace: &str, name: &str) -> Option<Arc<LiveChild>>;
    /// What our last apply of the child with this key left.
    fn applied(&self, key: &str) -> Option<Applied>;
    /// Whether the watch of kind `group/Kind` that sees `namespace` has listed: before, an
    /// object it does not show may still exist.
    fn listed(&self, kind_key: &str, namespace: &str) -> bool;
    /// Whether the watch of kind `group/Kind` knows an object `name` in `namespace` by name
    /// only (not ours, or another shard's) and this view does not show it: it exists, and must
    /// be read before anything is applied to its name. `Some` of its version's hash.
    fn name_only(&self, kind_key: &str, namespace: &str, name: &str) -> Option<u64>;
}

impl View for Shared {
    fn target(&self, gvk: &str) -> Option<Result<ApiResource, Unserved>> {
        read(&self.targets).get(gvk).cloned()
    }

    fn live(&self, kind_key: &str, namespace: &str, name: &str) -> Option<Arc<LiveChild>> {
        read(&self.watched).get(kind_key)?.get(namespace, name)
    }

    fn applied(&self, key: &str) -> Option<Applied> {
        lock(&self.applied).get(key).cloned()
    }

    fn listed(&self, kind_key: &str, namespace: &str) -> bool {
        read(&self.watched)
            .get(kind_key)
            .is_some_and(|w| w.listed(namespace))
    }

    fn name_only(&self, kind_key: &str, namespace: &str, name: &str) -> Option<u64> {
        read(&self.watched)
            .get(kind_key)?
            .name_only(namespace, name)
    }
}

/// A view with the objects its watches know by name only read from the API server
/// (`read_name_only`): what one reconciliation plans and prunes with.
pub(crate) struct WithReads<'a, V> {
    pub view: &'a V,
    /// Each object read: as the API server returned it, or `None` when it was gone.
    pub read: BTreeMap<ChildId, Option<Arc<LiveChild>>>,
    /// The version the watch knew each of them at just before it was read.
    pub known: BTreeMap<ChildId, Option<u64>>,
}

impl<V: View> View for WithReads<'_, V> {
    fn target(&self, gvk: &str) -> Option<Result<ApiResource, Unserved>> {
        self.view.target(gvk)
    }

    fn live(&self, kind_key: &str, namespace: &str, name: &str) -> Option<Arc<LiveChild>> {
        self.view.live(kind_key, namespace, name).or_else(|| {
            self.read
                .get(&(kind_key.to_owned(), namespace.to_owned(), name.to_owned()))
                .cloned()
                .flatten()
        })
    }

    fn applied(&self, key: &str) -> Option<Applied> {
        self.view.applied(key)
    }

    fn listed(&self, kind_key: &str, namespace: &str) -> bool {
        self.view.listed(kind_key, namespace)
    }

    fn name_only(&self, kind_key: &str, namespace: &str, name: &str) -> Option<u64> {
        let id = (kind_key.to_owned(), namespace.to_owned(), name.to_owned());
        let now = self.view.name_only(kind_key, namespace, name);
        match self.read.get(&id) {
            // Read as gone, and the watch has shown an object of that name since: one more to
            // read (it is never created over).
            Some(None) if now.is_some() && now != self.known.get(&id).copied().flatten() => now,
            // Read: this view shows what was read (an update of it is guarded by its uid).
            Some(_) => None,
            None => now,
        }
    }
}

/// How a planned child is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Write {
    /// Left as it is: the live object is what we last applied.
    Skip,
    /// Created: no object of its kind and name exists.
    Create,
    /// Applied over the object with this uid, which this resource controls (or adopts).
    Update { uid: String },
}

/// One rendered child, and what to do with it.
#[derive(Debug)]
pub(crate) struct Planned {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    /// Where it is applied.
    pub ar: ApiResource,
    /// The object to apply, stamped with our owner reference and labels.
    pub child: Value,
    pub hash: u64,
    /// Its key in `Shared::applied`.
    pub cache_key: String,
    pub write: Write,
    /// Whether writing it changes it (for the `Applied` event).
    pub changed: bool,
    /// What our last apply of it left (in memory, else in the resource's status).
    pub previous: Option<Applied>,
    /// For a child left as it is whose readiness counts, the watch's copy.
    pub live: Option<Arc<LiveChild>>,
}

/// A rendered child whose object exists and is not this resource's to take.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Conflict {
    pub id: ChildId,
    pub api_version: String,
    pub kind: String,
    pub name: String,
    /// Who controls it: `Kind name`, or `nobody`.
    pub holder: String,
    /// The uid of the object in the way, as the plan saw it.
    pub uid: Option<String>,
}

impl Conflict {
    pub(super) fn message(&self, owner: &Owner) -> String {
        if self.holder == "nobody" {
            format!(
                "{} {} exists and no controller owns it (made by hand?); it is left alone. Delete or rename it, or, as whoever may edit it, let {} adopt it: kubectl annotate {} {} {ADOPT_BY_ANNOTATION}={}",
                self.kind,
                self.name,
                owner.display(),
                self.kind.to_lowercase(),
                self.name,
                owner.handle
            )
        } else {
            format!(
                "{} {} is controlled by {}; it is left alone",
                self.kind, self.name, self.holder
            )
        }
    }
}

/// What one reconciliation will do.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub children: Vec<Planned>,
    /// Children not applied: their kind is not declared or not served.
    pub skipped: Vec<Skipped>,
    /// Children not applied: another controls the object, or nobody does.
    pub conflicts: Vec<Conflict>,
    /// Children not created yet: the watch of their kind has not listed, so whether an object
    /// of that name exists is not known.
    pub unknown: Vec<String>,
    /// Children not created yet: an object of that name, which the watch knows by name only,
    /// appeared after the reads before the plan (`read_name_only`).
    pub appeared: Vec<String>,
    /// Every rendered child, by kind key and name: what prune keeps.
    pub desired: BTreeSet<(String, String)>,
}

/// Decides, for each rendered object, whether to create it, update it, leave it as it is, or
/// refuse it (its kind is not served, or its object is not ours to take).
pub(crate) fn plan(objects: Vec<Value>, owner: &Owner, view: &impl View) -> Plan {
    let r = &owner.resource;
    let mut plan = Plan::default();
    for mut child in objects {
        let (api_version, kind, name) = crate::ownership::identity(&child);
        let key = kind_key(&api_version, &kind);
        plan.desired.insert((key.clone(), name.clone()));
        let ar = match view.target(&gvk_key(&api_version, &kind)) {
            Some(Ok(ar)) => ar,
            found => {
                let reason = match found {
                    Some(Err(why)) => why.to_string(),
                    _ => "not a declared child kind".to_owned(),
                };
                plan.skipped.push(Skipped {
                    api_version,
                    kind,
                    name,
                    reason,
                });
                continue;
            }
        };
        crate::ownership::stamp_child(&mut child, &r.api_version, &r.kind, &r.name, &r.uid);
        if let Some(shard) = owner.shard {
            child["metadata"]["labels"][super::super::shard::SHARD_LABEL] =
                shard.to_string().into();
        }
        let h = hash(&child);
        let cache_key = applied_key(&r.uid, &key, &name);
        let live = view.live(&key, &r.namespace, &name);
        // In memory: what this process applied. In the resource's status: what an earlier
        // process did, which says whether a live object is unchanged, never that one the watch
        // does not show exists.
        let remembered = view.applied(&cache_key);
        let previous = remembered
            .clone()
            .or_else(|| owner.recorded.get(&(key.clone(), name.clone())).cloned());
        let write = match live.as_deref() {
            Some(l) => match (
                control(&l.metadata, &r.uid),
                owner.adopt || consents(l.annotations.get(ADOPT_BY_ANNOTATION), &owner.handle),
            ) {
                (Control::Us, _) | (Control::Nobody, true) => {
                    if unchanged(&child, h, previous.as_ref(), Some(l)) {
                        Write::Skip
                    } else {
                        Write::Update {
                            uid: l.metadata.uid.clone().unwrap_or_default(),
                        }
                    }
                }
                (Control::Other(by), _) => {
                    plan.conflicts.push(Conflict {
                        id: (key, r.namespace.clone(), name.clone()),
                        api_version,
                        kind,
                        name,
                        holder: format!("{} {}", by.kind, by.name),
                        uid: l.metadata.uid.clone(),
                    });
                    continue;
                }
                (Control::Nobody, false) => {
                    plan.conflicts.push(Conflict {
                        id: (key, r.namespace.clone(), name.clone()),
                        api_version,
                        kind,
                        name,
                        holder: "nobody".into(),
                        uid: l.metadata.uid.clone(),
                    });
                    continue;
                }
            },
            // An object the watch knows by name only, not read (it appeared since the reads):
            // never created over.
            None if view.name_only(&key, &r.namespace, &name).is_some() => {
                plan.appeared.push(format!(
                    "{kind} {name}: an object of that name appeared before it was created; looking again"
                ));
                continue;
            }
            // A child we applied that the watch has not shown yet is not applied again: a
            // deletion of it is seen by the watch, which then forgets the apply.
            None if remembered.is_some_and(|p| p.hash == h) => Write::Skip,
            None if !view.listed(&key, &r.namespace) => {
                plan.unknown.push(format!("{kind} {name}"));
                continue;
            }
            None => Write::Create,
        };
        let changed = previous.as_ref().is_none_or(|p| p.hash != h) || live.is_none();
        // A child left as it is reports readiness from the watch's copy.
        let live = live.filter(|_| write == Write::Skip && status::reports_readiness(&kind));
        plan.children.push(Planned {
            api_version,
            kind,
            name,
            ar,
            child,
            hash: h,
            cache_key,
            write,
            changed,
            previous,
            live,
        });
    }
    plan
}

pub(super) fn hash(v: &Value) -> u64 {
    let mut h = DefaultHasher::new();
    v.to_string().hash(&mut h);
    h.finish()
}

/// Whether the live child still is what we last applied: same desired object, our labels and
/// annotations in place, our owner reference, the same object (uid), and no spec change since (its generation, or its
/// resourceVersion for kinds without one).
pub(super) fn unchanged(
    desired: &Value,
    hash: u64,
    applied: Option<&Applied>,
    live: Option<&LiveChild>,
) -> bool {
    let (Some(applied), Some(live)) = (applied, live) else {
        return false;
    };
    if applied.hash != hash {
        return false;
    }
    let subset = |want: &Value, have: &Pairs| {
        want.as_object()
            .is_none_or(|w| w.iter().all(|(k, v)| have.get(k) == v.as_str()))
    };
    if !subset(&desired["metadata"]["labels"], &live.labels)
        || !subset(&desired["metadata"]["annotations"], &live.annotations)
    {
        return false;
    }
    let uid = desired["metadata"]["ownerReferences"][0]["uid"].as_str();
    if controller_uid(live) != uid {
        return false;
    }
    // The object we applied, not another made since under its name (a record without a uid,
    // from an older operator, is written again once).
    if applied.uid.is_none() || live.metadata.uid != applied.uid {
        return false;
    }
    match applied.generation {
        Some(g) => live.metadata.generation == Some(g),
        None => live.metadata.resource_version == applied.resource_version,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The caches as a test sets them.
    #[derive(Default)]
    pub(crate) struct Caches {
        pub(crate) targets: BTreeMap<String, Result<ApiResource, Unserved>>,
        pub(crate) live: BTreeMap<(String, String, String), Arc<LiveChild>>,
        pub(crate) applied: BTreeMap<String, Applied>,
        pub(crate) unlisted: BTreeSet<String>,
        pub(crate) name_only: BTreeMap<(String, String, String), u64>,
    }

    impl View for Caches {
        fn target(&self, gvk: &str) -> Option<Result<ApiResource, Unserved>> {
            self.targets.get(gvk).cloned()
        }
        fn live(&self, kind_key: &str, namespace: &str, name: &str) -> Option<Arc<LiveChild>> {
            self.live
                .get(&(kind_key.into(), namespace.into(), name.into()))
                .cloned()
        }
        fn applied(&self, key: &str) -> Option<Applied> {
            self.applied.get(key).cloned()
        }
        fn listed(&self, kind_key: &str, _namespace: &str) -> bool {
            !self.unlisted.contains(kind_key)
        }
        fn name_only(&self, kind_key: &str, namespace: &str, name: &str) -> Option<u64> {
            self.name_only
                .get(&(kind_key.into(), namespace.into(), name.into()))
                .copied()
        }
    }

    fn ar(api_version: &str, kind: &str, plural: &str) -> ApiResource {
        let (group, version) = crate::gvk::split_api_version(api_version);
        ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: api_version.into(),
            kind: kind.into(),
            plural: plural.into(),
        }
    }

    pub(crate) fn caches() -> Caches {
        let mut c = Caches::default();
        c.targets
            .insert("/v1/Service".into(), Ok(ar("v1", "Service", "services")));
        c.targets.insert(
            "apps/v1/Deployment".into(),
            Ok(ar("apps/v1", "Deployment", "deployments")),
        );
        c.targets.insert(
            "monitoring.coreos.com/v1/ServiceMonitor".into(),
            Err(Unserved::NotServed {
                api_version: "monitoring.coreos.com/v1".into(),
                kind: "ServiceMonitor".into(),
            }),
        );
        c
    }

    fn owner(adopt: bool) -> Owner {
        let mut annotations = BTreeMap::new();
        if adopt {
            annotations.insert(
                crate::ownership::ADOPT_ANNOTATION.to_owned(),
                "true".to_owned(),
            );
        }
        Owner {
            resource: PluginResource {
                api_version: "hanzo.ai/v1".into(),
                kind: "Service".into(),
                name: "web".into(),
                namespace: "ns".into(),
                uid: "uid-web".into(),
                generation: 1,
                labels: BTreeMap::new(),
                annotations,
                spec: json!({}),
            },
            controller_kind: "hanzo.ai/v1/Service".into(),
            adopt,
            handle: handle("services", "hanzo.ai", "web"),
            recorded: BTreeMap::new(),
            last_children: Vec::new(),
            shard: None,
        }
    }

    fn service(name: &str) -> Value {
        json!({ "apiVersion": "v1", "kind": "Service", "metadata": { "name": name, "namespace": "ns" } })
    }

    pub(crate) fn live(uid: &str, controller: Option<(&str, &str, &str)>) -> Arc<LiveChild> {
        let refs: Vec<Value> = controller
            .into_iter()
            .map(|(kind, name, uid)| {
                json!({ "apiVersion": "x/v1", "kind": kind, "name": name, "uid": uid, "controller": true })
            })
            .collect();
        Arc::new(
            serde_json::from_value(json!({
                "metadata": { "name": "web", "namespace": "ns", "uid": uid, "resourceVersion": "7",
                    "ownerReferences": refs,
                    "labels": { crate::ownership::OWNER_LABEL: "uid-web", "app.kubernetes.io/managed-by": "wasm-operator" } },
            }))
            .unwrap(),
        )
    }

    pub(crate) fn key(kind: &str, name: &str) -> (String, String, String) {
        (format!("/{kind}"), "ns".into(), name.into())
    }

    #[test]
    fn a_child_that_does_not_exist_is_created() {
        let plan = plan(vec![service("web")], &owner(false), &caches());
        assert_eq!(plan.children.len(), 1);
        assert_eq!(plan.children[0].write, Write::Create);
        assert!(plan.conflicts.is_empty());
        let body = guarded(&plan.children[0]);
        assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], "uid-web");
        assert_eq!(body["metadata"]["ownerReferences"][0]["controller"], true);
        // The API server accepts no uid on create.
        assert!(body["metadata"].get("uid").is_none());
    }

    #[test]
    fn nothing_is_created_before_the_watch_of_its_kind_has_listed() {
        let mut c = caches();
        c.unlisted.insert("/Service".into());
        let plan = plan(vec![service("web")], &owner(false), &c);
        assert!(plan.children.is_empty());
        assert_eq!(plan.unknown, vec!["Service web".to_owned()]);
    }

    #[test]
    fn an_object_the_watch_knows_by_name_only_is_read_before_anything_is_applied_to_it() {
        let mut c = caches();
        // Known at version 1 when it was read.
        c.name_only.insert(key("Service", "web"), 1);
        let plan_of = |c: &Caches, read: Option<Arc<LiveChild>>| {
            let seen = WithReads {
                view: c,
                read: BTreeMap::from([(key("Service", "web"), read)]),
                known: BTreeMap::from([(key("Service", "web"), Some(1))]),
            };
            plan(vec![service("web")], &owner(false), &seen)
        };
        // Not read: nothing is created over it.
        let unread = plan(vec![service("web")], &owner(false), &c);
        assert!(unread.children.is_empty());
        assert!(unread.appeared[0].starts_with("Service web: an object of that name appeared"));
        // Read, and made by hand: in the way.
        let by_hand = plan_of(&c, Some(live("uid-hand", None)));
        assert!(by_hand.children.is_empty());
        assert_eq!(by_hand.conflicts[0].holder, "nobody");
        // Read, and ours (a child of a resource that moved here from another shard): updated,
        // guarded by its uid.
        let ours = plan_of(
            &c,
            Some(live("uid-ours", Some(("Service", "web", "uid-web")))),
        );
        assert_eq!(
            ours.children[0].write,
            Write::Update {
                uid: "uid-ours".into()
            }
        );
        // Gone by the time it was read (the watch has not shown its deletion yet): created.
        assert_eq!(plan_of(&c, None).children[0].write, Write::Create);
        // Gone when read, and made again since (the watch shows another version): not created.
        c.name_only.insert(key("Service", "web"), 2);
        let again = plan_of(&c, None);
        assert!(again.children.is_empty());
        assert_eq!(again.appeared.len(), 1);
    }

    #[test]
    fn an_object_made_by_hand_is_never_taken() {
        let mut c = caches();
        c.live.insert(key("Service", "web"), live("uid-hand", None));
        let plan = plan(vec![service("web")], &owner(false), &c);
        assert!(plan.children.is_empty());
        assert_eq!(plan.conflicts.len(), 1);
        assert_eq!(plan.conflicts[0].holder, "nobody");
        assert!(
            plan.conflicts[0].message(&owner(false)).contains(
                "kubectl annotate service web wasm-operator.dev/adopt-by=services.hanzo.ai/web"
            ),
            "{}",
            plan.conflicts[0].message(&owner(false))
        );
        // Still desired: prune must not treat it as stale.
        assert!(plan.desired.contains(&("/Service".into(), "web".into())));
    }

    #[test]
    fn an_object_that_names_the_resource_consents_to_its_adoption() {
        let consenting = |value: &str| {
            let mut l = (*live("uid-hand", None)).clone();
            l.annotations = [(ADOPT_BY_ANNOTATION, value)].into_iter().collect();
            Arc::new(l)
        };
        let mut c = caches();
        c.live
            .insert(key("Service", "web"), consenting("services.hanzo.ai/web"));
        let planned = plan(vec![service("web")], &owner(false), &c);
        assert!(planned.conflicts.is_empty());
        assert_eq!(
            planned.children[0].write,
            Write::Update {
                uid: "uid-hand".into()
            }
        );
        // Consent to another resource (or another Kind of the same name) is no consent.
        for other in ["services.hanzo.ai/api", "datastores.hanzo.ai/web", "true"] {
            c.live.insert(key("Service", "web"), consenting(other));
            let planned = plan(vec![service("web")], &owner(false), &c);
            assert_eq!(planned.conflicts.len(), 1, "{other}");
        }
    }

    #[test]
    fn an_object_nobody_controls_is_adopted_where_the_operator_adopts_when_asked() {
        let mut c = caches();
        c.live.insert(key("Service", "web"), live("uid-hand", None));
        let plan = plan(vec![service("web")], &owner(true), &c);
        assert!(plan.conflicts.is_empty());
        assert_eq!(
            plan.children[0].write,
            Write::Update {
                uid: "uid-hand".into()
            }
        );
        assert_eq!(guarded(&plan.children[0])["metadata"]["uid"], "uid-hand");
    }

    #[test]
    fn an_object_another_resource_controls_is_never_taken_even_when_adopting() {
        let mut c = caches();
        c.live.insert(
            key("Service", "web"),
            live("uid-svc", Some(("Datastore", "web", "uid-db"))),
        );
        for adopt in [false, true] {
            let plan = plan(vec![service("web")], &owner(adopt), &c);
            assert!(plan.children.is_empty());
            assert_eq!(plan.conflicts[0].holder, "Datastore web");
            assert!(
                plan.conflicts[0]
                    .message(&owner(adopt))
                    .contains("controlled by Datastore web")
            );
        }
    }

    #[test]
    fn our_own_child_is_updated_over_its_uid_and_left_alone_when_unchanged() {
        let mut c = caches();
        let ours = live("uid-svc", Some(("Service", "web", "uid-web")));
        c.live.insert(key("Service", "web"), ours.clone());
        let first = plan(vec![service("web")], &owner(false), &c);
        assert_eq!(
            first.children[0].write,
            Write::Update {
                uid: "uid-svc".into()
            }
        );
        // After our apply left it so, it is left as it is.
        let p = &first.children[0];
        c.applied.insert(
            p.cache_key.clone(),
            Applied {
                hash: p.hash,
                uid: Some("uid-svc".into()),
                generation: None,
                resource_version: Some("7".into()),
            },
        );
        let second = plan(vec![service("web")], &owner(false), &c);
        assert_eq!(second.children[0].write, Write::Skip);
        // Deleted and made again by someone else, with our owner reference and the same
        // resourceVersion in its kind's sequence (or generation 1): another object, written.
        c.live.insert(
            key("Service", "web"),
            live("uid-again", Some(("Service", "web", "uid-web"))),
        );
        let again = plan(vec![service("web")], &owner(false), &c);
        assert_eq!(
            again.children[0].write,
            Write::Update {
                uid: "uid-again".into()
            }
        );
        c.live.insert(key("Service", "web"), ours.clone());
        // After a restart the memory is empty; the record in the resource's status serves.
        let record = c.applied.remove(&p.cache_key).unwrap();
        let mut restarted = owner(false);
        restarted
            .recorded
            .insert(("/Service".into(), "web".into()), record);
        let third = plan(vec![service("web")], &restarted, &c);
        assert_eq!(third.children[0].write, Write::Skip);
        // A record in status does not stand for an object the watch does not show: deleted by
        // hand, it is created again.
        c.live.clear();
        let fourth = plan(vec![service("web")], &restarted, &c);
        assert_eq!(fourth.children[0].write, Write::Create);
    }

    #[test]
    fn children_of_undeclared_or_unserved_kinds_are_skipped_with_the_reason() {
        let monitor = json!({ "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
            "metadata": { "name": "web", "namespace": "ns" } });
        let cron = json!({ "apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": { "name": "web", "namespace": "ns" } });
        let plan = plan(vec![monitor, cron], &owner(false), &caches());
        let reasons: Vec<&str> = plan.skipped.iter().map(|s| s.reason.as_str()).collect();
        assert_eq!(
            reasons,
            [
                "the API server does not serve monitoring.coreos.com/v1 ServiceMonitor (is its CRD installed?)",
                "not a declared child kind"
            ]
        );
    }

    #[test]
    fn two_versions_of_one_kind_are_one_child() {
        let mut c = caches();
        c.targets.insert(
            "autoscaling/v1/HorizontalPodAutoscaler".into(),
            Ok(ar(
                "autoscaling/v1",
                "HorizontalPodAutoscaler",
                "horizontalpodautoscalers",
            )),
        );
        let hpa = json!({ "apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
            "metadata": { "name": "web", "namespace": "ns" } });
        let plan = plan(vec![hpa], &owner(false), &c);
        // Prune compares by group and kind: what v2 shows of this child is what v1 applied.
        let owned = vec![(
            "autoscaling/HorizontalPodAutoscaler".to_owned(),
            "ns".to_owned(),
            "web".to_owned(),
        )];
        c.live.insert(
            owned[0].clone(),
            live("uid-hpa", Some(("Service", "web", "uid-web"))),
        );
        assert!(stale_children(owned, "uid-web", "ns", &plan.desired, &c).is_empty());
    }
}
