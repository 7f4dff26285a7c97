"""deploy/kubernetes/ stays valid (issue 18): the manifests pass
deploy/kubernetes/validate.py (a JSON Schema written from the Kubernetes API
reference for the kinds used, plus cross-reference checks; its docstring says
what it does and does not check), and the check catches the mistakes it
claims to: a misspelt field, a port out of range, a mount of no volume, a
selector that misses its pods, a Secret that is not defined."""

from __future__ import annotations

import copy
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

K8S = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def _validator():
    spec = importlib.util.spec_from_file_location("k8s_validate", K8S / "validate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_manifests_valid():
    r = subprocess.run([sys.executable, str(K8S / "validate.py")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "9 files valid" in r.stdout
    docs = _validator().load(sorted(K8S.glob("*.yaml")))
    kinds = sorted(d["kind"] for _, d in docs)
    assert kinds == ["ConfigMap", "DaemonSet", "Deployment", "Namespace", "NetworkPolicy", "Secret", "Secret",
                     "Service", "Service"]
    ds = next(d for _, d in docs if d["kind"] == "DaemonSet")
    assert ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"] is True
    svc = next(d for _, d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "hutch-nodes")
    assert svc["spec"]["clusterIP"] == "None"  # headless: the router's --nodes-dns


def _pod(docs, kind):
    return next(d for _, d in docs if d["kind"] == kind)["spec"]["template"]["spec"]


@pytest.mark.parametrize("breakage, expect", [
    (lambda docs: _pod(docs, "DaemonSet")["containers"][0]["ports"][0].update(containerport=1),
     "'containerport' was unexpected"),
    (lambda docs: _pod(docs, "Deployment")["containers"][0]["ports"][0].update(containerPort=70000),
     "70000"),
    (lambda docs: _pod(docs, "DaemonSet")["containers"][0]["volumeMounts"].append(
        {"name": "nope", "mountPath": "/x"}), "volumeMount nope names no volume"),
    (lambda docs: next(d for _, d in docs if d["kind"] == "Deployment")["spec"]["selector"]["matchLabels"]
     .update({"app.kubernetes.io/name": "other"}), "does not match the pod template's labels"),
    (lambda docs: _pod(docs, "Deployment")["volumes"][0]["secret"].update(secretName="missing"),
     "Secret missing is not defined here"),
])
def test_validator_catches(breakage, expect):
    v = _validator()
    docs = copy.deepcopy(v.load(sorted(K8S.glob("*.yaml"))))
    breakage(docs)
    errs = v.check(docs)
    assert any(expect in e for e in errs), errs
