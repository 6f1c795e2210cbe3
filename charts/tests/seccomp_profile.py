"""The ebpf_exporter container's seccomp profile (charts/blockstack-merges/files/seccomp/), made
from podman's default profile (containers-common's /usr/share/containers/seccomp.json, the moby
format Kubernetes' `Localhost` profiles use too):

    seccomp_profile.py DEFAULT_JSON OUT_JSON [--caps CAP_BPF,CAP_PERFMON] [--allow bpf,...] [--log]

The default's rules that depend on capabilities or architectures are resolved for the container's
capabilities (--caps) on x86_64: the profile is flat, every runtime reads it the same way. --allow
names the syscalls the default refuses that the exporter needs, moved from their refusing rule to
one allowing rule. --log turns every refusal (the default action and the explicit refusals) into
SCMP_ACT_LOG: the program runs as if unconfined and the kernel logs each syscall the profile would
have refused (`audit: type=1326 ... syscall=N`); how the --allow list was found (docs/kubernetes.md).
"""

import argparse
import json

ARCH = "amd64"  # containers-common's name for x86_64 in `includes.arches`
EXPLAINED = "what ebpf_exporter needs beyond podman's default: loading and attaching BPF programs"


def applies(rule, caps, arch=ARCH):
    """Whether a rule of the default applies to a container with `caps` on `arch`."""
    inc, exc = rule.get("includes") or {}, rule.get("excludes") or {}
    if inc.get("caps") and not set(inc["caps"]) <= caps:
        return False
    if inc.get("arches") and arch not in inc["arches"]:
        return False
    if exc.get("caps") and set(exc["caps"]) & caps:
        return False
    if exc.get("arches") and arch in exc["arches"]:
        return False
    return True


def flat(rule, drop=()):
    out = {"names": [n for n in rule["names"] if n not in drop], "action": rule["action"]}
    if rule.get("args"):
        out["args"] = rule["args"]
    if rule.get("errnoRet") is not None:
        out["errnoRet"] = rule["errnoRet"]
    return out


def profile(default, caps, allow=(), log=False):
    """The flat profile for a container with `caps`, `allow` allowed, every refusal logged
    instead when `log`."""
    arch = default["archMap"][0]
    rules = [flat(r, drop=allow) for r in default["syscalls"] if applies(r, caps)]
    rules = [r for r in rules if r["names"]]
    if allow:
        rules.append({"names": sorted(allow), "action": "SCMP_ACT_ALLOW", "comment": EXPLAINED})
    out = {
        "defaultAction": default["defaultAction"],
        "defaultErrnoRet": default.get("defaultErrnoRet"),
        "architectures": [arch["architecture"], *arch["subArchitectures"]],
        "syscalls": rules,
    }
    if log:
        out["defaultAction"] = "SCMP_ACT_LOG"
        out.pop("defaultErrnoRet")
        for r in rules:
            if r["action"] == "SCMP_ACT_ERRNO":
                r["action"] = "SCMP_ACT_LOG"
                r.pop("errnoRet", None)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("default")
    p.add_argument("out")
    p.add_argument("--caps", default="CAP_BPF,CAP_PERFMON")
    p.add_argument("--allow", default="")
    p.add_argument("--log", action="store_true")
    a = p.parse_args(argv)
    with open(a.default) as f:
        default = json.load(f)
    caps = set(filter(None, a.caps.split(",")))
    allow = tuple(filter(None, a.allow.split(",")))
    with open(a.out, "w") as f:
        json.dump(profile(default, caps, allow, a.log), f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
