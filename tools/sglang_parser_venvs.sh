#!/usr/bin/env bash
# Build one small venv per SGLang release, holding just enough of SGLang's
# dependencies to construct its real `launch_server` argparse parser on a CPU
# machine; tools/sglang_argv_check.py then checks argv against it. The newest
# release's venv also gets what its `bench_serving` client imports
# (transformers, tokenizers), so benchmarks/bench_parity.py and
# benchmarks/client_capacity.py can run the real client against the twin.
#
# Usage: tools/sglang_parser_venvs.sh [DIR] [VERSION...]
#   DIR      default: .cache/sglang-parsers   (venvs go to DIR/venv-<version>)
#   VERSION  default: every version known below
# Env:
#   SGLANG_PARSER_TORCH_WHEEL  CPU torch wheel to install (never taken from PyPI,
#                              whose Linux torch is a CUDA build)
#   PYTHON                     interpreter for the venvs (default: python3.11, else python3)
#   UV                         uv to create and fill the venvs with (default: uv on PATH; without it,
#                              venv and pip: several times slower, the same venvs)
#
# Idempotent: a venv whose checker already answers ok for its version is kept;
# anything else in its place is removed and rebuilt.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
checker="${here}/sglang_argv_check.py"
dir="${1:-.cache/sglang-parsers}"
if [[ "$#" -gt 0 ]]; then shift; fi
torch_wheel="${SGLANG_PARSER_TORCH_WHEEL:-/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl}"
if [[ -z "${PYTHON:-}" ]]; then
    if command -v python3.11 >/dev/null 2>&1; then PYTHON="python3.11"; else PYTHON="python3"; fi
fi
uv="${UV:-$(command -v uv || true)}"

# A venv, and installs into it: uv when there is one (seconds, downloads in parallel), else venv and pip.
make_venv() {
    if [[ -n "${uv}" ]]; then "${uv}" venv -q --seed --python "${PYTHON}" "$1"; else "${PYTHON}" -m venv "$1"; fi
}
pip_install() {
    local venv="$1"; shift
    if [[ -n "${uv}" ]]; then
        "${uv}" pip install -q --python "${venv}/bin/python" "$@"
    else
        "${venv}/bin/python" -m pip install -q --disable-pip-version-check "$@"
    fi
}

known_versions=("0.4.10.post2" "0.5.4.post3" "0.5.16" "0.5.23")
if [[ "$#" -gt 0 ]]; then versions=("$@"); else versions=("${known_versions[@]}"); fi

# Packages each release imports on the way to ServerArgs.add_cli_args (found by
# importing sglang.srt.server_args until it stopped failing). Pins copy the
# release's own requirement where it pins one. GPU-only modules (triton) and
# torchvision are not installed: the checker serves inert stand-ins for them.
# deps_nodeps are installed with --no-deps (their own deps would pull triton).
deps_for() {
    deps=()
    deps_nodeps=()
    case "$1" in
        0.4.10.post2)
            deps=(numpy tqdm requests IPython pydantic aiohttp psutil pybase64
                  huggingface_hub "transformers==4.54.1" pillow "pyzmq>=25.1.2"
                  fastapi sentencepiece) ;;
        0.5.4.post3)
            deps=(numpy tqdm requests IPython pydantic aiohttp psutil pybase64
                  orjson safetensors "pyzmq>=25.1.2" fastapi packaging pillow
                  "openai==2.6.1" partial_json_parser huggingface_hub
                  "transformers==4.57.1" dill sentencepiece) ;;
        0.5.16)
            deps=(numpy tqdm requests IPython pydantic aiohttp psutil pybase64
                  orjson packaging pillow starlette msgspec "pyzmq>=25.1.2"
                  "transformers==5.12.1" dill "openai==2.6.1"
                  partial_json_parser sentencepiece "apache-tvm-ffi==0.1.11")
            deps_nodeps=("xgrammar==0.2.1") ;;
        0.5.23)
            deps=(numpy tqdm requests IPython pydantic aiohttp psutil pybase64
                  orjson packaging pillow starlette msgspec "pyzmq>=25.1.2") ;;
        *)
            echo "sglang_parser_venvs: no recipe for sglang ${1}" >&2
            return 1 ;;
    esac
}

# What `python -m sglang.benchmark.serving` imports beyond the parser's deps
# (pins copy the release's own requirements). Only for releases listed here.
bench_deps_for() {
    bench_deps=()
    case "$1" in
        0.5.23) bench_deps=("transformers==5.19.0" "tokenizers==0.23.2") ;;
    esac
}

# Install the bench client's deps into a working venv when they are missing
# (an existing venv is topped up, not rebuilt).
ensure_bench_deps() {
    local version="$1" venv="$2" py="$2/bin/python"
    bench_deps_for "${version}"
    [[ "${#bench_deps[@]}" -gt 0 ]] || return 0
    if "${py}" -c 'import transformers, tokenizers' >/dev/null 2>&1; then return 0; fi
    echo "sglang ${version}: adding the bench_serving client's deps to ${venv}"
    pip_install "${venv}" -c "${venv}/torch-constraint.txt" "${bench_deps[@]}"
}

venv_works() {
    local py="$1" version="$2" out
    [[ -x "${py}" ]] || return 1
    out="$("${py}" "${checker}" -- --model-path probe 2>/dev/null)" || return 1
    [[ "${out}" == "{\"ok\": true, \"version\": \"${version}\"}" ]]
}

build_venv() {
    local version="$1" venv="$2" py="$2/bin/python" constraints torch_version
    deps_for "${version}"
    if [[ ! -f "${torch_wheel}" ]]; then
        echo "sglang_parser_venvs: CPU torch wheel not found: ${torch_wheel}" >&2
        return 1
    fi
    rm -rf "${venv}"
    make_venv "${venv}"
    pip_install "${venv}" --no-deps "sglang==${version}"
    pip_install "${venv}" "${torch_wheel}"
    torch_version="$("${py}" -c 'import importlib.metadata as m; print(m.version("torch"))')"
    constraints="${venv}/torch-constraint.txt"
    # Nothing installed later may swap the CPU torch for a CUDA one.
    printf 'torch==%s\n' "${torch_version}" >"${constraints}"
    # (pip's resolver complains about sglang's own, deliberately missing,
    # requirements; that warning is expected.)
    pip_install "${venv}" -c "${constraints}" "${deps[@]}"
    if [[ "${#deps_nodeps[@]}" -gt 0 ]]; then
        pip_install "${venv}" --no-deps "${deps_nodeps[@]}"
    fi
    if "${py}" -m pip list --disable-pip-version-check 2>/dev/null | grep -qiE '^(nvidia-|triton )'; then
        echo "sglang_parser_venvs: ${venv} gained CUDA packages; refusing it" >&2
        return 1
    fi
}

one_version() {
    local version="$1" venv="${dir}/venv-$1"
    if venv_works "${venv}/bin/python" "${version}"; then
        echo "sglang ${version}: ${venv} ok (kept)"
        ensure_bench_deps "${version}" "${venv}" >>"${dir}/build-${version}.log" 2>&1 \
            || echo "sglang ${version}: bench_serving deps FAILED (see ${dir}/build-${version}.log)" >&2
        return 0
    fi
    echo "sglang ${version}: building ${venv}"
    if build_venv "${version}" "${venv}" >"${dir}/build-${version}.log" 2>&1 \
        && venv_works "${venv}/bin/python" "${version}"; then
        echo "sglang ${version}: ${venv} ok"
        ensure_bench_deps "${version}" "${venv}" >>"${dir}/build-${version}.log" 2>&1 \
            || echo "sglang ${version}: bench_serving deps FAILED (see ${dir}/build-${version}.log)" >&2
    else
        echo "sglang ${version}: ${venv} FAILED (see ${dir}/build-${version}.log)" >&2
        tail -n 20 "${dir}/build-${version}.log" >&2 || true
        "${venv}/bin/python" "${checker}" -- --model-path probe >&2 || true
        return 1
    fi
}

mkdir -p "${dir}"
# The builds are mostly downloads and unpacking: run them side by side.
pids=()
for version in "${versions[@]}"; do
    one_version "${version}" &
    pids+=("$!")
done
status=0
for pid in "${pids[@]}"; do
    wait "${pid}" || status=1
done
exit "${status}"
