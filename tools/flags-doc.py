#!/usr/bin/env python3
"""Prints docs/flags.md from `cmpoll COMMAND --help` of the binary given (default
target/debug/cmpoll): every command's flags with their variable, default and help text.
tests/docs.rs checks that every flag --help lists is in the reference.

    python3 tools/flags-doc.py target/debug/cmpoll > docs/flags.md
"""
import re, subprocess, sys

binary = sys.argv[1] if len(sys.argv) > 1 else 'target/debug/cmpoll'

def entries(command):
    text = subprocess.run([binary, command, '--help'], capture_output=True, text=True, check=True).stdout
    about = text.split('\n\n')[1].strip()
    out, cur = [], None
    for line in text.split('Options:\n', 1)[1].splitlines():
        m = re.match(r'  (--[a-z0-9-]+)(?:, help)?(?:\s+(.*))?$', line)
        if m:
            cur = [m.group(1), (m.group(2) or '').strip()]
            out.append(cur)
        elif line.startswith('    ') and cur:
            cur[1] = (cur[1] + ' ' + line.strip()).strip()
    rows = []
    for flag, desc in out:
        if flag == '--help':
            continue
        var = ''
        m = re.search(r' \[([A-Z_]+)\]$', desc)
        if m:
            var, desc = m.group(1), desc[:m.start()]
        default = ''
        m = re.search(r' \(default: ([^()]*(?:\([^()]*\)[^()]*)*)\)$', desc)
        if m:
            default, desc = m.group(1), desc[:m.start()]
        if command == 'status' and flag == '--server-url':
            var = 'CMPOLL_SERVER_URL'  # read by settings/status.rs, not the flag table
        rows.append((flag, var, default, desc))
    return about, rows

def cell(s):
    return s.replace('|', '\\|')

print('# Flags and variables\n')
print('Every flag of every command, as `cmpoll COMMAND --help` prints it (this page is made from')
print('that output by `python3 tools/flags-doc.py target/debug/cmpoll > docs/flags.md`). Every flag')
print('of `run`, `list`, `webhook` and `serve` can also be set as its variable; the flag wins. Repeatable')
print('flags take comma-separated lists in a variable (`CMPOLL_NAMESPACE=a,b`); switches take')
print('`true` or `false`. `cmpoll sidecar` takes no flags: it reads k8s-sidecar\'s variables')
print('([migration.md](migration.md)). What the flags do together is in')
print('[configuration.md](configuration.md), [delivery.md](delivery.md) and')
print('[operations.md](operations.md).\n')
for command in ['run', 'list', 'webhook', 'serve', 'status']:
    about, rows = entries(command)
    print(f'## `cmpoll {command}`\n')
    print(about + '\n')
    print('| Flag | Variable | Default | What it does |')
    print('|---|---|---|---|')
    for flag, var, default, desc in rows:
        print(f'| `{flag}` | {("`" + var + "`") if var else ""} | {cell(default)} | {cell(desc)} |')
    print()

print("""## Other variables cmpoll reads

| Variable | Read by | What it does |
|---|---|---|
| `KUBECONFIG` | run, list | kubeconfig files, colon-separated, merged as kubectl merges them (after `--kubeconfig`) |
| `KUBERNETES_SERVICE_HOST`, `KUBERNETES_SERVICE_PORT` | run, list | in-cluster: where the apiserver is (with the files of `--service-account-dir`) |
| `HTTPS_PROXY`, `HTTP_PROXY`, `NO_PROXY` (and lower case) | run, list | the proxy to the apiserver when the kubeconfig names none, as client-go's `httpproxy` rules read them |
| `SSL_CERT_FILE` | all | the platform's CA bundle (else the usual paths) |
| `HOME` | run, list | `~/.kube/config` |
| `RUST_LOG` | all | log levels per module (`--log-level` wins) |
| `TMPDIR` | run, list | where the module spool lives without `--out-dir` |
| `POD_NAME`, `HOSTNAME` | run | `--report-events`' `reportingInstance` |
| `NOTIFY_SOCKET`, `WATCHDOG_USEC`, `WATCHDOG_PID`, `JOURNAL_STREAM` | run | systemd: sd_notify, the watchdog, log priorities in the journal |
| `MALLOC_MMAP_THRESHOLD_` | all | set: cmpoll leaves glibc's allocator as you tuned it |
| `CMPOLL_SERVER_URL`, `CMPOLL_LISTEN`, `HEALTH_PORT` | status | which daemon `cmpoll status` asks |
| `LABEL`, `LABEL_VALUE`, `FOLDER`, `RESOURCE`, `METHOD`, `REQ_URL` … | sidecar | k8s-sidecar's variables: [migration.md](migration.md) and [k8s-sidecar.md](k8s-sidecar.md) |
""")

