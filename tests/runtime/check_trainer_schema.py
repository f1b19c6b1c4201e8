#!/usr/bin/env python3
"""Checks Kubeflow Trainer objects (YAML/JSON files, every document) against the CRD schema
excerpt (fixtures/trainer_crd_excerpt.json) with `jsonschema`, and, where the kubeflow_trainer_api
package is installed, against its generated models too (strict types down to the pod spec).
Documents of other kinds (kustomizations) are skipped. `--schema-only` skips the models (their
import takes seconds). Exit 0: all valid; 1: a problem (printed);
77: jsonschema is not installed (the calling test skips).
"""
import json
import os
import sys

try:
    import jsonschema
    import yaml
except ImportError as e:  # pragma: no cover
    print(f"skip: {e}")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))


def pydantic_check(doc):
    try:
        from kubeflow_trainer_api import models
    except ImportError:
        return None
    kind = doc["kind"]
    cls = {"TrainJob": models.TrainerV1alpha1TrainJob,
           "ClusterTrainingRuntime": models.TrainerV1alpha1ClusterTrainingRuntime,
           "TrainingRuntime": models.TrainerV1alpha1TrainingRuntime}[kind]
    cls.from_dict(doc)
    return True


def main(args):
    schema_only = "--schema-only" in args  # skip the (slow to import) API models
    paths = [a for a in args if a != "--schema-only"]
    with open(os.path.join(HERE, "fixtures", "trainer_crd_excerpt.json")) as f:
        schema = json.load(f)
    failures, checked, typed = 0, 0, 0
    for path in paths:
        with open(path) as f:
            docs = list(yaml.safe_load_all(f))
        for i, doc in enumerate(docs):
            if not isinstance(doc, dict) or doc.get("kind") not in ("TrainJob", "ClusterTrainingRuntime", "TrainingRuntime"):
                continue
            kind_schema = schema["TrainJob" if doc["kind"] == "TrainJob" else "ClusterTrainingRuntime"]
            errors = sorted(jsonschema.Draft7Validator(kind_schema).iter_errors(doc), key=lambda e: list(e.path))
            for e in errors:
                print(f"{path}[{i}]: {'.'.join(str(p) for p in e.path) or '<root>'}: {e.message}")
                failures += 1
            try:
                if not schema_only and pydantic_check(doc):
                    typed += 1
            except Exception as e:  # pydantic.ValidationError and friends
                print(f"{path}[{i}]: kubeflow_trainer_api: {str(e).splitlines()[0:3]}")
                failures += 1
            checked += 1
    print(f"checked {checked} objects ({typed} also against kubeflow_trainer_api models), {failures} problems")
    return 1 if failures or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
