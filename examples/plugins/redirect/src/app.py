"""A Redirect: a web server that answers every request with a redirect to one URL.

Renders a ConfigMap with the server's configuration, a Deployment running it (rolled when the
configuration changes) and a Service in front. Pure: the same resource gives the same manifests,
byte for byte (no clock, no randomness, dictionaries dumped with sorted keys).
"""

import hashlib
import json
import re

import wit_world
from componentize_py_types import Err
from wit_world.exports import Admission, Reconciler, Reporting
from wit_world.imports import types

GROUP = "redirects.example.com"
KIND = "Redirect"

SPEC_SCHEMA = {
    "type": "object",
    "required": ["to"],
    "properties": {
        "to": {
            "type": "string",
            "description": "Where every request is sent: an http or https URL.",
            "maxLength": 2048,
        },
        "code": {
            "type": "integer",
            "description": "The redirect's status: 301 (permanent) or 302 (temporary).",
            "enum": [301, 302, 307, 308],
            "default": 302,
        },
        "image": {"type": "string", "description": "The web server's image.", "default": "nginx:1.27", "maxLength": 512},
        "replicas": {"type": "integer", "format": "int32", "minimum": 0, "maximum": 100, "default": 1},
    },
}

STATUS_SCHEMA = {
    "type": "object",
    "properties": {
        "target": {"type": "string", "description": "Where requests are sent."},
        "availableReplicas": {"type": "integer", "description": "Replicas of the Deployment answering."},
    },
}

URL = re.compile(r"^https?://[^\s\"';{}]+$")


def fail(field: str, message: str) -> Err:
    return Err(types.RenderError(field=field, message=message))


def parse_spec(resource: types.Resource) -> dict:
    try:
        spec = json.loads(resource.spec)
    except ValueError as e:
        raise fail("spec", f"not JSON: {e}")
    to = spec.get("to")
    if not isinstance(to, str) or not URL.match(to):
        raise fail("spec.to", "must be an http:// or https:// URL without spaces, quotes, ';' or braces")
    return {
        "to": to,
        "code": spec.get("code", 302),
        "image": spec.get("image", "nginx:1.27"),
        "replicas": spec.get("replicas", 1),
    }


def dump(obj: dict) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def render(resource: types.Resource) -> types.Rendered:
    spec = parse_spec(resource)
    warnings = []
    if spec["replicas"] == 0:
        warnings.append(types.Warning(field="spec.replicas", message="is 0: the redirect is rendered but nothing answers"))
    name = resource.metadata.name
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": "redirect"}
    conf = f"server {{\n  listen 8080;\n  return {spec['code']} {spec['to']};\n}}\n"
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-conf", "labels": labels},
        "data": {"default.conf": conf},
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": spec["replicas"],
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {"redirects.example.com/conf": hashlib.sha256(conf.encode()).hexdigest()[:16]},
                },
                "spec": {
                    "containers": [
                        {
                            "name": "web",
                            "image": spec["image"],
                            "ports": [{"name": "http", "containerPort": 8080}],
                            "volumeMounts": [{"name": "conf", "mountPath": "/etc/nginx/conf.d", "readOnly": True}],
                        }
                    ],
                    "volumes": [{"name": "conf", "configMap": {"name": f"{name}-conf"}}],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {"selector": labels, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    }
    return types.Rendered(manifests=[dump(o) for o in (config_map, deployment, service)], warnings=warnings)


class Reconciler(wit_world.exports.Reconciler):
    def describe(self, ctx: types.Context) -> types.PluginInfo:
        kind = types.KindInfo(
            group=GROUP,
            versions=["v1alpha1"],
            kind=KIND,
            plural="redirects",
            short_names=["redir"],
            engine=None,
            spec_schema=dump(SPEC_SCHEMA),
            printer_columns=[
                types.PrinterColumn(name="To", type="string", json_path=".spec.to", description="Where requests are sent.", priority=0),
            ],
        )
        return types.PluginInfo(
            name="redirect",
            version="0.1.0",
            kinds=[kind],
            children=[
                types.GroupVersionKind(group="", version="v1", kind="ConfigMap"),
                types.GroupVersionKind(group="apps", version="v1", kind="Deployment"),
                types.GroupVersionKind(group="", version="v1", kind="Service"),
            ],
        )

    def render(self, resource: types.Resource, ctx: types.Context) -> list[str]:
        return render(resource).manifests


# Contract 1.1: warnings with the manifests, and status fields from what the host observes.
class Reporting(wit_world.exports.Reporting):
    def status_schemas(self, ctx: types.Context) -> list[types.StatusSchema]:
        return [types.StatusSchema(group=GROUP, kind=KIND, schema=dump(STATUS_SCHEMA))]

    def render(self, resource: types.Resource, ctx: types.Context) -> types.Rendered:
        return render(resource)

    def status(self, resource: types.Resource, children: list[types.ObservedChild], ctx: types.Context) -> str:
        fields = {"target": parse_spec(resource)["to"]}
        for child in children:
            if child.kind == "Deployment" and child.name == resource.metadata.name:
                fields["availableReplicas"] = json.loads(child.status).get("availableReplicas", 0)
        return dump(fields)


# Contract 1.2: the spec fields that name other objects of the namespace. A redirect names none.
class Admission(wit_world.exports.Admission):
    def references(self, ctx: types.Context) -> list[types.Reference]:
        return []
