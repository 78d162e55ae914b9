// A StaticSite: a web server for a few files kept in the resource itself. Renders a ConfigMap
// with the files, a Deployment serving them (rolled when they change) and a Service in front.
// Pure: the same resource gives the same manifests, byte for byte.

const GROUP = "sites.example.com";

const specSchema = {
  type: "object",
  required: ["files"],
  properties: {
    image: { type: "string", description: "The web server's image.", default: "nginx:1.27" },
    replicas: { type: "integer", format: "int32", minimum: 0, maximum: 100, default: 1 },
    port: { type: "integer", format: "int32", minimum: 1, maximum: 65535, default: 80 },
    files: {
      type: "object",
      description: "The site's files by name (index.html, ...).",
      additionalProperties: { type: "string" },
    },
  },
};

// FNV-1a over the UTF-16 code units: a stable fingerprint of the files, to roll the pods.
function fingerprint(text) {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h.toString(16).padStart(8, "0");
}

class RenderError extends Error {
  constructor(field, message) {
    super(message);
    this.payload = { field, message };
  }
}

function parseSpec(resource) {
  let spec;
  try {
    spec = JSON.parse(resource.spec);
  } catch (e) {
    throw new RenderError("spec", `not JSON: ${e}`);
  }
  const files = spec.files ?? {};
  const names = Object.keys(files).sort();
  if (names.length === 0) {
    throw new RenderError("spec.files", "must name at least one file, such as index.html");
  }
  for (const name of names) {
    if (!/^[A-Za-z0-9._-]+$/.test(name) || name === "." || name === "..") {
      throw new RenderError(`spec.files.${name}`, "a file name is letters, digits, '.', '_' and '-'");
    }
  }
  return {
    image: spec.image ?? "nginx:1.27",
    replicas: spec.replicas ?? 1,
    port: spec.port ?? 80,
    files,
    names,
  };
}

export const reconciler = {
  describe(ctx) {
    return {
      name: "static-site",
      version: "0.1.0",
      kinds: [
        {
          group: GROUP,
          versions: ["v1alpha1"],
          kind: "StaticSite",
          plural: "staticsites",
          shortNames: ["site"],
          engine: undefined,
          specSchema: JSON.stringify(specSchema),
          printerColumns: [],
        },
      ],
      children: [
        { group: "", version: "v1", kind: "ConfigMap" },
        { group: "apps", version: "v1", kind: "Deployment" },
        { group: "", version: "v1", kind: "Service" },
      ],
    };
  },

  render(resource, ctx) {
    return renderSite(resource).manifests;
  },
};

// Contract 1.1: warnings with the manifests, and status fields from what the host observes.
const statusSchema = {
  type: "object",
  properties: {
    url: { type: "string", description: "Where the site answers, in the cluster." },
    availableReplicas: { type: "integer", description: "Replicas of the Deployment serving it." },
  },
};

export const reporting = {
  statusSchemas(ctx) {
    return [{ group: GROUP, kind: "StaticSite", schema: JSON.stringify(statusSchema) }];
  },

  render(resource, ctx) {
    return renderSite(resource);
  },

  status(resource, children, ctx) {
    const name = resource.metadata.name;
    const fields = {
      url: `http://${name}.${resource.metadata.namespace}.svc.${ctx.clusterDomain}/`,
    };
    const deployment = children.find((c) => c.kind === "Deployment" && c.name === name);
    if (deployment) {
      fields.availableReplicas = JSON.parse(deployment.status).availableReplicas ?? 0;
    }
    return JSON.stringify(fields);
  },
};

// Contract 1.2: the spec fields that name other objects of the namespace (a Secret, a
// ConfigMap, a ServiceAccount), which the API server lets a resource name only when its author
// may use them. A static site names none.
export const admission = {
  references(ctx) {
    return [];
  },
};

function renderSite(resource) {
  const spec = parseSpec(resource);
  const warnings = [];
  if (spec.replicas === 0) {
    warnings.push({ field: "spec.replicas", message: "is 0: the site is rendered but nothing serves it" });
  }
  const name = resource.metadata.name;
  const labels = { "app.kubernetes.io/name": name, "app.kubernetes.io/component": "static-site" };
  const data = {};
  for (const file of spec.names) data[file] = spec.files[file];
  const configMap = {
    apiVersion: "v1",
    kind: "ConfigMap",
    metadata: { name: `${name}-files`, labels },
    data,
  };
  const deployment = {
    apiVersion: "apps/v1",
    kind: "Deployment",
    metadata: { name, labels },
    spec: {
      replicas: spec.replicas,
      selector: { matchLabels: labels },
      template: {
        metadata: {
          labels,
          annotations: { "sites.example.com/files": fingerprint(JSON.stringify(data)) },
        },
        spec: {
          containers: [
            {
              name: "web",
              image: spec.image,
              ports: [{ name: "http", containerPort: spec.port }],
              volumeMounts: [{ name: "files", mountPath: "/usr/share/nginx/html", readOnly: true }],
            },
          ],
          volumes: [{ name: "files", configMap: { name: `${name}-files` } }],
        },
      },
    },
  };
  const service = {
    apiVersion: "v1",
    kind: "Service",
    metadata: { name, labels },
    spec: { selector: labels, ports: [{ name: "http", port: 80, targetPort: "http" }] },
  };
  return { manifests: [configMap, deployment, service].map((o) => JSON.stringify(o)), warnings };
}
