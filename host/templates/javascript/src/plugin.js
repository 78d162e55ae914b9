// The {{name}} plugin: a {{Kind}} ({{group}}/v1alpha1) becomes a ConfigMap holding its
// spec.message. Pure: the same resource gives the same manifests, byte for byte.

const GROUP = "{{group}}";
const KIND = "{{Kind}}";

const specSchema = {
  type: "object",
  properties: {
    message: { type: "string", maxLength: 1024, description: "What the ConfigMap holds." },
  },
};

const statusSchema = {
  type: "object",
  properties: {
    configMap: { type: "string", description: "The ConfigMap holding the message, once it exists." },
  },
};

// To refuse a resource, throw an error whose payload is the render error.
class RenderError extends Error {
  constructor(field, message) {
    super(message);
    this.payload = { field, message };
  }
}

function render(resource) {
  let spec;
  try {
    spec = JSON.parse(resource.spec);
  } catch (e) {
    throw new RenderError("spec", `not JSON: ${e}`);
  }
  for (const field of Object.keys(spec)) {
    if (!(field in specSchema.properties)) throw new RenderError(`spec.${field}`, "unknown field");
  }
  const warnings = [];
  let message = spec.message ?? "";
  if (message === "") {
    warnings.push({ field: "spec.message", message: "is empty: the ConfigMap says hello" });
    message = "hello";
  }
  const configMap = {
    apiVersion: "v1",
    kind: "ConfigMap",
    metadata: { name: resource.metadata.name },
    data: { message },
  };
  return { manifests: [JSON.stringify(configMap)], warnings };
}

export const reconciler = {
  describe(ctx) {
    return {
      name: "{{name}}",
      version: "0.1.0",
      kinds: [
        {
          group: GROUP,
          versions: ["v1alpha1"],
          kind: KIND,
          plural: "{{plural}}",
          shortNames: [],
          engine: undefined,
          specSchema: JSON.stringify(specSchema),
          printerColumns: [],
        },
      ],
      children: [{ group: "", version: "v1", kind: "ConfigMap" }],
    };
  },

  render(resource, ctx) {
    return render(resource).manifests;
  },
};

// Contract 1.1: warnings with the manifests, and status fields from what the host observes.
export const reporting = {
  statusSchemas(ctx) {
    return [{ group: GROUP, kind: KIND, schema: JSON.stringify(statusSchema) }];
  },

  render(resource, ctx) {
    return render(resource);
  },

  status(resource, children, ctx) {
    const name = resource.metadata.name;
    const fields = {};
    if (children.some((c) => c.kind === "ConfigMap" && c.name === name)) fields.configMap = name;
    return JSON.stringify(fields);
  },
};

// Contract 1.2: the spec fields that name other objects of the namespace (none here).
export const admission = {
  references(ctx) {
    return [];
  },
};
