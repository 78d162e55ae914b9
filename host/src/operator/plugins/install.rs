//! Install: the CRDs of a Plugin's Kinds (only CRDs that are the Plugin's own) and the admission
//! policies of the references they make, server-side applied, each write fenced.

use super::*;

impl Loader {
    /// Installs or updates the CRDs of the plugin's Kinds (server-side apply), each only when it
    /// is absent or was installed for this Plugin; then waits until the API server serves them.
    pub(super) async fn install_crds(
        &self,
        name: &str,
        registry: &Registry,
    ) -> Result<(), Refusal> {
        if !self.writes() {
            return Ok(());
        }
        let crds = crate::crd::crds(registry)
            .map_err(|e| Refusal::stalled("InvalidSchema", e.to_string()))?;
        let api: Api<CustomResourceDefinition> = Api::all(self.shared.client.clone());
        for mut crd in crds {
            let crd_name = crd["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let existing = match api.get_opt(&crd_name).await {
                Ok(Some(existing)) => {
                    let owner = existing.annotations().get(CRD_OWNER);
                    if owner.map(String::as_str) != Some(name) {
                        return Err(Refusal::stalled(
                            "CrdNotOwned",
                            format!(
                                "the CRD {crd_name} exists and was not installed for this Plugin ({}): it is left alone. If it is this plugin's (installed by hand, or for a Plugin since deleted), annotate it {CRD_OWNER}={name}; deleting it would delete every resource of its Kind",
                                owner.map_or(
                                    "no wasm-operator.dev/plugin-resource annotation".to_owned(),
                                    |o| format!("it belongs to Plugin {o}")
                                )
                            ),
                        ));
                    }
                    Some(existing)
                }
                Ok(None) => None,
                Err(e) => return Err(Refusal::transient("CrdFailed", e.to_string())),
            };
            crd["metadata"]["annotations"][CRD_OWNER] = name.into();
            let invalid = |e: kube::Error| match &e {
                kube::Error::Api(s) if s.code == 422 || s.code == 400 => {
                    Refusal::stalled("InvalidSchema", format!("{crd_name}: {e}"))
                }
                kube::Error::Api(s) if s.code == 409 => Refusal::transient(
                    "CrdChanged",
                    format!("{crd_name} changed while it was written; looked at again"),
                ),
                _ => Refusal::transient("CrdFailed", format!("{crd_name}: {e}")),
            };
            match existing {
                // Absent: created, so that one made meanwhile by someone else is not taken
                // over (409).
                None => {
                    let new: CustomResourceDefinition =
                        serde_json::from_value(crd).map_err(|e| {
                            Refusal::stalled("InvalidSchema", format!("{crd_name}: {e}"))
                        })?;
                    self.send(
                        api.create(
                            &PostParams {
                                field_manager: Some(FIELD_MANAGER.to_owned()),
                                ..Default::default()
                            },
                            &new,
                        ),
                        invalid,
                    )
                    .await?;
                }
                // Ours: applied on the version read, so that a change meanwhile (its owner
                // annotation removed, say) is seen before anything is written over it.
                Some(existing) => {
                    crd["metadata"]["resourceVersion"] = existing
                        .metadata
                        .resource_version
                        .clone()
                        .unwrap_or_default()
                        .into();
                    let patch: CustomResourceDefinition =
                        serde_json::from_value(crd).map_err(|e| {
                            Refusal::stalled("InvalidSchema", format!("{crd_name}: {e}"))
                        })?;
                    self.send(
                        api.patch(
                            &crd_name,
                            &PatchParams::apply(FIELD_MANAGER).force(),
                            &Patch::Apply(&patch),
                        ),
                        invalid,
                    )
                    .await?;
                }
            }
            // Served once Established.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            loop {
                let established = api
                    .get_opt(&crd_name)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|c| {
                        c.status
                            .and_then(|s| s.conditions)
                            .into_iter()
                            .flatten()
                            .any(|c| c.type_ == "Established" && c.status == "True")
                    });
                if established {
                    break;
                }
                if tokio::time::Instant::now() > deadline {
                    return Err(Refusal::transient(
                        "CrdNotEstablished",
                        format!("{crd_name} is not Established after 30 s"),
                    ));
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Ok(())
    }

    /// Sends one write of an install, if this replica may write now (an install can take long
    /// enough, a CRD waiting to be Established, for the Lease to go meanwhile), within the
    /// fence's time bound; `refusal` says what a failure means.
    pub(super) async fn send<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
        refusal: impl FnOnce(kube::Error) -> Refusal,
    ) -> Result<T, Refusal> {
        if !self.shared.fence.allows() {
            return Err(Refusal::transient(
                "NotLeading",
                "this replica no longer holds the Lease; the next leader installs it",
            ));
        }
        self.shared.fence.bounded(call).await.map_err(refusal)
    }

    /// Installs or updates the admission policies of the plugin's Kinds whose specs name other
    /// objects (contract 1.2; see [`crate::policy::admission`]): server-side applied, since
    /// their Kinds' CRDs are this Plugin's.
    pub(super) async fn install_policies(&self, registry: &Registry) -> Result<(), Refusal> {
        if !self.writes() {
            return Ok(());
        }
        for object in crate::policy::admission::for_kinds(registry.kinds().map(|(_, k)| k)) {
            let kind = object["kind"].as_str().unwrap_or_default().to_owned();
            let object_name = object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let ar = ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", &kind),
                &crate::gvk::plural(&kind),
            );
            let api: Api<DynamicObject> = Api::all_with(self.shared.client.clone(), &ar);
            let patch: DynamicObject = serde_json::from_value(object).map_err(|e| {
                Refusal::stalled("InvalidPolicy", format!("{kind} {object_name}: {e}"))
            })?;
            self.send(
                api.patch(
                    &object_name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&patch),
                ),
                |e| match &e {
                    kube::Error::Api(s) if s.code == 422 || s.code == 400 => {
                        Refusal::stalled("InvalidPolicy", format!("{kind} {object_name}: {e}"))
                    }
                    _ => Refusal::transient("PolicyFailed", format!("{kind} {object_name}: {e}")),
                },
            )
            .await?;
        }
        Ok(())
    }
}
