"""Every combination patcher.spec.resolve refuses, through the real CLI: code and message.

Each refusal must be one line on stderr, no traceback, and name the rule and the way out.
"""

from __future__ import annotations

import pytest

# (id, args after `patcher`, exit code, fragments the message must contain)
REFUSALS = [
    ("python-too-new-for-1.4", ["matrix", "--torch", "1.4.0", "--python", "3.9"], 12,
     ["torch 1.4.0 supports Python 3.5-3.8, not 3.9", "use --python 3.7"]),
    ("python-not-in-image", ["matrix", "--torch", "1.13.1", "--python", "3.8"], 12,
     ["Python 3.8 is not packaged in base image debian-bullseye"]),
    ("cuda-10.1-arch-8.6", ["matrix", "--torch", "1.4.0", "--cuda", "10.1", "--arch", "7.5;8.6"], 12,
     ["CUDA 10.1 can compile for compute capability up to 7.5, not 8.6", "drop 8.6 from --arch"]),
    ("cuda-12.1-arch-3.7", ["matrix", "--torch", "2.1.2", "--cuda", "12.1", "--arch", "3.7;5.0"], 12,
     ["CUDA 12.1 can compile for compute capability 5.0 and newer, not 3.7"]),
    ("cuda-10.1-gcc-9", ["matrix", "--torch", "1.4.0", "--cuda", "10.1", "--gcc", "9"], 12,
     ["torch 1.4.0 compiles with gcc 5-8, not gcc 9", "use --gcc 7"]),
    ("cuda-10.2-gcc-9-within-torch-range", ["matrix", "--torch", "1.7.1", "--cuda", "10.2", "--gcc", "9"], 12,
     ["CUDA 10.2 accepts gcc up to 8, not gcc 9", "use --gcc 7"]),
    ("unknown-torch", ["matrix", "--torch", "9.9.9"], 11,
     ["torch 9.9.9 is not in the version matrix", "known versions: 1.4.0, 1.7.1, 1.8.1, 1.13.1, 2.0.1, 2.1.2"]),
    ("torch-1.4-cuda-11.8", ["matrix", "--torch", "1.4.0", "--cuda", "11.8"], 12,
     ["torch 1.4.0 is not built with CUDA 11.8", "supported CUDA versions: 9.2, 10.1, or --cuda none"]),
    ("arch-on-cpu-build", ["matrix", "--torch", "1.13.1", "--cuda", "none", "--arch", "7.5"], 12,
     ["--arch needs a CUDA build"]),
    ("malformed-arch-sm_75", ["matrix", "--torch", "1.4.0", "--cuda", "10.1", "--arch", "sm_75"], 12,
     ["arch list entry 'sm_75' is not a compute capability like 7.5 or 7.5+PTX"]),
    ("malformed-arch-lowercase-ptx", ["matrix", "--torch", "1.4.0", "--cuda", "10.1", "--arch", "7.5+ptx"], 12,
     ["arch list entry '7.5+ptx'"]),
    ("empty-arch", ["matrix", "--torch", "1.4.0", "--cuda", "10.1", "--arch", ";"], 12,
     ["--arch lists no compute capability"]),
    ("gcc-below-torch-range", ["matrix", "--torch", "1.13.1", "--gcc", "6"], 12,
     ["torch 1.13.1 compiles with gcc 7-11, not gcc 6", "use --gcc 10"]),
    ("gcc-above-torch-range", ["matrix", "--torch", "2.0.1", "--cuda", "none", "--gcc", "12"], 12,
     ["torch 2.0.1 compiles with gcc 9-11, not gcc 12"]),
    ("gcc-not-in-image", ["matrix", "--torch", "1.13.1", "--cuda", "none", "--gcc", "11"], 12,
     ["gcc 11 is not packaged in base image debian-bullseye (gcc 9, 10 are)"]),
    # render resolves through the same rules before anything is written
    ("render-refuses-the-same", ["render", "--torch", "1.4.0", "--cuda", "10.1", "--gcc", "9"], 12,
     ["torch 1.4.0 compiles with gcc 5-8, not gcc 9"]),
    ("render-unknown-torch", ["render", "--torch", "0.4.1"], 11, ["torch 0.4.1 is not in the version matrix"]),
]


@pytest.mark.parametrize("args,code,fragments", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_refusal(patcher_cli, args, code, fragments, tmp_path):
    res = patcher_cli(*args, cwd=tmp_path)
    assert res.exit_code == code, res.stdout + res.stderr
    assert res.stdout == ""
    assert res.stderr.startswith("patcher: error: ") and res.stderr.count("\n") == 1, res.stderr
    assert "Traceback" not in res.stderr
    for fragment in fragments:
        assert fragment in res.stderr, f"{fragment!r} not in {res.stderr!r}"
    assert list(tmp_path.iterdir()) == []


def test_accepted_neighbours_of_the_refusals(patcher_cli):
    """The edges of each rule are accepted (so the table refuses for the stated reason)."""
    for args in (["--torch", "1.4.0", "--python", "3.8"], ["--torch", "1.4.0", "--cuda", "10.1", "--arch", "7.5+PTX"],
                 ["--torch", "1.4.0", "--cuda", "10.1", "--gcc", "8"], ["--torch", "2.1.2", "--cuda", "12.1", "--arch", "5.0"],
                 ["--torch", "1.13.1", "--cuda", "none", "--gcc", "9"]):
        res = patcher_cli("matrix", *args)
        assert res.exit_code == 0, (args, res.stderr)


def test_options_without_torch_are_a_usage_error(patcher_cli):
    res = patcher_cli("matrix", "--cuda", "10.1")
    assert res.exit_code == 2 and "need --torch" in res.stderr


# --- a malformed matrix: one line, its own exit code, for every command that reads it -----------
@pytest.mark.parametrize("damage", ["no image key", "image not a table", "pythons not a list"])
@pytest.mark.parametrize("command", [["matrix", "--torch", "1.13.1", "--cuda", "none"], ["matrix"],
                                     ["build", "--torch", "1.13.1", "--cuda", "none", "--until", "resolve"]])
def test_a_malformed_matrix_is_one_line_with_its_exit_code(patcher_cli, tmp_path, damage, command):
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    import tomli_w

    from patcher.config import DEFAULT_MATRIX
    from patcher.errors import MatrixFormatError

    matrix = tomllib.loads(DEFAULT_MATRIX.read_text())
    release = matrix["torch"]["1.13.1"]
    if damage == "no image key":
        del release["image"]
    elif damage == "image not a table":
        matrix["images"][release["image"]] = "debian"
    else:
        release["pythons"] = 3.9
    path = tmp_path / "matrix.toml"
    path.write_text(tomli_w.dumps(matrix))
    res = patcher_cli("--matrix", path, *command, "--work" if command[0] == "build" else "--json",
                      *([tmp_path / "work"] if command[0] == "build" else []), cwd=tmp_path)
    assert res.exit_code == MatrixFormatError.exit_code, res.stderr
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert lines[-1].startswith(f"patcher: error: matrix file {path} is malformed: "), res.stderr
    if damage == "no image key":
        assert "lacks the key 'image'" in lines[-1]
    assert not (tmp_path / "work").exists() or not list((tmp_path / "work").rglob("record.json"))
