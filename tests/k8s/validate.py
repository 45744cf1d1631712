"""Validates Kubernetes manifests offline, strictly, against a pinned Kubernetes version.

    python validate.py --kubernetes-version 1.33.0 --crds deploy/crds.yaml FILE...

Every document of every FILE must validate:
- built-in kinds against that version's OpenAPI schema (the `kubernetes-validate` package,
  strict: unknown fields are errors; a kind it has no schema for is an error, not a warning);
- Lode's own kinds (group lode.dev) against the openAPIV3Schema of their CRD in --crds, as the
  API server would: unknown fields are errors (it would prune them), enums, types and required
  fields hold;
- a kustomize Kustomization is not a Kubernetes object: its listed resources must exist.
Prints one line per document; exits 1 when any fails, 2 on bad arguments.
"""

import argparse
import copy
import os
import sys

import jsonschema
import kubernetes_validate
import yaml


def documents(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def structural(schema):
    """A CRD schema as JSON Schema: `nullable` allows null, objects with `properties` allow no
    other field (unless `x-kubernetes-preserve-unknown-fields`), `x-kubernetes-*` dropped."""
    schema = copy.deepcopy(schema)

    def walk(s):
        if not isinstance(s, dict):
            return s
        preserve = s.get("x-kubernetes-preserve-unknown-fields", False)
        for key in [k for k in s if k.startswith("x-kubernetes-")]:
            del s[key]
        if s.pop("nullable", False) and "type" in s:
            s["type"] = [s["type"], "null"]
        for key in ("properties", "patternProperties"):
            if key in s:
                s[key] = {k: walk(v) for k, v in s[key].items()}
        for key in ("items", "additionalProperties", "not"):
            if isinstance(s.get(key), dict):
                s[key] = walk(s[key])
        for key in ("allOf", "anyOf", "oneOf"):
            if key in s:
                s[key] = [walk(v) for v in s[key]]
        if "properties" in s and "additionalProperties" not in s and not preserve:
            s["additionalProperties"] = False
        return s

    return walk(schema)


def crd_schemas(path):
    schemas = {}
    for crd in documents(path):
        if crd.get("kind") != "CustomResourceDefinition":
            raise SystemExit(f"{path}: {crd.get('kind')} is not a CustomResourceDefinition")
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = structural(version["schema"]["openAPIV3Schema"])
            # The API server checks metadata itself; apiVersion and kind are the object's type.
            props = schema.setdefault("properties", {})
            props["apiVersion"] = {"type": "string"}
            props["kind"] = {"type": "string"}
            props["metadata"] = {"type": "object"}
            schemas[(f"{group}/{version['name']}", kind)] = schema
    return schemas


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubernetes-version", required=True)
    parser.add_argument("--crds", required=True)
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    schemas = crd_schemas(args.crds)
    failures = 0
    for path in args.files:
        for doc in documents(path):
            api, kind = doc.get("apiVersion", ""), doc.get("kind", "")
            name = (doc.get("metadata") or {}).get("name", "")
            what = f"{path}: {kind}/{name}"
            try:
                if api.startswith("kustomize.config.k8s.io/"):
                    base = os.path.dirname(path)
                    missing = [r for r in doc.get("resources", []) if not os.path.exists(os.path.join(base, r))]
                    if missing:
                        raise ValueError(f"resources missing: {missing}")
                elif api.split("/")[0] == "lode.dev":
                    schema = schemas.get((api, kind))
                    if schema is None:
                        raise ValueError(f"no CRD in {args.crds} for {api} {kind}")
                    jsonschema.Draft7Validator(schema).validate(doc)
                else:
                    kubernetes_validate.validate(doc, args.kubernetes_version, strict=True)
                print(f"ok     {what}")
            except (jsonschema.ValidationError, kubernetes_validate.ValidationError) as e:
                failures += 1
                where = "/".join(str(p) for p in e.absolute_path)
                print(f"FAILED {what}: {where}: {e.message}")
            except (kubernetes_validate.SchemaNotFoundError, ValueError) as e:
                failures += 1
                print(f"FAILED {what}: {e}")
    if failures:
        print(f"{failures} document(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
