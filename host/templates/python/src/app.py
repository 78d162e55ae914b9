"""The {{name}} plugin: a {{Kind}} ({{group}}/v1alpha1) becomes a ConfigMap holding its
spec.message. Pure: the same resource gives the same manifests, byte for byte.
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import types

GROUP = "{{group}}"
KIND = "{{Kind}}"

SPEC_SCHEMA = {
    "type": "object",
    "properties": {
        "message": {"type": "string", "maxLength": 1024, "description": "What the ConfigMap holds."},
    },
}

STATUS_SCHEMA = {
    "type": "object",
    "properties": {
        "configMap": {"type": "string", "description": "The ConfigMap holding the message, once it exists."},
    },
}


def dump(obj: dict) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def render(resource: types.Resource) -> types.Rendered:
    try:
        spec = json.loads(resource.spec)
    except ValueError as e:
        # To refuse a resource, raise its render error.
        raise Err(types.RenderError(field="spec", message=f"not JSON: {e}"))
    for field in spec:
        if field not in SPEC_SCHEMA["properties"]:
            raise Err(types.RenderError(field=f"spec.{field}", message="unknown field"))
    warnings = []
    message = spec.get("message", "")
    if message == "":
        warnings.append(types.Warning(field="spec.message", message="is empty: the ConfigMap says hello"))
        message = "hello"
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": resource.metadata.name},
        "data": {"message": message},
    }
    return types.Rendered(manifests=[dump(config_map)], warnings=warnings)


class Reconciler(exports.Reconciler):
    def describe(self, ctx: types.Context) -> types.PluginInfo:
        kind = types.KindInfo(
            group=GROUP,
            versions=["v1alpha1"],
            kind=KIND,
            plural="{{plural}}",
            short_names=[],
            engine=None,
            spec_schema=dump(SPEC_SCHEMA),
            printer_columns=[],
        )
        return types.PluginInfo(
            name="{{name}}",
            version="0.1.0",
            kinds=[kind],
            children=[types.GroupVersionKind(group="", version="v1", kind="ConfigMap")],
        )

    def render(self, resource: types.Resource, ctx: types.Context) -> list[str]:
        return render(resource).manifests


# Contract 1.1: warnings with the manifests, and status fields from what the host observes.
class Reporting(exports.Reporting):
    def status_schemas(self, ctx: types.Context) -> list[types.StatusSchema]:
        return [types.StatusSchema(group=GROUP, kind=KIND, schema=dump(STATUS_SCHEMA))]

    def render(self, resource: types.Resource, ctx: types.Context) -> types.Rendered:
        return render(resource)

    def status(self, resource: types.Resource, children: list[types.ObservedChild], ctx: types.Context) -> str:
        fields = {}
        if any(c.kind == "ConfigMap" and c.name == resource.metadata.name for c in children):
            fields["configMap"] = resource.metadata.name
        return dump(fields)


# Contract 1.2: the spec fields that name other objects of the namespace (none here).
class Admission(exports.Admission):
    def references(self, ctx: types.Context) -> list[types.Reference]:
        return []
