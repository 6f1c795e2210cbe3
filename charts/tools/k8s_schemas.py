"""JSON schemas for kubeconform from the Kubernetes OpenAPI spec and from CRDs, in kubeconform's
layout (one file per kind, `KIND-GROUP-VERSION.json`, GROUP the API group's first label):

    k8s_schemas.py kubernetes SWAGGER_JSON OUT_DIR   api/openapi-spec/swagger.json of a Kubernetes
                                                     release (the k8s.io/kubernetes Go module)
    k8s_schemas.py crds CRD_DIR OUT_DIR              CustomResourceDefinition YAML files

Every schema is standalone and strict, as kubeconform's own `-strict` schemas: each file carries
the definitions it reaches (`#/definitions/...`), and an object with properties refuses any other
field (additionalProperties: false), so a misspelt field fails validation. Kubernetes' string
formats that YAML writes as numbers (int-or-string, quantities) accept both.
"""

import json
import os
import sys

import yaml

INT_OR_STRING = {"anyOf": [{"type": "integer"}, {"type": "string"}]}
NUMBER_OR_STRING = {"anyOf": [{"type": "number"}, {"type": "string"}]}
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"


def file_name(kind, group, version):
    """kubeconform's `{{ .ResourceKind }}{{ .KindSuffix }}.json`: core group v1 -> "pod-v1.json",
    apps/v1 -> "daemonset-apps-v1.json", monitoring.coreos.com/v1 -> "...-monitoring-v1.json"."""
    suffix = f"-{group.split('.')[0]}" if group else ""
    return f"{kind.lower()}{suffix}-{version}.json".lower()


def strict(schema):
    """The schema (a copy) with additionalProperties: false on every object that lists its
    properties and says nothing else about others, and the int-or-string forms widened."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if schema.get("format") == "int-or-string" or schema.get("x-kubernetes-int-or-string"):
        drop = ("type", "format", "x-kubernetes-int-or-string")
        rest = {k: v for k, v in schema.items() if k not in drop}
        return {**strict(rest), **INT_OR_STRING}
    out = {k: strict(v) for k, v in schema.items()}
    if schema.get("nullable") and isinstance(schema.get("type"), str):
        out["type"] = [schema["type"], "null"]
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def refs(schema):
    """The definition names a schema refers to ("#/definitions/NAME")."""
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/definitions/"):
            yield ref[len("#/definitions/") :]
        for v in schema.values():
            yield from refs(v)
    elif isinstance(schema, list):
        for v in schema:
            yield from refs(v)


def reachable(definitions, name):
    seen, todo = set(), [name]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(refs(definitions[n]))
    return seen


def kubernetes(swagger_path, out):
    with open(swagger_path) as f:
        definitions = json.load(f)["definitions"]
    definitions = {n: strict(d) for n, d in definitions.items()}
    if QUANTITY in definitions:
        definitions[QUANTITY] = {**NUMBER_OR_STRING, "description": "a quantity: 100m, 1Gi, 2"}
    os.makedirs(out, exist_ok=True)
    count = 0
    for name, schema in definitions.items():
        for gvk in schema.get("x-kubernetes-group-version-kind", []):
            if name.endswith("List") or "properties" not in schema:
                continue
            others = sorted(reachable(definitions, name) - {name})
            doc = {**schema, "definitions": {n: definitions[n] for n in others}}
            path = os.path.join(out, file_name(gvk["kind"], gvk["group"], gvk["version"]))
            with open(path, "w") as f:
                json.dump(doc, f, sort_keys=True)
            count += 1
    return count


def crds(crd_dir, out):
    os.makedirs(out, exist_ok=True)
    count = 0
    for entry in sorted(os.listdir(crd_dir)):
        with open(os.path.join(crd_dir, entry)) as f:
            for crd in yaml.safe_load_all(f):
                if not crd or crd.get("kind") != "CustomResourceDefinition":
                    continue
                spec = crd["spec"]
                for version in spec["versions"]:
                    schema = strict(version["schema"]["openAPIV3Schema"])
                    name = file_name(spec["names"]["kind"], spec["group"], version["name"])
                    with open(os.path.join(out, name), "w") as f:
                        json.dump(schema, f, sort_keys=True)
                    count += 1
    return count


def main(argv):
    if len(argv) != 4 or argv[1] not in ("kubernetes", "crds"):
        sys.exit(__doc__)
    count = (kubernetes if argv[1] == "kubernetes" else crds)(argv[2], argv[3])
    print(f"k8s_schemas: {count} schemas in {argv[3]}")


if __name__ == "__main__":
    main(sys.argv)
