"""The Python `kubernetes` client against the test apiserver (driven by python.rs).

Prints one JSON object per step on stdout. Before the expired-token step it prints
{"step": "expire"} and waits for a line on stdin, so the Rust side can expire the
continue tokens between the two pages.
"""
import json
import sys

from kubernetes import client, config


def out(**kv):
    print(json.dumps(kv), flush=True)


def names(lst):
    return sorted(f"{i.metadata.namespace}/{i.metadata.name}" for i in lst.items)


config.load_kube_config(config_file=sys.argv[1])
v1 = client.CoreV1Api()

out(step="all", names=names(v1.list_config_map_for_all_namespaces(label_selector="tier in (web,db),!legacy")))
out(step="namespaced", names=names(v1.list_namespaced_config_map("apps", label_selector="tier=web")))

seen, token, pages = [], None, 0
while True:
    page = v1.list_config_map_for_all_namespaces(limit=2, _continue=token)
    pages += 1
    seen += names(page)
    token = page.metadata._continue
    if not token:
        break
out(step="paged", names=sorted(seen), pages=pages)

try:
    v1.list_namespaced_config_map("apps", label_selector="a b")
    out(step="bad-selector", status=None)
except client.ApiException as e:
    out(step="bad-selector", status=e.status, message=json.loads(e.body)["message"])

first = v1.list_namespaced_config_map("apps", limit=1)
out(step="expire")
sys.stdin.readline()
try:
    v1.list_namespaced_config_map("apps", limit=1, _continue=first.metadata._continue)
    out(step="expired", status=None)
except client.ApiException as e:
    body = json.loads(e.body)
    out(step="expired", status=e.status, reason=body["reason"], fresh=bool(body["metadata"].get("continue")))
