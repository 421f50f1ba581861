"""One exception family; every class carries its own exit code.

A user mistake or a bad environment raises a PatcherError subclass: the CLI prints
``patcher: error: <message>`` on one line and exits with ``exit_code``; no traceback.
Codes are grouped by stage (1x spec, 2x fetch, 3x patch, 4x build, 5x probe, 6x evidence,
7x publish, 8x mirror, 9x compile-check). Never reuse a code: scripts depend on them.
"""

from __future__ import annotations


class PatcherError(Exception):
    """Base class. ``hint`` is the way out, appended to the message."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


# --- configuration and spec resolution (1x) ---------------------------------------------
class ConfigError(PatcherError):
    exit_code = 10


class MatrixFormatError(ConfigError):
    """The version matrix parses as TOML but lacks a table or key, or holds a value of the wrong type."""

    exit_code = 17


class InvalidSettingError(ConfigError):
    """A flag, environment variable or config key whose value breaks its rule (patcher/setting_rules.py)."""

    exit_code = 19


class CommandUsageError(PatcherError):
    """The command line itself is wrong (click's usage errors), in patcher's one-line format."""

    exit_code = 2


class UnknownOptionError(CommandUsageError):
    exit_code = 3


class MissingOptionError(CommandUsageError):
    exit_code = 4


class BadOptionValueError(CommandUsageError):
    exit_code = 5


class UnknownVersionError(PatcherError):
    exit_code = 11


class UnsupportedCombinationError(PatcherError):
    """A combination the matrix refuses (Spack's ``conflicts``): python, arch, gcc, cuda."""

    exit_code = 12


class UnpinnedInputError(PatcherError):
    """An external input with no known checksum or digest: the user must pin it."""

    exit_code = 13


class RegistryError(PatcherError):
    """A registry could not resolve a tag to a digest (patcher lock)."""

    exit_code = 14


class TemplateError(PatcherError):
    exit_code = 15


class DockerfileInjectionError(PatcherError):
    """A value would change the rendered Dockerfile's instructions (a new line, a quote break-out,
    another FROM) or cannot be written safely where the template puts it."""

    exit_code = 18


class OutputWriteError(PatcherError):
    """A file the command writes (rendered Dockerfile, locked matrix) could not be written."""

    exit_code = 16


# --- fetch (2x) ---------------------------------------------------------------------------
class FetchError(PatcherError):
    exit_code = 20


class TagMismatchError(FetchError):
    """The tag points at another commit than the matrix pins: a supply-chain event."""

    exit_code = 21


class SubmoduleError(FetchError):
    exit_code = 22


class UnreachableInputError(FetchError):
    """An input could not be downloaded; the message names it and the mirror setting."""

    exit_code = 23


class ChecksumMismatchError(FetchError):
    exit_code = 24


class RemoteURLError(FetchError):
    """A git URL (a mirror setting, an upstream) patcher will not hand to git: a scheme or
    transport outside file/https/http/ssh, a leading '-', a control character."""

    exit_code = 25


class SubmoduleURLError(FetchError):
    """A tree's .gitmodules names a submodule URL that RemoteURLError's rules refuse."""

    exit_code = 26


class SubmodulePathError(FetchError):
    """A tree's .gitmodules names a submodule path outside the tree (absolute, or with '..')."""

    exit_code = 27


# --- patches (3x) -------------------------------------------------------------------------
class PatchFormatError(PatcherError):
    exit_code = 30


class PatchApplyError(PatcherError):
    exit_code = 31


class DirtyTreeError(PatcherError):
    exit_code = 32


class PatchNotFoundError(PatcherError):
    exit_code = 33


class HostilePatchError(PatcherError):
    """A patch makes a change no source patch has business making: a mode change, a symbolic
    link, a submodule, a rename or copy, binary content, or a path outside the tree's own files."""

    exit_code = 34


# --- build (4x) ---------------------------------------------------------------------------
class DockerUnavailableError(PatcherError):
    exit_code = 40


class DockerPermissionError(PatcherError):
    exit_code = 41


class ImageBuildError(PatcherError):
    exit_code = 42


class BaseImageUnavailableError(ImageBuildError):
    """The builder's FROM image is neither on the engine nor pullable; the hint names the ways out."""

    exit_code = 48


class WheelBuildError(PatcherError):
    exit_code = 43


class DiskFullError(PatcherError):
    exit_code = 44


class BuildTimeoutError(PatcherError):
    exit_code = 45


class WorkDirError(PatcherError):
    """The work directory is missing, locked or holds another build's record."""

    exit_code = 46


class ReproducibilityError(PatcherError):
    exit_code = 47


class InterruptedByUser(PatcherError):
    exit_code = 130


# --- probe (5x) ---------------------------------------------------------------------------
class ProbeFailedError(PatcherError):
    """A required probe check failed."""

    exit_code = 50


class ProbeRunError(PatcherError):
    """The probe could not run at all (no interpreter, no torch, bad report)."""

    exit_code = 51


class ProbeTargetError(ProbeRunError):
    """The interpreter, image or wheel to probe does not exist or cannot be started."""

    exit_code = 52


class TorchMissingError(ProbeRunError):
    """The target interpreter cannot import torch."""

    exit_code = 53


class WheelInstallError(ProbeRunError):
    """The wheel could not be installed into a fresh environment to probe it."""

    exit_code = 54


class ProbeTimeoutError(ProbeRunError):
    """The probe run as a whole outlasted its time limit."""

    exit_code = 55


class UpstreamTestsSetupError(ProbeRunError):
    """Upstream's tests could not be run: no test/ in the tree, the pinned test wheelhouse is
    missing or does not match its hashes, the target has no pinned set for its Python."""

    exit_code = 56


class UpstreamTestsFailedError(ProbeFailedError):
    """A selected upstream test failed on the wheel and not on the unpatched release."""

    exit_code = 57


# --- evidence and verification (6x) --------------------------------------------------------
class SigningKeyError(PatcherError):
    """A signing key is missing, unreadable or of the wrong kind."""

    exit_code = 60


class WheelDigestMismatchError(PatcherError):
    exit_code = 61


class SignatureError(PatcherError):
    exit_code = 62


class PatchSeriesMismatchError(PatcherError):
    exit_code = 63


class ProbeReportNotPassedError(PatcherError):
    exit_code = 64


class EvidenceFormatError(PatcherError):
    exit_code = 65


class KeyMismatchError(SignatureError):
    """The evidence is signed, but by another key than the one trusted."""

    exit_code = 66


class ImageScanError(PatcherError):
    """The SBOM's scan of the builder image (what the wheel's libraries are) could not run."""

    exit_code = 69   # 67 is VexMismatchError


class ReportRenderError(PatcherError):
    """`patcher report` could not write the page or render its PDF (e.g. no Chromium)."""

    exit_code = 68


class ReportTargetError(EvidenceFormatError):
    """`patcher report` was given something that holds no one wheel's signed evidence."""

    exit_code = 102   # 6x is full; 100-101 are the advisories'


# --- publish (7x) -------------------------------------------------------------------------
class PublishError(PatcherError):
    exit_code = 70


class IndexLockedError(PublishError):
    exit_code = 71


class UploadError(PublishError):
    exit_code = 72


class AlreadyPublishedError(PublishError):
    exit_code = 73


# --- mirror (8x) --------------------------------------------------------------------------
class MirrorIncompleteError(PatcherError):
    exit_code = 80


class MirrorCorruptError(PatcherError):
    exit_code = 81


class BundleError(PatcherError):
    exit_code = 82


# --- compile check (9x) --------------------------------------------------------------------
class CompileCheckFailedError(PatcherError):
    exit_code = 90


class CompileCheckSetupError(PatcherError):
    exit_code = 91


# --- evidence, continued (6x): the VEX ------------------------------------------------------
class VexMismatchError(PatcherError):
    """The VEX beside a wheel is missing or is not the one the evidence signed."""

    exit_code = 67


# --- advisories (10x) ----------------------------------------------------------------------
class AdvisoryDataError(PatcherError):
    """The advisory data (patcher's or a site's) is missing, malformed or inconsistent."""

    exit_code = 100


class AdvisoryClaimError(PatcherError):
    """A claim an assessment makes about the source (code absent, build guard) does not hold."""

    exit_code = 101
