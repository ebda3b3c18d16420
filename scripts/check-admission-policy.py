#!/usr/bin/env python3
"""Evaluates the CEL of deploy/linkerd-cni-admission.yaml on admission
requests, as the API server would, and checks what each is answered.

test.sh runs it with the lint venv's Python, which has cel-python (a CEL
engine) from scripts/setup.sh. The requests are the installer's and the
repair controller's own (its node's startup taint removed, a meshed pod of
its node deleted) and what a stolen token would try (another node, another
taint, any other field of the node, another node's pod, an unmeshed pod, a
static pod's mirror pod, a token without node claims). Each denied request
names the validations that must deny it, by a fragment of their messages:
every validation of the policy is evaluated on every request, and the
failing ones must be exactly those. Objects are plain JSON, as the
API server hands an unstructured object to CEL: `has()` on an absent field
is false, `object` is null for a DELETE.

With --mutations, it then drops each validation of the policy in turn (one
validation is one rule: the policy keeps it that way) and requires that
some request the policy must deny is allowed without it: every rule has a
request that only it denies, so none can be lost unnoticed.

Usage: check-admission-policy.py [--mutations] [deploy/linkerd-cni-admission.yaml]
Exit status 0 only when every request gets its answer (and, with
--mutations, every validation's removal lets a request through).
"""

import copy
import sys

import celpy
import yaml

ACCOUNT = "system:serviceaccount:linkerd-cni:linkerd-cni"
NODE_CLAIM = "authentication.kubernetes.io/node-name"
TAINT = "linkerd.io/cni-not-ready"
MESHED = "linkerd.io/control-plane-ns"
MIRROR = "kubernetes.io/config.mirror"


def load(path):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    policies = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    assert len(policies) == 1, f"{path}: {len(policies)} policies"
    return policies[0]["spec"]


class Compiler:
    """Compiles each CEL expression once, however many policies use it."""

    def __init__(self):
        self.env = celpy.Environment()
        self.programs = {}

    def __call__(self, expression):
        if expression not in self.programs:
            self.programs[expression] = self.env.program(self.env.compile(expression))
        return self.programs[expression]


class Policy:
    def __init__(self, spec, compile_):
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

    def denials(self, request, obj, old):
        """The messages of every validation that denies the request (an
        empty list: allowed). A CEL error denies too (failurePolicy Fail)."""
        if not self.matches(request):
            return []
        act = {
            "request": celpy.json_to_cel(request),
            "object": celpy.json_to_cel(obj),
            "oldObject": celpy.json_to_cel(old),
        }
        if not all(bool(c.evaluate(act)) for c in self.conditions):
            return []
        variables = {}
        for name, prog in self.variables:
            act["variables"] = celpy.json_to_cel(variables)
            value = prog.evaluate(act)
            if isinstance(value, celpy.CELEvalError):
                return [f"CEL error in variable {name}: {value!r}"]
            variables[name] = value
        act["variables"] = celpy.celtypes.MapType(
            {celpy.celtypes.StringType(k): v for k, v in variables.items()}
        )
        denied = []
        for i, (expr, message_expr, message) in enumerate(self.validations):
            ok = expr.evaluate(act)
            if isinstance(ok, celpy.CELEvalError):
                denied.append(f"CEL error in validation {i}: {ok!r}")
            elif not ok:
                denied.append(str(message_expr.evaluate(act)) if message_expr else message)
        return denied


def node(name, taints, labels=None):
    n = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {}}
    if taints:
        n["spec"]["taints"] = taints
    if labels:
        n["metadata"]["labels"] = labels
    return n


def taint(key, effect="NoSchedule"):
    return {"key": key, "effect": effect}


def changed(n, path, value):
    """A copy of `n` with the field at `path` (dotted) set to `value`."""
    n = copy.deepcopy(n)
    *parents, leaf = path.split(".")
    target = n
    for p in parents:
        target = target.setdefault(p, {})
    target[leaf] = value
    return n


def pod(name, node_name, meshed=True, owner=("apps/v1", "ReplicaSet"), mirror=False):
    """A pod as the API server stores it: meshed ones carry the injector's
    label, and `owner` is its controller."""
    meta = {"name": name, "namespace": "emojivoto"}
    if meshed:
        meta["labels"] = {MESHED: "linkerd", "app": name}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": owner[0], "kind": owner[1], "name": "owner",
                                    "uid": "u-1", "controller": True}]
    if mirror:
        meta["annotations"] = {MIRROR: "0a3f9c"}
    p = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {}}
    if node_name is not None:
        p["spec"]["nodeName"] = node_name
    return p


def request(resource, operation, user=ACCOUNT, node_name="node-1"):
    extra = {NODE_CLAIM: [node_name]} if node_name else {}
    r = {"operation": operation, "resource": {"group": "", "version": "v1", "resource": resource},
         "userInfo": {"username": user}}
    if extra:
        r["userInfo"]["extra"] = extra
    return r


# Fragments of each validation's message, naming it in the cases.
CLAIMS = "carries no node name"
ITS_NODE = "only the node its pod runs on"
TAINTS = "only remove its startup taint"
LABELS = "(metadata.labels)"
ANNOTATIONS = "(metadata.annotations)"
OWNERS = "(metadata.ownerReferences)"
FINALIZERS = "(metadata.finalizers)"
CORDON = "(spec.unschedulable)"
POD_CIDR = "(spec.podCIDR)"
POD_CIDRS = "(spec.podCIDRs)"
PROVIDER = "(spec.providerID)"
ITS_PODS = "only pods of the node its pod runs on"
MESHED_ONLY = "only meshed pods"
MIRROR_POD = "mirror pod (annotation"
NODE_OWNED = "owned by a Node"

ALLOWED = ()


def cases():
    """(what, request, object, oldObject, the validations that deny it:
    ALLOWED for none)."""
    tainted = node("node-1", [taint("other"), taint(TAINT), taint(TAINT, "NoExecute")],
                   {"kubernetes.io/os": "linux"})
    tainted["spec"].update({"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"],
                            "providerID": "kind://docker/kind/node-1"})
    tainted["metadata"]["annotations"] = {"node.alpha.kubernetes.io/ttl": "0"}
    removed = copy.deepcopy(tainted)
    removed["spec"]["taints"] = [taint("other")]
    only_ours = node("node-1", [taint(TAINT)])
    none_left = node("node-1", [])

    other_gone = changed(removed, "spec.taints", [])
    added = changed(tainted, "spec.taints", tainted["spec"]["taints"] + [taint("evict", "NoExecute")])
    node2_tainted = changed(tainted, "metadata.name", "node-2")
    node2_removed = changed(removed, "metadata.name", "node-2")
    # Each field of the node but its taints, changed alone along with the
    # startup taint's removal.
    fields = [
        (LABELS, "a label added", "metadata.labels",
         {"kubernetes.io/os": "linux", "node-role.kubernetes.io/control-plane": ""}),
        (ANNOTATIONS, "an annotation added", "metadata.annotations",
         {"node.alpha.kubernetes.io/ttl": "0", "example.com/owned": "yes"}),
        (OWNERS, "an owner added", "metadata.ownerReferences",
         [{"apiVersion": "v1", "kind": "Namespace", "name": "x", "uid": "u-2"}]),
        (FINALIZERS, "a finalizer added", "metadata.finalizers", ["example.com/keep"]),
        (CORDON, "cordoned", "spec.unschedulable", True),
        (POD_CIDR, "its pod CIDR changed", "spec.podCIDR", "10.0.0.0/8"),
        (POD_CIDRS, "its pod CIDRs changed", "spec.podCIDRs", ["10.244.1.0/24", "fd00::/64"]),
        (PROVIDER, "its provider ID changed", "spec.providerID", "aws:///us-east-1a/i-0"),
    ]

    upd = request("nodes", "UPDATE")
    dele = request("pods", "DELETE")
    unclaimed_dele = request("pods", "DELETE", node_name=None)
    return [
        ("its node: the startup taint removed", upd, removed, tainted, ALLOWED),
        ("its node: the last taint removed", upd, none_left, only_ours, ALLOWED),
        ("its node: nothing changed", upd, removed, removed, ALLOWED),
        ("its node: another taint removed too", upd, other_gone, tainted, (TAINTS,)),
        ("its node: a taint added", upd, added, tainted, (TAINTS,)),
        *[(f"its node: {what}", upd, changed(removed, path, value), tainted, (key,))
          for key, what, path, value in fields],
        ("another node: the startup taint removed", upd, node2_removed, node2_tainted, (ITS_NODE,)),
        ("a token without node claims", request("nodes", "UPDATE", node_name=None), removed, tainted,
         (CLAIMS, ITS_NODE)),
        ("a meshed pod of its node deleted", dele, None, pod("web-0", "node-1"), ALLOWED),
        ("a meshed pod of its node, owned by a custom resource named Node, deleted", dele, None,
         pod("web-0", "node-1", owner=("example.com/v1", "Node")), ALLOWED),
        ("a bare meshed pod of its node deleted", dele, None, pod("web-0", "node-1", owner=None),
         ALLOWED),
        ("a pod of another node deleted", dele, None, pod("web-0", "node-2"), (ITS_PODS,)),
        ("an unscheduled pod deleted", dele, None, pod("web-0", None), (ITS_PODS,)),
        ("an unmeshed pod of its node (the primary CNI's agent) deleted", dele, None,
         pod("cilium-x7k2p", "node-1", meshed=False, owner=("apps/v1", "DaemonSet")),
         (MESHED_ONLY,)),
        ("a static pod's mirror pod of its node deleted", dele, None,
         pod("etcd-node-1", "node-1", owner=("v1", "Node"), mirror=True), (MIRROR_POD, NODE_OWNED)),
        ("a pod of its node with the mirror annotation deleted", dele, None,
         pod("etcd-node-1", "node-1", mirror=True), (MIRROR_POD,)),
        ("a pod of its node owned by its Node deleted", dele, None,
         pod("etcd-node-1", "node-1", owner=("v1", "Node")), (NODE_OWNED,)),
        ("a pod deleted without node claims", unclaimed_dele, None, pod("web-0", "node-1"),
         (CLAIMS, ITS_PODS)),
        # The API server omits an empty nodeName from the object CEL sees;
        # were it there, it would equal the missing claim's "".
        ("a pod with an empty nodeName deleted without node claims", unclaimed_dele, None,
         pod("web-0", ""), (CLAIMS,)),
        ("the kubelet patching another node", request("nodes", "UPDATE", user="system:node:node-2",
                                                     node_name=None), node2_removed, node2_tainted,
         ALLOWED),
        ("a pod created (not matched)", request("pods", "CREATE"), pod("p", "node-2"), None, ALLOWED),
    ]


def wrong_answers(policy):
    """(what, why) of each request the policy answers wrongly."""
    wrong = []
    for what, req, obj, old, expected in cases():
        denials = policy.denials(req, obj, old)
        # Each fragment names one denial, each denial is named once.
        named = [[d for d in denials if key in d] for key in expected]
        if len(denials) == len(expected) and all(len(n) == 1 for n in named) and \
                len({n[0] for n in named}) == len(denials):
            continue
        got = "allowed" if not denials else "denied by: " + " | ".join(denials)
        want = "allowed" if not expected else "denied by: " + " | ".join(expected)
        wrong.append((what, expected, denials, f"{got}; expected {want}"))
    return wrong


def check(spec, compile_):
    wrong = wrong_answers(Policy(spec, compile_))
    for what, _, _, why in wrong:
        print(f"FAIL {what}: {why}", file=sys.stderr)
    total = len(cases())
    if wrong:
        print(f"admission-policy: {len(wrong)} of {total} requests answered wrongly", file=sys.stderr)
        return False
    print(f"admission-policy: all {total} requests answered as the policy must")
    return True


def mutations(spec, compile_):
    """Drops each validation in turn: some request that must be denied
    has to be allowed without it."""
    validations = spec["validations"]
    survivors = 0
    for i, v in enumerate(validations):
        mutant = copy.deepcopy(spec)
        del mutant["validations"][i]
        wrong = wrong_answers(Policy(mutant, compile_))
        let_through = [what for what, expected, denials, _ in wrong if expected and not denials]
        text = " ".join((v.get("message") or v.get("messageExpression", "")).split())
        if let_through:
            print(f"  without validation {i + 1} ({text[:60]}...): allowed {let_through[0]!r}")
        else:
            survivors += 1
            print(f"FAIL without validation {i + 1} ({text[:60]}...): no request that it alone "
                  f"denies gets through", file=sys.stderr)
    n = len(validations)
    if survivors:
        print(f"admission-policy: {survivors} of {n} validations can be removed unnoticed; add a "
              f"request that only it denies", file=sys.stderr)
        return False
    print(f"admission-policy: each of the {n} validations, removed alone, lets a request through")
    return True


def main():
    args = sys.argv[1:]
    with_mutations = "--mutations" in args
    args = [a for a in args if a != "--mutations"]
    path = args[0] if args else "deploy/linkerd-cni-admission.yaml"
    spec = load(path)
    compile_ = Compiler()
    if not check(spec, compile_):
        return 1
    if with_mutations and not mutations(spec, compile_):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
