#!/usr/bin/env python3
"""Evaluates the CEL of deploy/linkerd-cni-admission.yaml on admission
requests, as the API server would, and checks what each is answered.

test.sh runs it with the lint venv's Python, which has cel-python (a CEL
engine) from scripts/setup.sh. The requests are the installer's and the
repair controller's own (its node's startup taint removed, a pod of its
node deleted) and what a stolen token would try (another node, another
taint, labels, another node's pod, a token without node claims), each
with the answer the policy must give. Objects are plain JSON, as the API
server hands an unstructured object to CEL: `has()` on an absent field is
false, `object` is null for a DELETE.

Usage: check-admission-policy.py [deploy/linkerd-cni-admission.yaml]
Exit status 0 only when every case gets its answer.
"""

import copy
import sys

import celpy
import yaml

ACCOUNT = "system:serviceaccount:linkerd-cni:linkerd-cni"
NODE_CLAIM = "authentication.kubernetes.io/node-name"
TAINT = "linkerd.io/cni-not-ready"


def load(path):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    policies = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    assert len(policies) == 1, f"{path}: {len(policies)} policies"
    return policies[0]["spec"]


class Policy:
    def __init__(self, spec):
        self.env = celpy.Environment()
        compile_ = lambda e: self.env.program(self.env.compile(e))
        self.conditions = [compile_(c["expression"]) for c in spec.get("matchConditions", [])]
        self.variables = [(v["name"], compile_(v["expression"])) for v in spec.get("variables", [])]
        self.validations = [
            (
                compile_(v["expression"]),
                compile_(v["messageExpression"]) if "messageExpression" in v else None,
                v.get("message", ""),
            )
            for v in spec["validations"]
        ]
        self.rules = spec["matchConstraints"]["resourceRules"]

    def matches(self, request):
        return any(
            request["resource"]["resource"] in r["resources"]
            and request["operation"] in r["operations"]
            for r in self.rules
        )

    def admit(self, request, obj, old):
        """None when allowed, else the denial's message."""
        if not self.matches(request):
            return None
        act = {
            "request": celpy.json_to_cel(request),
            "object": celpy.json_to_cel(obj),
            "oldObject": celpy.json_to_cel(old),
        }
        if not all(bool(c.evaluate(act)) for c in self.conditions):
            return None
        variables = {}
        for name, prog in self.variables:
            act["variables"] = celpy.json_to_cel(variables)
            value = prog.evaluate(act)
            if isinstance(value, celpy.CELEvalError):
                raise value
            variables[name] = value
        act["variables"] = celpy.celtypes.MapType(
            {celpy.celtypes.StringType(k): v for k, v in variables.items()}
        )
        for expr, message_expr, message in self.validations:
            ok = expr.evaluate(act)
            if isinstance(ok, celpy.CELEvalError):
                raise ok
            if not ok:
                return str(message_expr.evaluate(act)) if message_expr else message
        return None


def node(name, taints, labels=None):
    n = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {}}
    if taints:
        n["spec"]["taints"] = taints
    if labels:
        n["metadata"]["labels"] = labels
    return n


def taint(key, effect="NoSchedule"):
    return {"key": key, "effect": effect}


def pod(name, node_name):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "emojivoto"},
            "spec": {"nodeName": node_name}}


def request(resource, operation, user=ACCOUNT, node_name="node-1"):
    extra = {NODE_CLAIM: [node_name]} if node_name else {}
    r = {"operation": operation, "resource": {"group": "", "version": "v1", "resource": resource},
         "userInfo": {"username": user}}
    if extra:
        r["userInfo"]["extra"] = extra
    return r


def cases():
    tainted = node("node-1", [taint("other"), taint(TAINT), taint(TAINT, "NoExecute")],
                   {"kubernetes.io/os": "linux"})
    removed = node("node-1", [taint("other")], {"kubernetes.io/os": "linux"})
    only_ours = node("node-1", [taint(TAINT)])
    none_left = node("node-1", [])

    relabeled = copy.deepcopy(removed)
    relabeled["metadata"]["labels"]["node-role.kubernetes.io/control-plane"] = ""
    other_gone = node("node-1", [], {"kubernetes.io/os": "linux"})
    added = node("node-1", [taint("other"), taint(TAINT), taint(TAINT, "NoExecute"),
                            taint("evict", "NoExecute")], {"kubernetes.io/os": "linux"})
    cordoned = copy.deepcopy(removed)
    cordoned["spec"]["unschedulable"] = True
    node2_tainted = copy.deepcopy(tainted)
    node2_tainted["metadata"]["name"] = "node-2"
    node2_removed = copy.deepcopy(removed)
    node2_removed["metadata"]["name"] = "node-2"

    upd = request("nodes", "UPDATE")
    dele = request("pods", "DELETE")
    return [
        # (what, request, object, oldObject, allowed)
        ("its node: the startup taint removed", upd, removed, tainted, True),
        ("its node: the last taint removed", upd, none_left, only_ours, True),
        ("its node: nothing changed", upd, removed, removed, True),
        ("its node: another taint removed too", upd, other_gone, tainted, False),
        ("its node: a taint added", upd, added, tainted, False),
        ("its node: a label added", upd, relabeled, tainted, False),
        ("its node: cordoned", upd, cordoned, tainted, False),
        ("another node: the startup taint removed", upd, node2_removed, node2_tainted, False),
        ("a token without node claims", request("nodes", "UPDATE", node_name=None), removed, tainted,
         False),
        ("a pod of its node deleted", dele, None, pod("web-0", "node-1"), True),
        ("a pod of another node deleted", dele, None, pod("web-0", "node-2"), False),
        ("an unscheduled pod deleted", dele, None, {"metadata": {"name": "p"}, "spec": {}}, False),
        ("a pod deleted without node claims", request("pods", "DELETE", node_name=None), None,
         pod("web-0", "node-1"), False),
        ("the kubelet patching another node", request("nodes", "UPDATE", user="system:node:node-2",
                                                     node_name=None), node2_removed, node2_tainted, True),
        ("a pod created (not matched)", request("pods", "CREATE"), pod("p", "node-2"), None, True),
    ]


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "deploy/linkerd-cni-admission.yaml"
    policy = Policy(load(path))
    passed = failed = 0
    for what, req, obj, old, allowed in cases():
        try:
            denied = policy.admit(req, obj, old)
        except Exception as e:  # a CEL error: the API server fails the request (failurePolicy)
            denied = f"CEL error: {e!r}"
        if (denied is None) == allowed:
            passed += 1
        else:
            failed += 1
            print(f"FAIL {what}: {'denied: ' + denied if denied else 'allowed'}", file=sys.stderr)
    total = passed + failed
    if failed:
        print(f"admission-policy: {failed} of {total} requests answered wrongly", file=sys.stderr)
        return 1
    print(f"admission-policy: all {total} requests answered as the policy must")
    return 0


if __name__ == "__main__":
    sys.exit(main())
