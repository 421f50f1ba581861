"""`patcher build` on the stand-in (tests/fixtures/standin.py), side by side in one run:

1. ccache: the wheel stage of a cold build (builder image absent, empty ccache volume) against
   a rebuild after changing one patch (one translation unit changes) with the ccache volume the
   cold build filled.  Ratio = cold / warm, for the wheel stage and for the whole build.
2. kept build tree (``--keep-build-tree``): the same one-patch rebuild where the build tree of
   the previous build (CMake/ninja state, objects) is kept in a volume and only the changed
   files are written into it, so only the changed unit recompiles.  Ratio = cold / kept, for
   the wheel stage, configure + wheel, and the whole build; the kept build's wheel must be the
   fresh tree's (same sha256).
3. image reuse: the image stage of the cold build (docker build of the builder image) against
   the second build of the unchanged spec (the Dockerfile hash names an image that exists, so
   the build is skipped).  Ratio = built / reused.

Needs the Docker engine and a local bullseye base image pinned by digest: an image labelled
``org.patcher.test-base=bullseye-v1`` (made by the docker tests' session fixtures, or here with
``patcher.baseimage`` when absent) that carries a repo digest.  Everything the benchmark creates
(ccache volumes, builder images, a registry if it had to start one) is removed at the end.
"""

from __future__ import annotations

import io
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

BASE_LABEL = ("org.patcher.test-base", "bullseye-v1")
BASE_TAG = "patcher-test/debian:bullseye-minbase"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pinned_base(client, scratch: Path) -> tuple[str, subprocess.Popen | None]:
    """A ``ref@sha256:`` of a local bullseye base image; starts a loopback registry only if the
    image has no repo digest yet (the caller stops it)."""
    import docker

    from patcher.baseimage import BaseImageRequest, make_base_image, push_image
    from patcher.config import Settings
    from patcher.container import Engine

    engine = Engine(client, "the benchmark engine")

    try:
        image = client.images.get(BASE_TAG)
    except docker.errors.ImageNotFound:
        image = None
    if image is None or (image.labels or {}).get(BASE_LABEL[0]) != BASE_LABEL[1]:
        make_base_image(BaseImageRequest(suite="bullseye", tag=BASE_TAG, labels=dict([BASE_LABEL])), Settings(),
                        engine=engine)
        image = client.images.get(BASE_TAG)
    for digest_ref in image.attrs.get("RepoDigests") or []:
        repo, digest = digest_ref.split("@")
        return f"{repo}:bench@{digest}", None
    port = _free_port()
    config = scratch / "registry.yml"
    config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {scratch / 'registry'}\n"
                      f"http:\n  addr: 127.0.0.1:{port}\n")
    registry = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    time.sleep(2)
    pinned = push_image(engine, image.tags[0] if image.tags else image.id, f"127.0.0.1:{port}")
    return pinned, registry


def _build(standin, work: Path, cache: Path, volume: str, keep_tree: bool = False):
    from patcher.builder import BuildOptions, build

    settings = standin.settings(work_dir=str(work), cache_dir=str(cache))
    options = BuildOptions(torch="1.4.0", cuda="none", python="3.9", jobs=2, until="wheel", ccache_volume=volume,
                           keep_build_tree=keep_tree)
    started = time.perf_counter()
    result = build(settings, options, stream=io.StringIO(), tty=False)
    return result, time.perf_counter() - started


def _tree_volume(work: Path, result) -> str:
    import json

    return json.loads(result.record.read_text())["build_tree"]["volume"]


def run() -> dict:
    import docker

    from tests.fixtures.standin import make_standin

    client = docker.from_env()
    scratch = Path(tempfile.mkdtemp(prefix="patcher-bench-build-"))
    volume = f"patcher-bench-ccache-{uuid.uuid4().hex[:8]}"
    registry = None
    made_images: set[str] = set()
    tree_volume = None
    try:
        pinned, registry = _pinned_base(client, scratch)
        standin = make_standin(scratch / "standin", image_override=pinned)
        cache = scratch / "cache"

        from patcher.dockerfile import render
        from patcher.spec import resolve

        settings = standin.settings(cache_dir=str(cache))
        tag = render(resolve(settings, "1.4.0", cuda="none", python="3.9"), settings).image_tag
        try:
            client.images.remove(tag)  # a cold build builds its image
        except docker.errors.ImageNotFound:
            pass

        cold, cold_s = _build(standin, scratch / "work-cold", cache, volume)
        made_images.add(tag)
        again, again_s = _build(standin, scratch / "work-again", cache, volume)
        kept_first, _ = _build(standin, scratch / "work-kept", cache, volume, keep_tree=True)
        tree_volume = _tree_volume(scratch / "work-kept", kept_first)

        patch = next((standin.catalog / "patches" / "1.4.0").glob("0090-*.patch"))
        patch.write_text(patch.read_text().replace("+  return a + b;", "+  return b + a;"))
        changed, changed_s = _build(standin, scratch / "work-patch", cache, volume)
        assert changed.wheel_sha256 != cold.wheel_sha256, "the changed patch did not change the wheel"
        kept, kept_s = _build(standin, scratch / "work-kept", cache, volume, keep_tree=True)
        assert kept.wheel_sha256 == changed.wheel_sha256, "the kept tree's wheel differs from the fresh tree's"

        d_cold, d_again, d_changed = cold.stage_durations, again.stage_durations, changed.stage_durations
        d_kept = kept.stage_durations
        both = ("configure", "wheel")
        return {
            "what": "stand-in (4 std::regex units + 2 small ones), --jobs 2, this machine",
            "ccache": {
                "cold_wheel_stage_s": round(d_cold["wheel"], 2),
                "one_patch_changed_warm_ccache_wheel_stage_s": round(d_changed["wheel"], 2),
                "ratio_wheel_stage": round(d_cold["wheel"] / d_changed["wheel"], 2),
                "cold_build_total_s": round(cold_s, 2),
                "one_patch_changed_total_s": round(changed_s, 2),
                "ratio_total": round(cold_s / changed_s, 2),
            },
            "kept_build_tree": {
                "one_patch_changed_kept_tree_wheel_stage_s": round(d_kept["wheel"], 2),
                "ratio_wheel_stage_cold_over_kept": round(d_cold["wheel"] / d_kept["wheel"], 2),
                "ratio_wheel_stage_fresh_tree_over_kept": round(d_changed["wheel"] / d_kept["wheel"], 2),
                "ratio_configure_and_wheel_cold_over_kept": round(sum(d_cold[s] for s in both)
                                                                  / sum(d_kept[s] for s in both), 2),
                "one_patch_changed_kept_tree_total_s": round(kept_s, 2),
                "ratio_total": round(cold_s / kept_s, 2),
                "same_wheel_as_fresh_tree": kept.wheel_sha256 == changed.wheel_sha256,
            },
            "image_reuse": {
                "image_stage_built_s": round(d_cold["image"], 2),
                "image_stage_reused_s": round(d_again["image"], 3),
                "ratio": round(d_cold["image"] / max(d_again["image"], 1e-3), 1),
                "second_build_reused_image": again.image_reused,
                "second_build_total_s": round(again_s, 2),
            },
        }
    finally:
        for tag in made_images:
            try:
                client.images.remove(tag)
            except docker.errors.APIError:
                pass
        for name in (volume, tree_volume):
            try:
                if name:
                    client.volumes.get(name).remove(force=True)
            except docker.errors.NotFound:
                pass
        if registry is not None:
            registry.terminate()
            registry.wait(timeout=10)
        shutil.rmtree(scratch, ignore_errors=True)
        client.close()


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
