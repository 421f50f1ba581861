"""The Debian archive URI this machine's apt is configured with.

Read at run time so no mirror host name is ever written into the repository; used as the
default `debian_mirror` for base images the site makes itself (`patcher base-image`).
"""
from __future__ import annotations

import glob
import re
import sys


def host_debian_mirror() -> str | None:
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        for stanza in open(path, encoding="utf-8").read().split("\n\n"):
            fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.M))
            uris = fields.get("URIs", "").split()
            if fields.get("Types", "").split()[:1] == ["deb"] and uris and "security" not in uris[0]:
                return uris[0].rstrip("/")
    for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
        try:
            lines = open(path, encoding="utf-8").read().splitlines()
        except OSError:
            continue
        for line in lines:
            m = re.match(r"^deb\s+(\[[^]]*\]\s+)?(\S+)\s+\S+", line)
            if m and "security" not in m.group(2) and "debian" in m.group(2):
                return m.group(2).rstrip("/")
    return None


if __name__ == "__main__":
    uri = host_debian_mirror()
    if uri is None:
        print("no Debian archive found in apt configuration", file=sys.stderr)
        sys.exit(1)
    print(uri)
