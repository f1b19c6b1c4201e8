#!/usr/bin/env bash
# Installs everything ktune needs on a fresh Debian 12 machine, idempotently:
# the Debian packages it builds against and the PyPI packages its reference scripts, fixtures'
# generators, benchmarks and Python face use. Safe to run again; it skips what is there.
#   scripts/setup.sh            everything
#   scripts/setup.sh --no-python  only the Debian packages
set -euo pipefail

APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git xz-utils iproute2 sqlite3
  libdnnl-dev            # oneDNN: CPU GEMMs
  libgtest-dev libgmock-dev
  libpcre2-dev           # tokenizer pre-tokenizer regexes (\p{L}, (?i:...))
  libutf8proc-dev        # NFC normalisation
  libsentencepiece-dev   # SentencePiece tokenizer.model (Gemma, Mistral)
  libsqlite3-dev         # the local job registry
  libcurl4-openssl-dev libssl-dev   # Hugging Face Hub, S3, Kubernetes API
  libgloo-dev            # CPU collectives
  nlohmann-json3-dev libyaml-cpp-dev
)

# PyPI: pyarrow ships the Arrow/Parquet C++ libraries ktune links; tokenizers/tiktoken check token
# ids; moto serves S3 on loopback for the S3 tests; torch, transformers and peft are the reference
# that fixtures' generators, parity checks and benchmarks compare against.

need_apt=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$p")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

[ "${1:-}" = "--no-python" ] && exit 0

PY=${PYTHON:-python3}
# "pip name:import name" pairs; a package is installed only when its import fails.
PIP_PACKAGES=(
  pyarrow:pyarrow tokenizers:tokenizers tiktoken:tiktoken numpy:numpy safetensors:safetensors
  pyyaml:yaml "moto[server]:moto" jsonschema:jsonschema
  torch:torch transformers:transformers peft:peft kubeflow:kubeflow papermill:papermill tensorboard:tensorboard
  nbformat:nbformat ipykernel:ipykernel nanobind:nanobind scikit-build-core:scikit_build_core sentencepiece:sentencepiece
)
missing=()
for pair in "${PIP_PACKAGES[@]}"; do
  $PY -c "import ${pair##*:}" 2>/dev/null || missing+=("${pair%%:*}")
done
if [ ${#missing[@]} -gt 0 ]; then
  $PY -m pip install -q --disable-pip-version-check "${missing[@]}"
fi
