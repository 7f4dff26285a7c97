#!/usr/bin/env python3
"""Offline check of deploy/kubernetes/*.yaml (run by `make test` through
tests/integration/test_kubernetes.py; also `python3 deploy/kubernetes/validate.py`).

Debian 12 has no offline Kubernetes validator (kubeconform and kubeval are
not packaged; kubectl validates against the API server's OpenAPI document,
which needs a cluster), and this machine cannot download the OpenAPI
document. So this is a JSON Schema (python3-jsonschema, draft 7) written from
the Kubernetes API reference (v1.29) for the kinds and fields these manifests
use, plus cross-reference checks.

What it checks:
  - every document is one of the kinds below with its exact apiVersion;
  - metadata: name and namespace present and DNS-1123, labels are strings;
  - for the objects it models (PodSpec, Container, Volume, probes, ports,
    Service, Deployment/DaemonSet spec, NetworkPolicy, Secret, ConfigMap):
    every field name is a real field of that object (additionalProperties
    false: a typo such as `containerport` or `mountpath` fails), required
    fields are present, types are right (ports are integers 1..65535,
    replicas an integer, env values strings, quantities strings or numbers);
  - cross references: a workload's selector matches its pod template's
    labels; every volumeMount names a volume of the pod; a named probe or
    targetPort names a container port; a Service selects the labels of some
    workload's pods; every Secret and ConfigMap a pod mounts is defined here;
    everything is in the one namespace, which is defined here.

What it does not check: fields of objects it does not model (it refuses
them: adding another kind means adding it here), semantic rules the API
server applies (immutable fields, admission, PodSecurity, quota), that an
image exists, that the cluster's version serves these apiVersions, and
anything about the running cluster. Nothing here was applied to a real
cluster.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import jsonschema
import yaml

HERE = Path(__file__).resolve().parent
DNS1123 = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


def obj(props: dict, required=()) -> dict:
    return {"type": "object", "properties": props, "required": list(required), "additionalProperties": False}


ANY = {}
STR = {"type": "string"}
BOOL = {"type": "boolean"}
INT = {"type": "integer"}
PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
INT_OR_NAME = {"oneOf": [PORT, {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 15}]}
STRMAP = {"type": "object", "additionalProperties": STR}
QUANTITY = {"oneOf": [{"type": "string", "pattern": r"^[0-9.]+(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"},
                      {"type": "number"}]}
STRLIST = {"type": "array", "items": STR}

METADATA = obj({"name": {"type": "string", "pattern": DNS1123, "maxLength": 63},
                "namespace": {"type": "string", "pattern": DNS1123}, "labels": STRMAP,
                "annotations": STRMAP, "generateName": STR}, ["name"])
TEMPLATE_METADATA = obj({"labels": STRMAP, "annotations": STRMAP, "name": STR})
LABEL_SELECTOR = obj({"matchLabels": STRMAP, "matchExpressions": {"type": "array"}})

HTTP_GET = obj({"path": STR, "port": INT_OR_NAME, "host": STR, "scheme": {"enum": ["HTTP", "HTTPS"]},
                "httpHeaders": {"type": "array"}}, ["port"])
PROBE = obj({"httpGet": HTTP_GET, "tcpSocket": obj({"port": INT_OR_NAME, "host": STR}, ["port"]),
             "exec": obj({"command": STRLIST}), "grpc": ANY,
             "initialDelaySeconds": INT, "periodSeconds": INT, "timeoutSeconds": INT,
             "successThreshold": INT, "failureThreshold": INT, "terminationGracePeriodSeconds": INT})
CAPS = obj({"add": STRLIST, "drop": STRLIST})
SECCOMP = obj({"type": {"enum": ["RuntimeDefault", "Localhost", "Unconfined"]}, "localhostProfile": STR},
              ["type"])
CONTAINER_SC = obj({"privileged": BOOL, "allowPrivilegeEscalation": BOOL, "readOnlyRootFilesystem": BOOL,
                    "runAsNonRoot": BOOL, "runAsUser": INT, "runAsGroup": INT, "capabilities": CAPS,
                    "seccompProfile": SECCOMP, "procMount": STR, "seLinuxOptions": ANY,
                    "appArmorProfile": ANY, "windowsOptions": ANY})
POD_SC = obj({"runAsNonRoot": BOOL, "runAsUser": INT, "runAsGroup": INT, "fsGroup": INT,
              "fsGroupChangePolicy": STR, "supplementalGroups": {"type": "array", "items": INT},
              "seccompProfile": SECCOMP, "sysctls": {"type": "array"}, "seLinuxOptions": ANY,
              "appArmorProfile": ANY, "windowsOptions": ANY})
CONTAINER_PORT = obj({"name": {"type": "string", "pattern": DNS1123, "maxLength": 15}, "containerPort": PORT,
                      "protocol": {"enum": ["TCP", "UDP", "SCTP"]}, "hostPort": PORT, "hostIP": STR},
                     ["containerPort"])
VOLUME_MOUNT = obj({"name": STR, "mountPath": {"type": "string", "pattern": "^/"}, "readOnly": BOOL,
                    "subPath": STR, "subPathExpr": STR, "mountPropagation": STR, "recursiveReadOnly": STR},
                   ["name", "mountPath"])
ENV_VAR = obj({"name": STR, "value": STR, "valueFrom": ANY}, ["name"])
RESOURCES = obj({"requests": {"type": "object", "additionalProperties": QUANTITY},
                 "limits": {"type": "object", "additionalProperties": QUANTITY}, "claims": ANY})
CONTAINER = obj({"name": {"type": "string", "pattern": DNS1123}, "image": STR,
                 "imagePullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
                 "command": STRLIST, "args": STRLIST, "workingDir": STR,
                 "ports": {"type": "array", "items": CONTAINER_PORT}, "env": {"type": "array", "items": ENV_VAR},
                 "envFrom": {"type": "array"}, "resources": RESOURCES,
                 "volumeMounts": {"type": "array", "items": VOLUME_MOUNT}, "volumeDevices": {"type": "array"},
                 "livenessProbe": PROBE, "readinessProbe": PROBE, "startupProbe": PROBE, "lifecycle": ANY,
                 "securityContext": CONTAINER_SC, "stdin": BOOL, "tty": BOOL, "terminationMessagePath": STR,
                 "terminationMessagePolicy": STR, "restartPolicy": STR, "resizePolicy": {"type": "array"}},
                ["name", "image"])
VOLUME = {"type": "object", "required": ["name"], "additionalProperties": False, "minProperties": 2,
          "maxProperties": 2,  # a name and exactly one source
          "properties": {
              "name": {"type": "string", "pattern": DNS1123},
              "hostPath": obj({"path": {"type": "string", "pattern": "^/"}, "type": {"enum": [
                  "", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice",
                  "BlockDevice"]}}, ["path"]),
              "configMap": obj({"name": STR, "items": {"type": "array"}, "defaultMode": INT, "optional": BOOL},
                               ["name"]),
              "secret": obj({"secretName": STR, "items": {"type": "array"}, "defaultMode": INT,
                             "optional": BOOL}, ["secretName"]),
              "emptyDir": obj({"medium": STR, "sizeLimit": QUANTITY}),
              "persistentVolumeClaim": obj({"claimName": STR, "readOnly": BOOL}, ["claimName"]),
              "projected": ANY, "downwardAPI": ANY, "csi": ANY, "ephemeral": ANY}}
POD_SPEC = obj({"containers": {"type": "array", "items": CONTAINER, "minItems": 1},
                "initContainers": {"type": "array", "items": CONTAINER},
                "volumes": {"type": "array", "items": VOLUME}, "nodeSelector": STRMAP, "affinity": ANY,
                "tolerations": {"type": "array"}, "serviceAccountName": STR,
                "automountServiceAccountToken": BOOL, "hostNetwork": BOOL, "hostPID": BOOL, "hostIPC": BOOL,
                "dnsPolicy": STR, "priorityClassName": STR, "terminationGracePeriodSeconds": INT,
                "securityContext": POD_SC, "restartPolicy": {"enum": ["Always", "OnFailure", "Never"]},
                "imagePullSecrets": {"type": "array"}, "topologySpreadConstraints": {"type": "array"},
                "runtimeClassName": STR, "enableServiceLinks": BOOL, "shareProcessNamespace": BOOL,
                "hostname": STR, "subdomain": STR}, ["containers"])
POD_TEMPLATE = obj({"metadata": TEMPLATE_METADATA, "spec": POD_SPEC}, ["metadata", "spec"])


def workload(extra: dict) -> dict:
    return obj({"selector": LABEL_SELECTOR, "template": POD_TEMPLATE, "minReadySeconds": INT,
                "revisionHistoryLimit": INT, **extra}, ["selector", "template"])


DEPLOYMENT_SPEC = workload({"replicas": {"type": "integer", "minimum": 0}, "strategy": obj({
    "type": {"enum": ["RollingUpdate", "Recreate"]}, "rollingUpdate": obj({"maxSurge": ANY,
                                                                           "maxUnavailable": ANY})}),
    "progressDeadlineSeconds": INT, "paused": BOOL})
DAEMONSET_SPEC = workload({"updateStrategy": obj({"type": {"enum": ["RollingUpdate", "OnDelete"]},
                                                  "rollingUpdate": obj({"maxSurge": ANY,
                                                                        "maxUnavailable": ANY})})})
SERVICE_PORT = obj({"name": STR, "port": PORT, "targetPort": INT_OR_NAME,
                    "protocol": {"enum": ["TCP", "UDP", "SCTP"]}, "nodePort": PORT, "appProtocol": STR},
                   ["port"])
SERVICE_SPEC = obj({"type": {"enum": ["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"]},
                    "clusterIP": STR, "selector": STRMAP, "ports": {"type": "array", "items": SERVICE_PORT},
                    "publishNotReadyAddresses": BOOL, "sessionAffinity": STR, "externalTrafficPolicy": STR,
                    "internalTrafficPolicy": STR, "loadBalancerSourceRanges": STRLIST, "ipFamilyPolicy": STR,
                    "ipFamilies": STRLIST, "externalName": STR})
NP_PEER = obj({"podSelector": LABEL_SELECTOR, "namespaceSelector": LABEL_SELECTOR, "ipBlock": ANY})
NP_PORT = obj({"port": INT_OR_NAME, "protocol": {"enum": ["TCP", "UDP", "SCTP"]}, "endPort": PORT})
NETPOL_SPEC = obj({"podSelector": LABEL_SELECTOR, "policyTypes": {"type": "array", "items": {
    "enum": ["Ingress", "Egress"]}},
    "ingress": {"type": "array", "items": obj({"from": {"type": "array", "items": NP_PEER},
                                               "ports": {"type": "array", "items": NP_PORT}})},
    "egress": {"type": "array", "items": obj({"to": {"type": "array", "items": NP_PEER},
                                             "ports": {"type": "array", "items": NP_PORT}})}},
    ["podSelector"])


def kind(api: str, k: str, spec: dict | None = None, extra: dict | None = None, req=("spec",)) -> dict:
    props = {"apiVersion": {"const": api}, "kind": {"const": k}, "metadata": METADATA, **(extra or {})}
    if spec is not None:
        props["spec"] = spec
    return obj(props, ["apiVersion", "kind", "metadata", *req])


SCHEMAS = {
    "Namespace": kind("v1", "Namespace", req=()),
    "Secret": kind("v1", "Secret", extra={"type": STR, "stringData": STRMAP, "data": STRMAP,
                                          "immutable": BOOL}, req=()),
    "ConfigMap": kind("v1", "ConfigMap", extra={"data": STRMAP, "binaryData": STRMAP, "immutable": BOOL},
                      req=()),
    "Service": kind("v1", "Service", SERVICE_SPEC),
    "Deployment": kind("apps/v1", "Deployment", DEPLOYMENT_SPEC),
    "DaemonSet": kind("apps/v1", "DaemonSet", DAEMONSET_SPEC),
    "NetworkPolicy": kind("networking.k8s.io/v1", "NetworkPolicy", NETPOL_SPEC),
}


def load(paths) -> list[tuple[str, dict]]:
    docs = []
    for p in paths:
        for d in yaml.safe_load_all(Path(p).read_text()):
            if d is not None:
                docs.append((Path(p).name, d))
    return docs


def check(docs) -> list[str]:
    errs = []
    for name, d in docs:
        k = d.get("kind") if isinstance(d, dict) else None
        if k not in SCHEMAS:
            errs.append(f"{name}: kind {k!r} is not one this check knows")
            continue
        v = jsonschema.Draft7Validator(SCHEMAS[k])
        for e in sorted(v.iter_errors(d), key=lambda e: list(e.absolute_path)):
            errs.append(f"{name}: {k} {'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}")
    if errs:
        return errs
    namespaces = {d["metadata"]["name"] for _, d in docs if d["kind"] == "Namespace"}
    secrets = {d["metadata"]["name"] for _, d in docs if d["kind"] == "Secret"}
    configmaps = {d["metadata"]["name"] for _, d in docs if d["kind"] == "ConfigMap"}
    pod_labels = []
    for name, d in docs:
        if d["kind"] != "Namespace" and d["metadata"].get("namespace") not in namespaces:
            errs.append(f"{name}: namespace {d['metadata'].get('namespace')!r} is not defined here")
        if d["kind"] not in ("Deployment", "DaemonSet"):
            continue
        spec = d["spec"]
        labels = spec["template"]["metadata"].get("labels", {})
        pod_labels.append(labels)
        for k, v in spec["selector"].get("matchLabels", {}).items():
            if labels.get(k) != v:
                errs.append(f"{name}: selector {k}={v} does not match the pod template's labels")
        pod = spec["template"]["spec"]
        vols = {v["name"]: v for v in pod.get("volumes", [])}
        for v in vols.values():
            if "secret" in v and v["secret"]["secretName"] not in secrets:
                errs.append(f"{name}: volume {v['name']}: Secret {v['secret']['secretName']} is not defined here")
            if "configMap" in v and v["configMap"]["name"] not in configmaps:
                errs.append(f"{name}: volume {v['name']}: ConfigMap {v['configMap']['name']} is not defined here")
        for c in pod["containers"]:
            ports = {p.get("name") for p in c.get("ports", [])}
            for m in c.get("volumeMounts", []):
                if m["name"] not in vols:
                    errs.append(f"{name}: container {c['name']}: volumeMount {m['name']} names no volume")
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                if isinstance(port, str) and port not in ports:
                    errs.append(f"{name}: container {c['name']}: {probe} port {port} is not a container port")
    for name, d in docs:
        if d["kind"] == "Service" and d["spec"].get("selector"):
            sel = d["spec"]["selector"]
            if not any(all(lab.get(k) == v for k, v in sel.items()) for lab in pod_labels):
                errs.append(f"{name}: Service {d['metadata']['name']} selects no workload's pods")
            for p in d["spec"].get("ports", []):
                if isinstance(p.get("targetPort"), str):
                    named = False
                    for _, w in docs:
                        if w["kind"] in ("Deployment", "DaemonSet") and all(
                                w["spec"]["template"]["metadata"].get("labels", {}).get(k) == v
                                for k, v in sel.items()):
                            named |= any(cp.get("name") == p["targetPort"]
                                         for c in w["spec"]["template"]["spec"]["containers"]
                                         for cp in c.get("ports", []))
                    if not named:
                        errs.append(f"{name}: Service port {p.get('name')}: targetPort {p['targetPort']} "
                                    "names no container port of the selected pods")
    return errs


def main(argv) -> int:
    paths = argv[1:] or sorted(str(p) for p in HERE.glob("*.yaml"))
    errs = check(load(paths))
    for e in errs:
        print(e, file=sys.stderr)
    if not errs:
        print(f"{len(paths)} files valid")
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
