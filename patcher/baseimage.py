"""Base images a site makes itself: mmdebstrap -> a reproducible image -> optional push.

The OS images the matrix pins by digest can disappear (NVIDIA's CUDA 9/10 images did), and an
air-gapped site cannot pull at all.  ``patcher base-image`` rebuilds a Debian image from a
Debian archive (the site's mirror) and prints the digest to put in ``[overrides.images]``.

Reproducible by construction: mmdebstrap honours ``SOURCE_DATE_EPOCH`` (fixed mtimes, no
machine-specific files), and instead of ``docker import`` (which stamps the current time into
the image config, so every run would give another image ID) we assemble a ``docker save``-style
archive with a fixed ``created`` date and ``docker load`` it.  The same archive content thus
gives the same image ID, and the same pushed manifest, on every run.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from patcher.config import Settings
from patcher.container import Engine
from patcher.errors import ConfigError, ImageBuildError
from patcher.util import sha256_file

# 2021-08-14, the release date of Debian 11 "bullseye": a fixed date, not the time of the build.
DEFAULT_SOURCE_DATE_EPOCH = 1628899200
DEFAULT_PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LABEL_PREFIX = "org.patcher.base-image"


@dataclass(frozen=True)
class BaseImageRequest:
    suite: str
    mirror_url: str | None = None  # None: settings.debian_mirror, then the host's apt configuration
    tag: str | None = None  # None: patcher-base/debian:<suite>
    push: str | None = None  # registry host[:port] to push to
    variant: str = "minbase"
    include: tuple[str, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    source_date_epoch: int = DEFAULT_SOURCE_DATE_EPOCH

    @property
    def local_tag(self) -> str:
        return self.tag or f"patcher-base/debian:{self.suite}"


@dataclass(frozen=True)
class BaseImageResult:
    tag: str
    image_id: str  # sha256:<config digest>: equal for equal content
    rootfs_sha256: str  # the layer's diff id
    mirror_url: str
    pushed: str | None = None  # "registry/repo:tag@sha256:..." when pushed

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------------------------------------
def debian_mirror(settings: Settings, mirror_url: str | None = None) -> str:
    """The Debian archive to bootstrap from: flag, then settings, then this host's apt."""
    if mirror_url:
        return mirror_url.rstrip("/")
    if settings.debian_mirror:
        return settings.debian_mirror.rstrip("/")
    if settings.mirror:
        return settings.mirror.rstrip("/") + "/debian"
    from patcher.hostapt import host_debian_mirror

    found = host_debian_mirror()
    if not found:
        raise ConfigError("no Debian mirror configured and none found in this machine's apt configuration",
                          hint="pass --mirror-url or set debian_mirror")
    return found


def bootstrap_rootfs(suite: str, mirror_url: str, dest: Path, *, variant: str = "minbase",
                     include: tuple[str, ...] = (), source_date_epoch: int = DEFAULT_SOURCE_DATE_EPOCH) -> None:
    """Run mmdebstrap into a tarball at ``dest`` (written under a temp name, then renamed)."""
    if shutil.which("mmdebstrap") is None:
        raise ImageBuildError("mmdebstrap is not installed", hint="apt-get install mmdebstrap")
    part = dest.with_name(dest.name + ".part")
    cmd = ["mmdebstrap", f"--variant={variant}", "--format=tar", "--skip=output/dev", "--quiet"]
    if include:
        cmd.append("--include=" + ",".join(include))
    cmd += [suite, str(part), mirror_url]
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(source_date_epoch))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    except OSError as exc:
        part.unlink(missing_ok=True)
        raise ImageBuildError(f"mmdebstrap could not run: {exc}") from None
    if proc.returncode != 0:
        part.unlink(missing_ok=True)
        last = next((ln for ln in reversed(proc.stderr.strip().splitlines()) if ln.strip()), "no output")
        raise ImageBuildError(f"mmdebstrap {suite} from {mirror_url} failed (exit {proc.returncode}): {last}",
                              hint="check the suite name and that the mirror serves it")
    os.replace(part, dest)


def image_config(rootfs_sha256: str, *, architecture: str, labels: dict[str, str], epoch: int,
                 created_by: str) -> bytes:
    """The image config JSON (its sha256 is the image ID), byte-stable for equal inputs."""
    created = datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    config = {
        "architecture": architecture,
        "os": "linux",
        "created": created,
        "config": {"Env": [DEFAULT_PATH_ENV], "Cmd": ["bash"], "Labels": dict(sorted(labels.items()))},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{rootfs_sha256}"]},
        "history": [{"created": created, "created_by": created_by}],
    }
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def write_image_archive(rootfs: Path, archive: Path, tag: str, config: bytes, rootfs_sha256: str,
                        epoch: int) -> None:
    """A `docker load` archive (manifest.json + config + one layer) with fixed metadata."""
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_name = f"{rootfs_sha256}/layer.tar"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": [layer_name]}]).encode()

    def info(name: str, size: int) -> tarfile.TarInfo:
        ti = tarfile.TarInfo(name)
        ti.size, ti.mtime, ti.mode, ti.uid, ti.gid = size, epoch, 0o644, 0, 0
        return ti

    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info(config_name, len(config)), io.BytesIO(config))
        with open(rootfs, "rb") as fh:
            tar.addfile(info(layer_name, rootfs.stat().st_size), fh)
        tar.addfile(info("manifest.json", len(manifest)), io.BytesIO(manifest))


def split_ref(ref: str) -> tuple[str | None, str, str]:
    """'host:5000/a/b:tag' -> ('host:5000', 'a/b', 'tag'); a first part without '.', ':' or
    'localhost' is a Docker Hub path, not a registry host."""
    name, tag = ref, "latest"
    if "@" in name:
        name = name.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = name.rsplit(":", 1)
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first, rest, tag
    return None, name, tag


def push_image(engine: Engine, local_tag: str, registry: str) -> str:
    """Tag ``local_tag`` into ``registry`` and push it; returns ``repo:tag@sha256:...``."""
    _host, path, tag = split_ref(local_tag)
    repository = f"{registry.rstrip('/')}/{path}"
    digest = engine.push(local_tag, repository, tag)
    return f"{repository}:{tag}@{digest}"


def make_base_image(request: BaseImageRequest, settings: Settings, engine: Engine | None = None) -> BaseImageResult:
    """mmdebstrap -> reproducible image archive -> docker load -> (push); nothing left on failure."""
    mirror_url = debian_mirror(settings, request.mirror_url)
    engine = engine or Engine.connect(settings.docker_host)
    machine = engine.architecture()
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)
    tmp = Path(tempfile.mkdtemp(prefix="patcher-base-image-"))
    try:
        rootfs = tmp / "rootfs.tar"
        bootstrap_rootfs(request.suite, mirror_url, rootfs, variant=request.variant,
                         include=request.include, source_date_epoch=request.source_date_epoch)
        rootfs_sha = sha256_file(rootfs)
        labels = {
            f"{LABEL_PREFIX}.suite": request.suite,
            f"{LABEL_PREFIX}.variant": request.variant,
            f"{LABEL_PREFIX}.include": ",".join(request.include),
            f"{LABEL_PREFIX}.rootfs-sha256": rootfs_sha,
            **request.labels,
        }
        created_by = (f"patcher base-image: mmdebstrap --variant={request.variant} {request.suite}"
                      + (f" --include={','.join(request.include)}" if request.include else ""))
        config = image_config(rootfs_sha, architecture=arch, labels=labels,
                              epoch=request.source_date_epoch, created_by=created_by)
        archive = tmp / "image.tar"
        write_image_archive(rootfs, archive, request.local_tag, config, rootfs_sha, request.source_date_epoch)
        rootfs.unlink()
        engine.load_image(archive)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    image_id = "sha256:" + hashlib.sha256(config).hexdigest()
    pushed = push_image(engine, request.local_tag, request.push) if request.push else None
    return BaseImageResult(tag=request.local_tag, image_id=image_id, rootfs_sha256=rootfs_sha,
                           mirror_url=mirror_url, pushed=pushed)
