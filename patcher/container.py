"""The container runtime: the one module that talks to the Docker engine.

Every stage that runs something in a container goes through here: the build's configure and
wheel stages, the probe of an image or of a wheel in an image, the compile check, and the
making of base images.  Two things:

* :class:`Engine` — ``Engine.connect(docker_host)`` (``DOCKER_HOST`` when not given).  An
  engine that is not running or a socket this user may not use is mapped once, here, to
  DockerUnavailableError / DockerPermissionError.  Besides containers it builds, loads, tags,
  pushes and removes images and keeps volumes.
* :class:`Container` — a context manager over one container of a :class:`ContainerConfig`
  (labels, user, CPU quota, no network unless asked, GPUs on request).  Files and whole trees
  go in owned by the container's user (the user name is looked up in the image's own
  ``/etc/passwd``), a command runs with a timeout, logs follow to a callback, files come back
  out.  The container is removed on every way out of the ``with``: success, error, timeout,
  KeyboardInterrupt and (under :func:`patcher.util.interrupts_as_exceptions`) SIGTERM.
  A process killed outright (SIGKILL, the machine's OOM killer) cannot remove its container, so
  each container is labelled with its maker (``org.patcher.owner``: the boot id, PID and start
  time of the process) and the first container a later patcher process makes on that engine
  removes the containers whose maker, on this machine, is gone (one line on stderr names them).

Failures of an operation raise :class:`ContainerError` (:class:`ContainerTimeout` for a
timeout) with the engine's own one-line reason; each stage turns them into its own error class
and exit code, since "cannot start the container" means another thing in a build than in a probe.
"""

from __future__ import annotations

import io
import os
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import docker
import docker.errors
import docker.types
import requests

from patcher.errors import DockerPermissionError, DockerUnavailableError, ImageBuildError, RegistryError

DEFAULT_SOCKET = "unix:///var/run/docker.sock"
API_TIMEOUT = 600  # seconds for one engine call (an image build streams, so it is not bounded by this)
GPU_MODES = ("auto", "all", "none")


class ContainerError(Exception):
    """An engine operation on a container or image failed; ``str()`` is one line."""


class ContainerTimeout(ContainerError):
    """The container's command ran past its time limit (it has been stopped)."""


# "<boot id>/<pid namespace>:<pid>:<start time in clock ticks>" of the process that made it: the
# PID means something only on that boot and in that PID namespace (patcher may run in a container)
OWNER_LABEL = "org.patcher.owner"


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            boot = fh.read().strip()
        namespace = os.readlink("/proc/self/ns/pid").strip("pid:[]")
    except OSError:
        return ""
    return f"{boot}/{namespace}" if boot and namespace.isdigit() else ""


def _start_ticks(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat); None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]  # fields after the command name start at 3


def owner_id(pid: int | None = None) -> str:
    """This process's owner label value ('' where /proc cannot say: such containers are never reaped)."""
    pid = os.getpid() if pid is None else pid
    boot, start = _boot_id(), _start_ticks(pid)
    return f"{boot}:{pid}:{start}" if boot and start else ""


def owner_is_gone(value: str) -> bool:
    """Whether the process a container's owner label names ran on this machine's current boot
    and has ended (its PID gone, or reused by a process that started at another time)."""
    boot, _, rest = value.partition(":")
    pid, _, start = rest.partition(":")
    if not boot or boot != _boot_id() or not pid.isdigit() or not start:
        return False
    return _start_ticks(int(pid)) != start


def short_reason(exc: BaseException) -> str:
    """The engine's own explanation of a failure, one line."""
    text = str(getattr(exc, "explanation", None) or exc).strip().splitlines()
    return (text[-1] if text else type(exc).__name__)[:300]


def _is_permission_error(exc: BaseException) -> bool:
    seen, cur = 0, exc
    while cur is not None and seen < 10:
        if isinstance(cur, PermissionError) or "Permission denied" in str(cur):
            return True
        cur, seen = cur.__cause__ or cur.__context__, seen + 1
    return False


# --- GPUs ------------------------------------------------------------------------------------------
def gpu_device_requests(mode: str, engine_has_gpus: bool) -> list[dict[str, Any]] | None:
    """The ``DeviceRequests`` of a container for ``--gpus auto|all|none``: every GPU of the engine
    (what ``docker run --gpus all`` sends) for ``all``, and for ``auto`` when the engine has a GPU
    runtime; None otherwise."""
    if mode not in GPU_MODES:
        raise ValueError(f"gpus must be one of {', '.join(GPU_MODES)}, not {mode!r}")
    if mode == "none" or (mode == "auto" and not engine_has_gpus):
        return None
    return [{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]], "Options": {}}]


def engine_has_gpus(info: dict[str, Any]) -> bool:
    """Whether ``docker info`` shows a way to hand GPUs to containers: the NVIDIA runtime, or
    CDI devices of a GPU vendor."""
    runtimes = info.get("Runtimes") or {}
    if "nvidia" in runtimes:
        return True
    cdi = info.get("DiscoveredDevices") or []
    return any(str(d.get("ID", "")).startswith(("nvidia.com/gpu", "amd.com/gpu")) for d in cdi)


# --- the engine ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ContainerInfo:
    id: str
    name: str
    status: str  # created | running | paused | restarting | exited | dead ...


class Engine:
    """One connection to a Docker engine."""

    def __init__(self, client: docker.DockerClient, where: str):
        self._reaped = False  # whether this process has looked for this engine's orphans
        self.client = client
        self.where = where
        self._info: dict[str, Any] | None = None

    @classmethod
    def connect(cls, docker_host: str | None = None) -> Engine:
        env = dict(os.environ)
        if docker_host:
            env["DOCKER_HOST"] = docker_host
        where = env.get("DOCKER_HOST") or DEFAULT_SOCKET
        try:
            client = docker.from_env(environment=env, timeout=API_TIMEOUT)
            client.ping()
        except docker.errors.DockerException as exc:
            if _is_permission_error(exc):
                raise DockerPermissionError(
                    f"no permission to use the Docker engine at {where}",
                    hint="run as a member of the docker group, or point --docker-host / DOCKER_HOST "
                         "at an engine this user may use") from None
            raise DockerUnavailableError(
                f"the Docker engine at {where} is not reachable: {short_reason(exc)}",
                hint="start the engine, or point --docker-host / DOCKER_HOST at one") from None
        return cls(client, where)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- facts
    def info(self) -> dict[str, Any]:
        if self._info is None:
            try:
                self._info = self.client.info()
            except docker.errors.APIError as exc:
                raise ContainerError(f"cannot read the engine's info: {short_reason(exc)}") from None
        return self._info

    def cpu_count(self) -> int:
        try:
            return int(self.info().get("NCPU") or os.cpu_count() or 1)
        except ContainerError:
            return os.cpu_count() or 1

    def has_gpus(self) -> bool:
        try:
            return engine_has_gpus(self.info())
        except ContainerError:
            return False

    def architecture(self) -> str:
        return str(self.client.version().get("Arch", ""))

    # -- images
    def image_id(self, ref: str) -> str | None:
        """The ID of a local image, None when there is none (images are never pulled)."""
        try:
            return self.client.api.inspect_image(ref)["Id"]
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as exc:
            raise ContainerError(f"cannot inspect image {ref}: {short_reason(exc)}") from None

    def image_labels(self, ref: str) -> dict[str, str] | None:
        try:
            return dict(self.client.api.inspect_image(ref)["Config"].get("Labels") or {})
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as exc:
            raise ContainerError(f"cannot inspect image {ref}: {short_reason(exc)}") from None

    def images_with_label(self, label: str) -> list[tuple[str, dict[str, str]]]:
        try:
            return [(img.id, dict(img.labels or {})) for img in self.client.images.list(filters={"label": label})]
        except docker.errors.APIError:
            return []

    def remove_image(self, ref: str, prune: bool = True) -> bool:
        try:
            self.client.api.remove_image(ref, noprune=not prune)
            return True
        except docker.errors.APIError:
            return False

    def build_image(self, context_tar: bytes, tag: str, what: str, labels: dict[str, str] | None = None,
                    on_log: Callable[[str], None] | None = None) -> str:
        """Build with the classic builder from a context tar, streaming the log; the image ID.
        ``rm``/``forcerm`` remove the step containers even when a step fails or the client goes."""
        tail: list[str] = []
        image_id = None
        try:
            stream = self.client.api.build(fileobj=io.BytesIO(context_tar), custom_context=True, tag=tag,
                                           labels=dict(labels or {}), rm=True, forcerm=True, decode=True)
            for item in stream:
                text = item.get("stream")
                if text:
                    tail = (tail + [text.rstrip("\n")])[-20:]
                    if on_log:
                        on_log(text)
                if item.get("error"):
                    last = next((ln for ln in reversed(tail) if ln.strip()), "")
                    raise ImageBuildError(f"docker build of {what} failed: {item['error'].strip()}"
                                          + (f" (last output: {last.strip()[:200]})" if last else ""))
                if (item.get("aux") or {}).get("ID"):
                    image_id = item["aux"]["ID"]
        except docker.errors.APIError as exc:
            raise ImageBuildError(f"docker build of {what} failed: {short_reason(exc)}") from None
        if not image_id:
            raise ImageBuildError(f"docker build of {what} reported no image ID")
        return image_id

    def load_image(self, archive: Path) -> None:
        """``docker load`` of an image archive."""
        try:
            with open(archive, "rb") as fh:
                for item in self.client.api.load_image(fh, quiet=True):
                    if isinstance(item, dict) and item.get("error"):
                        raise ImageBuildError(f"docker load failed: {item['error']}")
        except docker.errors.APIError as exc:
            raise ImageBuildError(f"docker load failed: {short_reason(exc)}") from None

    def push(self, local_tag: str, repository: str, tag: str) -> str:
        """Tag ``local_tag`` as ``repository:tag``, push it, drop that tag again; the pushed digest."""
        digest = None
        try:
            self.client.api.tag(local_tag, repository, tag=tag)
            for item in self.client.api.push(repository, tag=tag, stream=True, decode=True):
                if item.get("error"):
                    raise RegistryError(f"push of {repository}:{tag} failed: {item['error'].strip()}",
                                        hint="check that the registry is running and accepts pushes")
                aux = item.get("aux") or {}
                if aux.get("Digest"):
                    digest = aux["Digest"]
        except docker.errors.APIError as exc:
            raise RegistryError(f"push of {repository}:{tag} failed: {short_reason(exc)}") from None
        finally:
            self.remove_image(f"{repository}:{tag}", prune=False)  # the qualified tag only carried the push
        if not digest:
            raise RegistryError(f"push of {repository}:{tag} reported no digest")
        return digest

    # -- volumes
    def ensure_volume(self, name: str, labels: dict[str, str]) -> None:
        try:
            self.client.volumes.get(name)
        except docker.errors.NotFound:
            try:
                self.client.volumes.create(name=name, labels=labels)
            except docker.errors.APIError as exc:
                raise ContainerError(f"cannot create volume {name}: {short_reason(exc)}") from None
        except docker.errors.APIError as exc:
            raise ContainerError(f"cannot inspect volume {name}: {short_reason(exc)}") from None

    def remove_volume(self, name: str) -> None:
        try:
            self.client.volumes.get(name).remove(force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            raise ContainerError(f"cannot remove volume {name}: {short_reason(exc)}") from None

    # -- containers left by others
    def containers_with_label(self, label: str) -> list[ContainerInfo]:
        try:
            found = self.client.api.containers(all=True, filters={"label": label})
        except docker.errors.APIError:
            return []
        return [ContainerInfo(c["Id"], (c.get("Names") or ["/?"])[0].lstrip("/"), c.get("State", "")) for c in found]

    def reap_orphans(self) -> list[str]:
        """Remove every container whose maker (OWNER_LABEL) ran on this machine and is gone; the
        names removed.  Never raises: a container that cannot go now is tried again next time."""
        try:
            found = self.client.api.containers(all=True, filters={"label": OWNER_LABEL})
        except (docker.errors.APIError, requests.exceptions.RequestException):
            return []
        removed = []
        for entry in found:
            if owner_is_gone((entry.get("Labels") or {}).get(OWNER_LABEL, "")):
                try:
                    self.client.api.remove_container(entry["Id"], force=True)
                except docker.errors.NotFound:
                    pass
                except (docker.errors.APIError, requests.exceptions.RequestException):
                    continue
                removed.append((entry.get("Names") or ["/?"])[0].lstrip("/"))
        return removed

    def reap_orphans_once(self) -> list[str]:
        """:meth:`reap_orphans` the first time this process asks; nothing (no engine call) after."""
        if self._reaped:
            return []
        self._reaped = True
        return self.reap_orphans()

    def remove_container(self, container_id: str) -> None:
        try:
            self.client.api.remove_container(container_id, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            raise ContainerError(f"cannot remove container {container_id[:12]}: {short_reason(exc)}") from None


# --- one container ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ContainerConfig:
    image: str
    command: tuple[str, ...] = ("sleep", "infinity")  # the default keeps it up for exec()
    user: str | None = None  # None: the image's own user
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    name: str | None = None
    cpus: float | None = None  # CPU quota; None: no limit
    network: bool = False  # the network is off unless a stage needs it
    gpus: str = "none"  # auto | all | none
    volumes: dict[str, str] = field(default_factory=dict)  # volume name -> mount path
    entrypoint: tuple[str, ...] | None = ()  # () clears the image's entrypoint


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    output: str
    seconds: float


class Container:
    """``with Container(engine, config) as c: c.put_files(...); c.start(); c.wait(timeout)``."""

    def __init__(self, engine: Engine, config: ContainerConfig):
        self.engine = engine
        self.config = config
        self.id: str | None = None
        self.name: str | None = config.name
        self.gpus_requested = False
        self._owner: tuple[int, int] | None = None
        self._log_thread: threading.Thread | None = None
        self._started = False
        self._pending_log: Callable[[str], None] | None = None

    # -- lifecycle
    def __enter__(self) -> Container:
        cfg = self.config
        requests_ = gpu_device_requests(cfg.gpus, self.engine.has_gpus() if cfg.gpus == "auto" else False)
        self.gpus_requested = requests_ is not None
        api = self.engine.client.api
        gone = self.engine.reap_orphans_once()
        if gone:
            print(f"patcher: removed {len(gone)} container(s) whose patcher process is gone: "
                  f"{', '.join(sorted(gone))}", file=sys.stderr, flush=True)
        labels = dict(cfg.labels)
        owner = owner_id()
        if owner:
            labels[OWNER_LABEL] = owner
        try:
            host_config = api.create_host_config(
                network_mode="bridge" if cfg.network else "none", init=True,
                nano_cpus=int(cfg.cpus * 1e9) if cfg.cpus else None,
                binds={name: {"bind": path, "mode": "rw"} for name, path in cfg.volumes.items()} or None,
                device_requests=[docker.types.DeviceRequest(**_snake(r)) for r in requests_] if requests_ else None)
            created = api.create_container(
                cfg.image, command=list(cfg.command), user=cfg.user or "", environment=dict(cfg.env),
                working_dir=cfg.workdir, labels=labels, name=cfg.name, host_config=host_config,
                entrypoint=list(cfg.entrypoint) if cfg.entrypoint is not None else None,
                network_disabled=not cfg.network)
        except docker.errors.ImageNotFound:
            raise ContainerError(f"image {cfg.image} is not on this engine (images are never pulled)") from None
        except docker.errors.APIError as exc:
            raise ContainerError(f"cannot create a container of {cfg.image}: {short_reason(exc)}") from None
        self.id = created["Id"]
        self.name = self.name or self.id[:12]
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def remove(self) -> None:
        """Remove the container (killing what runs in it); never raises over another error."""
        if self.id is None:
            return
        container_id, self.id = self.id, None
        for attempt in range(3):
            try:
                self.engine.client.api.remove_container(container_id, force=True)
                break
            except docker.errors.NotFound:
                break
            except (docker.errors.APIError, requests.exceptions.RequestException):
                time.sleep(0.5 * (attempt + 1))  # "removal already in progress" and the like
        if self._log_thread is not None:
            self._log_thread.join(timeout=10)

    # -- files in
    def owner(self) -> tuple[int, int]:
        """uid and gid the container runs as: numeric from the user setting or the image's, a
        name looked up in the container's own /etc/passwd; root when nothing is set."""
        if self._owner is None:
            user = self.config.user
            if user is None:
                user = (self.engine.client.api.inspect_container(self.id)["Config"].get("User") or "")
            self._owner = self._resolve_user(user)
        return self._owner

    def _resolve_user(self, user: str) -> tuple[int, int]:
        name, _, group = user.partition(":")
        if not name:
            return 0, 0
        passwd = (self.read_file("/etc/passwd") or b"").decode("utf-8", "replace")
        entries = {p[0]: (int(p[2]), int(p[3])) for p in (ln.split(":") for ln in passwd.splitlines())
                   if len(p) > 3 and p[2].isdigit() and p[3].isdigit()}
        if name.isdigit():
            uid = int(name)
            gid = next((g for u, g in entries.values() if u == uid), uid)
        elif name in entries:
            uid, gid = entries[name]
        else:
            raise ContainerError(f"user {name} does not exist in image {self.config.image}")
        if group:
            if group.isdigit():
                gid = int(group)
            else:
                groups = (self.read_file("/etc/group") or b"").decode("utf-8", "replace")
                found = [p[2] for p in (ln.split(":") for ln in groups.splitlines()) if p[0] == group]
                if not found or not found[0].isdigit():
                    raise ContainerError(f"group {group} does not exist in image {self.config.image}")
                gid = int(found[0])
        return uid, gid

    def put_archive(self, dest: str, archive: bytes | IO[bytes]) -> None:
        """Unpack a tar (its owners as they are in it) under ``dest``."""
        try:
            self.engine.client.api.put_archive(self.id, dest, archive)
        except docker.errors.APIError as exc:
            raise ContainerError(f"cannot copy files into {self.name}:{dest}: {short_reason(exc)}") from None

    def put_files(self, dest: str, files: dict[str, bytes | Path], mode: int = 0o644) -> None:
        """Put files (name relative to ``dest`` -> content or host path) into the container, every
        file and directory owned by the container's user."""
        uid, gid = self.owner()
        buf = io.BytesIO()
        dirs: set[str] = set()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(files):
                parts = name.split("/")[:-1]
                for i in range(1, len(parts) + 1):
                    d = "/".join(parts[:i])
                    if d not in dirs:
                        dirs.add(d)
                        tar.addfile(_tar_entry(d, tarfile.DIRTYPE, 0o755, uid, gid))
                content = files[name]
                if isinstance(content, Path):
                    with open(content, "rb") as fh:
                        tar.addfile(_tar_entry(name, tarfile.REGTYPE, mode, uid, gid, content.stat().st_size), fh)
                else:
                    tar.addfile(_tar_entry(name, tarfile.REGTYPE, mode, uid, gid, len(content)), io.BytesIO(content))
        self.put_archive(dest, buf.getvalue())

    # -- running
    def start(self) -> None:
        try:
            self.engine.client.api.start(self.id)
        except docker.errors.APIError as exc:
            raise ContainerError(f"cannot start {self.name}: {short_reason(exc)}") from None
        self._started = True
        if self._pending_log is not None:
            on_text, self._pending_log = self._pending_log, None
            self.follow_logs(on_text)

    def wait(self, timeout: float) -> int:
        """Wait for the command to end; its exit status.  Past ``timeout`` it is killed and
        :class:`ContainerTimeout` raised."""
        try:
            return int(self.engine.client.api.wait(self.id, timeout=timeout)["StatusCode"])
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            self._kill()
            raise ContainerTimeout(f"ran past {timeout:g} s and was stopped") from None
        except docker.errors.APIError as exc:
            raise ContainerError(f"lost {self.name}: {short_reason(exc)}") from None

    def _kill(self) -> None:
        try:
            self.engine.client.api.kill(self.id)
        except docker.errors.APIError:
            pass

    def follow_logs(self, on_text: Callable[[str], None]) -> None:
        """Send the container's output to ``on_text`` as it comes, from a thread that ends with the
        container.  Asked before ``start()``, it attaches when the container starts (a log stream
        opened on a container not yet running can end at once, before any output)."""
        if not self._started:
            self._pending_log = on_text
            return

        def follow() -> None:
            try:
                for chunk in self.engine.client.api.logs(self.id, stream=True, follow=True):
                    on_text(chunk.decode("utf-8", "replace"))
            except Exception:  # noqa: BLE001 - the container went away (removed on error or interrupt)
                pass

        self._log_thread = threading.Thread(target=follow, daemon=True, name=f"logs-{self.name}")
        self._log_thread.start()

    def wait_for_logs(self, timeout: float = 30) -> None:
        if self._log_thread is not None:
            self._log_thread.join(timeout=timeout)

    def logs(self) -> str:
        try:
            return self.engine.client.api.logs(self.id, stdout=True, stderr=True).decode("utf-8", "replace")
        except docker.errors.APIError as exc:
            raise ContainerError(f"cannot read the log of {self.name}: {short_reason(exc)}") from None

    def exec(self, argv: list[str], workdir: str | None = None, env: dict[str, str] | None = None,
             timeout: float | None = None) -> ExecResult:
        """Run ``argv`` in the running container (killed past ``timeout`` by coreutils' timeout,
        exit 124/137 then); output is stdout and stderr together."""
        if timeout:
            argv = ["timeout", "--kill-after=10", str(int(timeout)), *argv]
        started = time.monotonic()
        api = self.engine.client.api
        try:
            exec_id = api.exec_create(self.id, argv, workdir=workdir, environment=env or {})["Id"]
            output = api.exec_start(exec_id)
            code = api.exec_inspect(exec_id).get("ExitCode")
        except docker.errors.APIError as exc:
            raise ContainerError(f"cannot run {argv[0]} in {self.name}: {short_reason(exc)}") from None
        return ExecResult(int(code if code is not None else -1), (output or b"").decode("utf-8", "replace"),
                          time.monotonic() - started)

    # -- files out
    def read_file(self, path: str) -> bytes | None:
        """One file's content, None when it does not exist."""
        try:
            stream, _ = self.engine.client.api.get_archive(self.id, path)
        except docker.errors.NotFound:
            return None
        except docker.errors.APIError as exc:
            raise ContainerError(f"cannot read {path} from {self.name}: {short_reason(exc)}") from None
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.next()
            data = tar.extractfile(member) if member is not None and member.isfile() else None
            return data.read() if data else None

    def copy_out(self, path: str, into: IO[bytes]) -> None:
        """The tar of ``path`` (a file or a directory), streamed into a file object."""
        try:
            stream, _ = self.engine.client.api.get_archive(self.id, path)
            for chunk in stream:
                into.write(chunk)
        except docker.errors.NotFound:
            raise ContainerError(f"{path} does not exist in {self.name}") from None
        except docker.errors.APIError as exc:
            raise ContainerError(f"cannot read {path} from {self.name}: {short_reason(exc)}") from None


def _tar_entry(name: str, kind: bytes, mode: int, uid: int, gid: int, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.uid, info.gid = kind, mode, size, uid, gid
    info.mtime = 0
    return info


def _snake(request: dict[str, Any]) -> dict[str, Any]:
    """``{"Count": -1}`` -> ``{"count": -1}``: the wire form back into DeviceRequest's arguments."""
    names = {"Driver": "driver", "Count": "count", "DeviceIDs": "device_ids", "Capabilities": "capabilities",
             "Options": "options"}
    return {names[k]: v for k, v in request.items() if v is not None}
