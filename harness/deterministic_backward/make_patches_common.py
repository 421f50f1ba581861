"""What every make_patches*.py generator shares: the scratch git repository the patches are
committed in, the walk along patches/<release>/series, the commit message's trailers, the
kernel sections read from the harness headers, and the text edits the transforms are made of.

A module of its own (not make_patches.py or make_patches_release.py) because those two are
generators themselves and make_patches_release.py imports make_patches.py: the shared part
has to sit below both, importing neither. Nothing here knows a particular patch.

Why the scratch repository: a patch is `git format-patch` of one commit, so its bytes depend
only on the files it touches (before and after) and on the fixed identity, date and options
below; the generators are re-run to prove that the committed patches are reproduced exactly.
"""
import argparse
import dataclasses
import os
import shutil
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CUDA = "aten/src/ATen/native/cuda/"
ISSUES = "https://github.com/pytorch/pytorch/issues/"

# Fixed author, committer and date: with --zero-commit they make format-patch's output depend
# on the change alone, so a re-run writes the same bytes.
AUTHOR_NAME = "patcher maintainers"
AUTHOR_EMAIL = "maintainers@patcher.invalid"
DATE = "2026-11-30T00:00:00+00:00"
FORMAT_PATCH = ("format-patch", "-1", "--stdout", "--zero-commit", "--no-signature", "--full-index", "HEAD")


# --- command line ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class GeneratorArgs:
    tree: str  # absolute path of the pristine tree (left untouched: it is copied)
    out: str  # the patches/1.13.1 directory the patches are written to, with its series file
    only: frozenset  # --only: the patch ids to make (empty: all of them)


def parse_args(*, with_only=False):
    """--tree/--out of the 1.13.1 generators (and --only where a generator takes it)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", required=True, help="extracted pristine pytorch 1.13.1 tree")
    ap.add_argument("--out", required=True, help="patches/1.13.1 directory")
    if with_only:
        ap.add_argument("--only", default="", help="comma-separated patch ids")
    args = ap.parse_args()
    only = frozenset(p for p in getattr(args, "only", "").split(",") if p)
    return GeneratorArgs(tree=os.path.abspath(args.tree), out=args.out, only=only)


# --- text edits the transforms are made of -----------------------------------------------------
def replace_once(text, old, new):
    """Replace `old`, which must occur exactly once: an anchor that moved or repeats stops the run
    instead of patching the wrong place."""
    if text.count(old) != 1:
        raise SystemExit(f"expected exactly one occurrence of:\n{old}")
    return text.replace(old, new)


def replace_after(text, marker, old, new):
    """Replace the first `old` after the (unique) `marker`."""
    if text.count(marker) != 1:
        raise SystemExit(f"expected exactly one occurrence of marker:\n{marker}")
    start = text.index(marker)
    i = text.find(old, start)
    if i < 0:
        raise SystemExit(f"not found after {marker!r}:\n{old}")
    return text[:i] + new + text[i + len(old):]


def insert_missing_includes(src, anchor, includes):
    """Put the `#include` lines of `includes` that the file lacks right after `anchor`, in order."""
    lines = src.split("\n")
    want = [i for i in includes if i not in lines]
    return replace_once(src, anchor, anchor + "".join(w + "\n" for w in want))


def kernel_sections(headers, *names):
    """The text between `// BEGIN <name>` and `// END <name>` of each of `names`, in that order,
    from the harness headers (file names in this folder) read as one text: the patches carry the
    code the GPU harness proved, verbatim."""
    text = "".join(open(os.path.join(HERE, h)).read() for h in headers)
    out = []
    for name in names:
        begin, end = f"// BEGIN {name}\n", f"// END {name}\n"
        a = text.index(begin) + len(begin)
        out.append(text[a:text.index(end)])
    return "".join(out)


def radix_sort_pairs_wrapper(function, used_by):
    """A file-local stable (key, value) radix sort on at::cuda::cub (the gather kernels group the
    contributions of one target with it); `used_by` completes the comment."""
    return f"""\
// Stable (key, value) radix sort over key bits [0, end_bit), on the current
// stream; used by the deterministic {used_by} below.
static void {function}(
    const int64_t* keys_in, int64_t* keys_out,
    const int64_t* values_in, int64_t* values_out,
    int64_t n, int end_bit) {{
  at::cuda::cub::radix_sort_pairs<int64_t, int64_t>(
      keys_in, keys_out, values_in, values_out, n,
      /*descending=*/false, /*begin_bit=*/0, /*end_bit=*/end_bit);
}}

"""


# --- the commit message ------------------------------------------------------------------------
def trailers(patch_id, upstream_bug, probe, upstream_tests, upstream_fix="none"):
    """The trailer block of a 1.13.1 determinism patch (patcher reads these fields)."""
    return (f"\nPatch-Id: {patch_id}\nApplies-To: ==1.13.1\nCategory: determinism\n"
            f"Upstream-Bug: {upstream_bug}\nUpstream-Fix: {upstream_fix}\nProbe: {probe}\n"
            f"Upstream-Tests: {upstream_tests}\n")


def commit_message(subject, body, tail, trailer_block):
    """Subject, blank line, the patch's own body, then the text its generator adds to every patch."""
    return subject + "\n\n" + body + "\n" + tail + trailer_block


# --- the scratch repository --------------------------------------------------------------------
def git(repo, *args, env=None):
    """git in `repo` with the fixed identity and date, and no user or system configuration."""
    full_env = dict(os.environ)
    full_env.update({
        "GIT_AUTHOR_NAME": AUTHOR_NAME, "GIT_AUTHOR_EMAIL": AUTHOR_EMAIL,
        "GIT_COMMITTER_NAME": AUTHOR_NAME, "GIT_COMMITTER_EMAIL": AUTHOR_EMAIL,
        "GIT_AUTHOR_DATE": DATE, "GIT_COMMITTER_DATE": DATE,
        "GIT_CONFIG_NOSYSTEM": "1", "HOME": repo,
    })
    if env:
        full_env.update(env)
    return subprocess.run(["git", "-C", repo, *args], check=True, env=full_env,
                          stdout=subprocess.PIPE).stdout


def scratch_repo(tree, scratch, name="repo", label="pristine 1.13.1"):
    """scratch/<name>: a git repository with a copy of `tree` as its first commit (the tree
    itself is never written to)."""
    repo = os.path.join(scratch, name)
    if os.path.exists(repo):
        shutil.rmtree(repo)
    shutil.copytree(tree, repo, symlinks=True)
    git(repo, "init", "-q")
    git(repo, "add", "--force", "-A")
    git(repo, "commit", "-q", "--no-verify", "-m", label)
    return repo


def commit_patch(repo, scratch, transforms, message, out_path):
    """Rewrite each file of `transforms` (path in the tree -> function of its text), commit the
    change with `message` as it is, and write the commit as a patch to `out_path`."""
    for rel, transform in transforms.items():
        path = os.path.join(repo, rel)
        with open(path) as f:
            src = f.read()
        with open(path, "w") as f:
            f.write(transform(src))
        # --force: the tree's .gitignore must not keep a patched file out of the commit
        git(repo, "add", "--force", rel)
    msg_file = os.path.join(scratch, "msg")
    with open(msg_file, "w") as f:
        f.write(message)
    # verbatim: keep the message's blank lines and wrapped trailer lines as written
    git(repo, "commit", "-q", "--no-verify", "--cleanup=verbatim", "-F", msg_file)
    patch = git(repo, *FORMAT_PATCH)
    with open(out_path, "wb") as f:
        f.write(patch)
    print("wrote", out_path)


# --- the series --------------------------------------------------------------------------------
def read_series(out_dir):
    """The patch file names of out_dir/series, in order ('#' starts a comment)."""
    with open(os.path.join(out_dir, "series")) as f:
        return [line.split("#", 1)[0].strip() for line in f if line.split("#", 1)[0].strip()]


def series_before(out_dir, own_files):
    """The series' patch files before the first of `own_files` (the patches a generator makes),
    leaving out those listed but not written yet."""
    names = []
    for name in read_series(out_dir):
        if name in own_files:
            break
        if not os.path.isfile(os.path.join(out_dir, name)):
            print(f"note: {name} is listed in the series but not written yet; the base leaves it out")
            continue
        names.append(name)
    return names


def series_base_repo(tree, scratch, out_dir, own_files, name="repo"):
    """A scratch repository of `tree` with the series before `own_files` applied, one commit each.
    A patch that does not apply there is left out with a warning: it is that patch's problem
    (the real-tree test names it), and the generator's own patches are made on the rest."""
    repo = scratch_repo(tree, scratch, name)
    for earlier in series_before(out_dir, own_files):
        applied = subprocess.run(["git", "apply", "--index", os.path.abspath(os.path.join(out_dir, earlier))],
                                 cwd=repo, capture_output=True, text=True)
        if applied.returncode != 0:
            reason = applied.stderr.strip().splitlines()[0] if applied.stderr.strip() else ""
            print(f"warning: {earlier} does not apply in series order, left out of the base: {reason}")
            continue
        git(repo, "commit", "-q", "--no-verify", "-m", earlier)
    return repo


def make_after_series(tree, out_dir, patches):
    """Make `patches` ((file name, transforms by path, message), in series order, each on top of
    the ones before it) on the series before the first of them; then check on a fresh base that
    they apply in that order."""
    own_files = {name for name, _, _ in patches}
    with tempfile.TemporaryDirectory(prefix="detbw-patches-", dir="/tmp") as scratch:
        repo = series_base_repo(tree, scratch, out_dir, own_files)
        for name, transforms, message in patches:
            commit_patch(repo, scratch, transforms, message, os.path.join(out_dir, name))
        check = series_base_repo(tree, scratch, out_dir, own_files, name="check")
        for name, _, _ in patches:
            path = os.path.abspath(os.path.join(out_dir, name))
            subprocess.run(["git", "apply", "--check", path], cwd=check, check=True)
            subprocess.run(["git", "apply", path], cwd=check, check=True)
        print(f"{len(patches)} patch(es) apply in order after",
              len(series_before(out_dir, own_files)), "series patches")


def walk_series(tree, out_dir, specs):
    """Regenerate the patches of `specs` (file name -> (transforms by path, commit message))
    in series order on a scratch copy of `tree`: each one on top of every series patch before
    it; the others of the series are applied as they are, so a patch that no longer applies
    in order stops the run."""
    names = read_series(out_dir)
    missing = [n for n in specs if n not in names]
    if missing:
        raise SystemExit(f"not in {out_dir}/series: {', '.join(missing)} (append them first)")
    with tempfile.TemporaryDirectory(prefix="detbw-series-", dir="/tmp") as scratch:
        repo = scratch_repo(tree, scratch)
        for name in names:
            path = os.path.join(out_dir, name)
            if name in specs:
                transforms, message = specs[name]
                commit_patch(repo, scratch, transforms, message, path)
            else:
                if not os.path.exists(path):
                    # a patch appended to the series but not written yet (its generator runs next)
                    print(f"stopped before {name}: not written yet; the rest of the series is unchecked")
                    return
                subprocess.run(["git", "apply", "--index", os.path.abspath(path)], cwd=repo, check=True)
                git(repo, "commit", "-q", "--no-verify", "-m", name)
        print(f"all {len(names)} patches of the series apply in order")
