"""A server host's memory and model, read over the host connection for the memory preflight.

vLLM's CPU build sizes its KV cache against the memory of the server host, not of the machine the lab
runs on, and the model it loads is a folder on that host: both are read there, in one remote command
each, and handed to :func:`dsv4lab.model.vllm_memory.vllm_preflight` as plain facts. The memory is read
as vLLM's CPU worker reads it (the memory node of the first CPU the process may use, a cgroup limit), and
in the environment a launch on that host inherits, so a ``VLLM_CPU_KVCACHE_SPACE`` the host sets for its
servers counts as it will.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from dsv4lab.errors import ConfigError, HostError
from dsv4lab.hosts import Host
from dsv4lab.model.vllm_memory import HostMemory, ModelFacts

__all__ = ["HostProbe", "read_host_memory", "read_model_facts"]

#: The environment variables of the host that change vLLM's memory split.
MEMORY_ENV = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS")

# Prints the files vLLM reads, each after a "@@" header line: the node of the lowest CPU this process may
# run on (vLLM's get_allowed_cpu_list()[0]), /proc/meminfo, that node's meminfo, the cgroup limit and usage
# at the paths vLLM reads, the GPUs nvidia-smi lists, and the memory variables of this environment.
_MEMORY_SCRIPT = r"""
cpus=$(awk '/^Cpus_allowed_list:/ { print $2 }' /proc/self/status)
first=${cpus%%[,-]*}
node=
for d in /sys/devices/system/cpu/cpu"${first:-0}"/node[0-9]*; do
  [ -e "$d" ] && node=${d##*/node}
done
[ -z "$node" ] && [ -r /sys/devices/system/node/node0/meminfo ] && node=0
echo "@@meminfo"
cat /proc/meminfo
if [ -n "$node" ] && [ -r "/sys/devices/system/node/node$node/meminfo" ]; then
  echo "@@node $node"
  cat "/sys/devices/system/node/node$node/meminfo"
fi
v1=/sys/fs/cgroup/memory
if [ -r /sys/fs/cgroup/memory.max ]; then
  echo "@@cgroup $(cat /sys/fs/cgroup/memory.max) $(cat /sys/fs/cgroup/memory.current 2>/dev/null)"
elif [ -r $v1/memory.limit_in_bytes ]; then
  echo "@@cgroup $(cat $v1/memory.limit_in_bytes) $(cat $v1/memory.usage_in_bytes 2>/dev/null)"
fi
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); fi
echo "@@gpus ${gpus:-0}"
for name in "$@"; do
  if [ -n "${!name+x}" ]; then printf '@@env %s=%s\n' "$name" "${!name}"; fi
done
"""

# $1 the model path (or Hugging Face id), $2 HF_HOME and $3 HF_HUB_CACHE from the config's env (may be empty).
# Prints "@@dir DIR", "@@bytes N" (the safetensors files) and "@@config" then config.json; "@@none" when the
# path is neither a folder with config.json nor a model in the host's Hugging Face cache.
_MODEL_SCRIPT = r"""
p=$1
case "$p" in "~") p=$HOME ;; "~/"*) p="$HOME/${p#\~/}" ;; esac
d=
if [ -f "$p/config.json" ]; then
  d=$p
else
  home=${2:-${HF_HOME:-$HOME/.cache/huggingface}}
  hub=${3:-${HF_HUB_CACHE:-$home/hub}}
  repo="$hub/models--$(printf %s "$p" | sed 's|/|--|g')"
  ref=$(cat "$repo/refs/main" 2>/dev/null)
  if [ -n "$ref" ] && [ -f "$repo/snapshots/$ref/config.json" ]; then d="$repo/snapshots/$ref"; fi
fi
if [ -z "$d" ]; then echo "@@none"; exit 0; fi
echo "@@dir $d"
bytes=0
for f in "$d"/*.safetensors; do
  [ -e "$f" ] || continue
  bytes=$((bytes + $(stat -L -c %s -- "$f")))
done
echo "@@bytes $bytes"
echo "@@config"
head -c 4194304 -- "$d/config.json"
"""


def _sections(text: str) -> dict[str, tuple[str, str]]:
    """``@@name rest`` headers and the lines after each, by name."""
    out: dict[str, tuple[str, str]] = {}
    name, head = "", ""
    body: list[str] = []
    for line in text.splitlines():
        if line.startswith("@@") and not line.startswith("@@env "):
            if name:
                out[name] = (head, "\n".join(body))
            name, _, head = line[2:].partition(" ")
            body = []
        elif line.startswith("@@env "):
            key, _, value = line[6:].partition("=")
            out[f"env:{key}"] = (value, "")
        else:
            body.append(line)
    if name:
        out[name] = (head, "\n".join(body))
    return out


def _int(word: str) -> int | None:
    return int(word) if word.isdigit() else None


def read_host_memory(host: Host, *, timeout_s: float = 30.0) -> HostMemory:
    """The host's memory as vLLM's CPU worker will see it, and how many GPUs it has."""
    out = host.run(["bash", "-c", _MEMORY_SCRIPT, "dsv4lab-hostmem", *MEMORY_ENV], timeout_s=timeout_s).check()
    parts = _sections(out.stdout)
    if "meminfo" not in parts:
        raise HostError(f"on {host.name}: /proc/meminfo could not be read (is it a Linux host?)")
    node_head, node_text = parts.get("node", ("", ""))
    limit = usage = None
    if "cgroup" in parts:
        words = parts["cgroup"][0].split()
        limit = _int(words[0]) if words else None
        usage = _int(words[1]) if len(words) > 1 else None
        if limit is not None and limit >= 1 << 62:  # cgroup v1's "no limit" sentinel
            limit = None
    env = {k[4:]: v for k, (v, _) in parts.items() if k.startswith("env:")}
    return HostMemory.from_meminfo(
        host.name,
        parts["meminfo"][1],
        node_meminfo=node_text if "node" in parts else None,
        node=_int(node_head),
        cgroup_limit=limit,
        cgroup_usage=usage,
        gpus=_int(parts.get("gpus", ("0", ""))[0]) or 0,
        env=env,
    )


def read_model_facts(
    host: Host, model_path: str, *, env: Mapping[str, str] | None = None, timeout_s: float = 30.0
) -> ModelFacts | None:
    """The model's facts from its folder on the host (or its snapshot in the host's Hugging Face cache);
    None when the host has neither, which the preflight reports as facts it could not check."""
    env = env or {}
    argv = [
        "bash",
        "-c",
        _MODEL_SCRIPT,
        "dsv4lab-model",
        model_path,
        env.get("HF_HOME", ""),
        env.get("HF_HUB_CACHE", ""),
    ]
    out = host.run(argv, timeout_s=timeout_s).check()
    parts = _sections(out.stdout)
    if "none" in parts or "config" not in parts:
        return None
    folder = parts.get("dir", (model_path, ""))[0]
    try:
        data = json.loads(parts["config"][1])
    except json.JSONDecodeError as exc:
        raise ConfigError(
            "model_path", model_path, f"a model folder on {host.name} with a valid config.json", detail=str(exc)
        ) from None
    size = _int(parts.get("bytes", ("0", ""))[0]) or 0
    return ModelFacts.from_config_json(data, size, name=folder.rstrip("/").rsplit("/", 1)[-1])


@dataclass
class HostProbe:
    """What an engine's launch check may ask of the server host (:meth:`dsv4lab.engines.Engine.predict_on_host`),
    read only when asked: a check that needs no memory figures costs no remote command."""

    host: Host
    timeout_s: float = 30.0

    def memory(self) -> HostMemory:
        return read_host_memory(self.host, timeout_s=self.timeout_s)

    def model_facts(self, model_path: str, env: Mapping[str, str]) -> ModelFacts | None:
        return read_model_facts(self.host, model_path, env=env, timeout_s=self.timeout_s)
