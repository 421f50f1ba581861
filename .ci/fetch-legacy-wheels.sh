#!/bin/bash
# Real legacy torch runtimes for the probe (tests/test_probe_legacy_runtimes.py) and for the
# advisory claims checked against PyPI's wheels (tests/test_advisories_wheel_files.py):
# PyPI's torch 1.4.0 (CPython 3.6), 1.8.1, 2.0.1 and 2.1.2 (CPython 3.8), with what each needs
# to import on a CPU-only machine.  Every file is pinned by the sha256 PyPI publishes for it
# (its simple index, read 2026-12-01; pip --require-hashes refuses anything else).  The pip of
# each pyenv interpreter downloads through pip's own index configuration, and installs offline
# into one venv per runtime.  Wheels and venvs stay in $PATCHER_CI_CACHE between runs; a venv is
# rebuilt when its pins or its interpreter change.  A missing interpreter is an error, never a skip.
#
# torch 2.0.1 / 2.1.2 from PyPI are CUDA builds: libtorch_global_deps.so links the nvidia-*
# wheels' libraries, so `import torch` fails without them even on a CPU.  triton (torch.compile
# only) is left out.  torch 1.4.0's wheel declares no dependency but does not import without numpy.  Sizes (bytes): 1.4.0 753,377,187; 1.8.1 804,098,825 + numpy; 2.0.1 619,894,032
# + nvidia-* cu11; 2.1.2 670,165,862 + nvidia-* cu12 (totals: `du` of the cache, in the test's log).
set -euo pipefail
CACHE=${PATCHER_CI_CACHE:-/var/cache/patcher-ci}
DEST="$CACHE/legacy-torch"
WHEELS="$DEST/wheels"
mkdir -p "$WHEELS" "$DEST/venvs"
PYENV_ROOT=${PYENV_ROOT:-$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")}

interpreter() {  # interpreter MINOR -> the newest pyenv CPython MINOR.x
  local found
  found=$(ls -d "$PYENV_ROOT"/versions/"$1".* 2>/dev/null | sort -V | tail -n 1)
  if [ -z "$found" ] || [ ! -x "$found/bin/python" ]; then
    echo "ci: no CPython $1 under $PYENV_ROOT/versions (the legacy runtimes need pyenv's builds)" >&2
    exit 1
  fi
  echo "$found/bin/python"
}

pinned_hashes() { grep -o 'sha256:[0-9a-f]\{64\}' "$1" | cut -d: -f2 | sort; }

# After pip has fetched and checked them: each pinned file of the cache, in `sha256sum -c` form,
# so that a later run checks the files it has without asking the index again.
record_wheels() {  # record_wheels REQ LIST
  local file
  touch "$WHEELS/.sha256"
  for file in "$WHEELS"/*.whl; do  # each file hashed once, when it first appears
    grep -q "  $(basename "$file")\$" "$WHEELS/.sha256" || (cd "$WHEELS" && sha256sum -- "$(basename "$file")") >> "$WHEELS/.sha256"
  done
  grep -F -f <(pinned_hashes "$1") "$WHEELS/.sha256" > "$2.part"
  [ "$(cut -d' ' -f1 "$2.part" | sort)" = "$(pinned_hashes "$1")" ] || {
    echo "ci: pip fetched $(basename "$1" .txt) but not every pinned file is in $WHEELS" >&2; exit 1; }
  mv "$2.part" "$2"
}

wheels_verified() {  # wheels_verified REQ LIST: every pin is listed, and every listed file still matches
  [ -f "$2" ] && [ "$(cut -d' ' -f1 "$2" | sort)" = "$(pinned_hashes "$1")" ] \
    && (cd "$WHEELS" && sha256sum -c --status "$2")
}

runtime() {  # runtime NAME PYTHON_MINOR  (pins on stdin)
  local name=$1 python req stamp venv want
  python=$(interpreter "$2")
  req="$DEST/$name.txt"
  cat > "$req.part"
  mv "$req.part" "$req"
  if ! wheels_verified "$req" "$DEST/$name.sha256"; then
    "$python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --require-hashes \
      -r "$req" -d "$WHEELS" || { echo "ci: the wheels of $name could not be fetched or do not match their pins" >&2; exit 1; }
    record_wheels "$req" "$DEST/$name.sha256"
  fi
  venv="$DEST/venvs/$name"
  stamp="$venv/.patcher-stamp"
  want="$(sha256sum "$req" | cut -d' ' -f1) $("$python" -c 'import sys; print(sys.version.split()[0])')"
  # the stamp is written only after torch imported in the new venv; the tests import it again
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-index --find-links "$WHEELS" --no-deps \
    --require-hashes -r "$req" || { echo "ci: the venv of $name could not be made" >&2; rm -rf "$venv"; exit 1; }
  "$venv/bin/python" -c "import torch" || { echo "ci: torch does not import in the venv of $name" >&2; exit 1; }
  echo "$want" > "$stamp"
}

runtime torch-1.4.0-py3.6 3.6 <<'EOF'
torch==1.4.0 --hash=sha256:8856f334aa9ecb742c1504bd2563d0ffb8dceb97149c8d72a04afa357f667dbc
numpy==1.19.5 --hash=sha256:8b5e972b43c8fc27d56550b4120fe6257fdc15f9301914380b27f74856299fea
EOF

runtime torch-1.8.1-py3.8 3.8 <<'EOF'
torch==1.8.1 --hash=sha256:e7ad1649adb7dc2a450e70a3e51240b84fa4746c69c8f98989ce0c254f9fba3a
numpy==1.24.4 --hash=sha256:dd80e219fd4c71fc3699fc1dadac5dcf4fd882bfc6f7ec53d30fa197b8ee22dc
typing-extensions==4.13.2 --hash=sha256:a439e7c04b49fec3e5d3e2beaa21755cadbbdc391694e28ccdd36ca4a1408f8c
EOF

runtime torch-2.0.1-py3.8 3.8 <<'EOF'
torch==2.0.1 --hash=sha256:5ef3ea3d25441d3957348f7e99c7824d33798258a2bf5f0f0277cbcadad2e20d
nvidia-cublas-cu11==11.10.3.66 --hash=sha256:d32e4d75f94ddfb93ea0a5dda08389bcc65d8916a25cb9f37ac89edaeed3bded
nvidia-cuda-cupti-cu11==11.7.101 --hash=sha256:e0cfd9854e1f2edaa36ca20d21cd0bdd5dcfca4e3b9e130a082e05b33b6c5895
nvidia-cuda-nvrtc-cu11==11.7.99 --hash=sha256:9f1562822ea264b7e34ed5930567e89242d266448e936b85bc97a3370feabb03
nvidia-cuda-runtime-cu11==11.7.99 --hash=sha256:cc768314ae58d2641f07eac350f40f99dcb35719c4faff4bc458a7cd2b119e31
nvidia-cudnn-cu11==8.5.0.96 --hash=sha256:402f40adfc6f418f9dae9ab402e773cfed9beae52333f6d86ae3107a1b9527e7
nvidia-cufft-cu11==10.9.0.58 --hash=sha256:222f9da70c80384632fd6035e4c3f16762d64ea7a843829cb278f98b3cb7dd81
nvidia-curand-cu11==10.2.10.91 --hash=sha256:eecb269c970fa599a2660c9232fa46aaccbf90d9170b96c462e13bcb4d129e2c
nvidia-cusolver-cu11==11.4.0.1 --hash=sha256:72fa7261d755ed55c0074960df5904b65e2326f7adce364cbe4945063c1be412
nvidia-cusparse-cu11==11.7.4.91 --hash=sha256:a3389de714db63321aa11fbec3919271f415ef19fda58aed7f2ede488c32733d
nvidia-nccl-cu11==2.14.3 --hash=sha256:5e5534257d1284b8e825bc3a182c6f06acd6eb405e9f89d49340e98cd8f136eb
nvidia-nvtx-cu11==11.7.91 --hash=sha256:b22c64eee426a62fc00952b507d6d29cf62b4c9df7a480fcc417e540e05fd5ac
filelock==3.16.1 --hash=sha256:2082e5703d51fbf98ea75855d9d5527e33d8ff23099bec374a134febee6946b0
jinja2==3.1.6 --hash=sha256:85ece4451f492d0c13c5dd7c13a64681a86afae63a5f347908daf103ce6d2f67
markupsafe==2.1.5 --hash=sha256:fa9db3f79de01457b03d4f01b34cf91bc0048eb2c3846ff26f66687c2f6d16ab
networkx==3.1 --hash=sha256:4f33f68cb2afcf86f28a45f43efc27a9386b535d567d2127f8f61d51dec58d36
sympy==1.13.3 --hash=sha256:54612cf55a62755ee71824ce692986f23c88ffa77207b30c1368eda4a7060f73
mpmath==1.3.0 --hash=sha256:a0b2b9fe80bbcd81a6647ff13108738cfb482d481d826cc0e02f5b35e5c88d2c
typing-extensions==4.13.2 --hash=sha256:a439e7c04b49fec3e5d3e2beaa21755cadbbdc391694e28ccdd36ca4a1408f8c
EOF

runtime torch-2.1.2-py3.8 3.8 <<'EOF'
torch==2.1.2 --hash=sha256:f41fe0c7ecbf903a568c73486139a75cfab287a0f6c17ed0698fdea7a1e8641d
nvidia-cublas-cu12==12.1.3.1 --hash=sha256:ee53ccca76a6fc08fb9701aa95b6ceb242cdaab118c3bb152af4e579af792728
nvidia-cuda-cupti-cu12==12.1.105 --hash=sha256:e54fde3983165c624cb79254ae9818a456eb6e87a7fd4d56a2352c24ee542d7e
nvidia-cuda-nvrtc-cu12==12.1.105 --hash=sha256:339b385f50c309763ca65456ec75e17bbefcbbf2893f462cb8b90584cd27a1c2
nvidia-cuda-runtime-cu12==12.1.105 --hash=sha256:6e258468ddf5796e25f1dc591a31029fa317d97a0a94ed93468fc86301d61e40
nvidia-cudnn-cu12==8.9.2.26 --hash=sha256:5ccb288774fdfb07a7e7025ffec286971c06d8d7b4fb162525334616d7629ff9
nvidia-cufft-cu12==11.0.2.54 --hash=sha256:794e3948a1aa71fd817c3775866943936774d1c14e7628c74f6f7417224cdf56
nvidia-curand-cu12==10.3.2.106 --hash=sha256:9d264c5036dde4e64f1de8c50ae753237c12e0b1348738169cd0f8a536c0e1e0
nvidia-cusolver-cu12==11.4.5.107 --hash=sha256:8a7ec542f0412294b15072fa7dab71d31334014a69f953004ea7a118206fe0dd
nvidia-cusparse-cu12==12.1.0.106 --hash=sha256:f3b50f42cf363f86ab21f720998517a659a48131e8d538dc02f8768237bd884c
nvidia-nccl-cu12==2.18.1 --hash=sha256:1a6c4acefcbebfa6de320f412bf7866de856e786e0462326ba1bac40de0b5e71
nvidia-nvtx-cu12==12.1.105 --hash=sha256:dc21cf308ca5691e7c04d962e213f8a4aa9bbfa23d95412f452254c2caeb09e5
nvidia-nvjitlink-cu12==12.9.86 --hash=sha256:e3f1171dbdc83c5932a45f0f4c99180a70de9bd2718c1ab77d14104f6d7147f9
filelock==3.16.1 --hash=sha256:2082e5703d51fbf98ea75855d9d5527e33d8ff23099bec374a134febee6946b0
fsspec==2025.3.0 --hash=sha256:efb87af3efa9103f94ca91a7f8cb7a4df91af9f74fc106c9c7ea0efd7277c1b3
jinja2==3.1.6 --hash=sha256:85ece4451f492d0c13c5dd7c13a64681a86afae63a5f347908daf103ce6d2f67
markupsafe==2.1.5 --hash=sha256:fa9db3f79de01457b03d4f01b34cf91bc0048eb2c3846ff26f66687c2f6d16ab
networkx==3.1 --hash=sha256:4f33f68cb2afcf86f28a45f43efc27a9386b535d567d2127f8f61d51dec58d36
sympy==1.13.3 --hash=sha256:54612cf55a62755ee71824ce692986f23c88ffa77207b30c1368eda4a7060f73
mpmath==1.3.0 --hash=sha256:a0b2b9fe80bbcd81a6647ff13108738cfb482d481d826cc0e02f5b35e5c88d2c
typing-extensions==4.13.2 --hash=sha256:a439e7c04b49fec3e5d3e2beaa21755cadbbdc391694e28ccdd36ca4a1408f8c
EOF

echo "legacy torch runtimes in $DEST ($(du -sh "$WHEELS" | cut -f1) of wheels)"
