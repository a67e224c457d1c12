"""VllmConfig: validation, overrides, round trips, and what each vLLM release's argv looks like.

Whether the rendered argv is really accepted is tests/test_real_vllm_parser.py's job (vLLM 0.32.0's own
parser); these tests pin the per-release differences the table records, so a change to it is a visible one.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

import dsv4lab
from dsv4lab import config as config_pkg
from dsv4lab.config import ServerConfig
from dsv4lab.config.vllm_config import (
    VLLM_KV_CACHE_DTYPES,
    VLLM_SPECULATIVE_METHODS,
    VllmConfig,
    VllmSpeculativeConfig,
    field_help,
    field_names,
)
from dsv4lab.config.vllm_launch import render_vllm_argv, render_vllm_env, vllm_server_command
from dsv4lab.config.vllm_releases import VLLM_RELEASES, flags_owned_by_vllm_fields, resolve_vllm_release
from dsv4lab.errors import ConfigError, DSV4LabError, UnknownNameError, UnsupportedFlagError
from dsv4lab.secrets import REDACTED

MODEL = "Qwen/Qwen3-0.6B"
RELEASES = [r.version for r in VLLM_RELEASES]

# -- validation -----------------------------------------------------------------------------------------

BAD: list[tuple[dict[str, Any], str, str | None]] = [
    ({"model_path": ""}, "model_path", "non-empty"),
    ({"model_path": "a\nb"}, "model_path", "single line"),
    ({"model_path": "--help"}, "model_path", "does not start with '-'"),
    ({"served_model_name": " "}, "served_model_name", "non-empty"),
    ({"host": "bad host"}, "host", "host name"),
    ({"port": 0}, "port", "1 to 65535"),
    ({"tensor_parallel_size": 0}, "tensor_parallel_size", ">= 1"),
    ({"pipeline_parallel_size": -2}, "pipeline_parallel_size", ">= 1"),
    ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization", "(0, 1]"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization", "(0, 1]"),
    ({"gpu_memory_utilization": float("nan")}, "gpu_memory_utilization", "(0, 1]"),
    ({"kv_cache_memory_bytes": 0}, "kv_cache_memory_bytes", ">= 1"),
    ({"max_model_len": 0}, "max_model_len", ">= 1"),
    ({"max_num_seqs": -1}, "max_num_seqs", ">= 1"),
    ({"max_num_batched_tokens": 0}, "max_num_batched_tokens", ">= 1"),
    ({"block_size": 0}, "block_size", ">= 1"),
    ({"dtype": "float64"}, "dtype", "did you mean 'float16'?"),
    ({"kv_cache_dtype": "fp9"}, "kv_cache_dtype", "fp8"),
    ({"cudagraph_capture_sizes": (4, 2)}, "cudagraph_capture_sizes", "ascending"),
    ({"cudagraph_capture_sizes": ()}, "cudagraph_capture_sizes", "non-empty"),
    ({"cudagraph_capture_sizes": "1,2"}, "cudagraph_capture_sizes", "a list of batch sizes"),
    ({"max_cudagraph_capture_size": 0}, "max_cudagraph_capture_size", ">= 1"),
    (
        {"cudagraph_capture_sizes": (1, 2, 4), "max_cudagraph_capture_size": 8},
        "max_cudagraph_capture_size",
        "the largest of cudagraph_capture_sizes (4)",
    ),
    ({"enforce_eager": True, "max_cudagraph_capture_size": 8}, "enforce_eager", "cannot be both off and sized"),
    ({"env": {"1BAD": "x"}}, "env", "variable names"),
    ({"env": {"A": "x\x00"}}, "env.A", "NUL"),
    ({"extra_args": ("value-first",)}, "extra_args", "starts with a --flag"),
    ({"extra_args": ("-x",)}, "extra_args", "long flags like --seed"),
    ({"extra_args": ("--seed", "-1")}, "extra_args", None),  # a negative number is a value: allowed
    ({"extra_args": ("--tokenizer", "-x")}, "extra_args", "glued to its flag (--tokenizer=-x)"),
    ({"extra_args": ("--max-num-seqs", "4")}, "extra_args", "set max_num_seqs instead"),
    ({"extra_args": ("--cuda-graph-sizes=8",)}, "extra_args", "set cudagraph_capture_sizes or max_cudagraph"),
    ({"extra_args": ("--no-enable-prefix-caching",)}, "extra_args", "set enable_prefix_caching instead"),
    ({"extra_args": ("--device-memory-utilization", "0.5")}, "extra_args", "set gpu_memory_utilization"),
    ({"extra_args": ("--spec-tokens", "2")}, "extra_args", "set speculative.num_speculative_tokens instead"),
    ({"extra_args": "--seed 0"}, "extra_args", "a list of strings"),
    ({"tensor_parallel_size": "2"}, "tensor_parallel_size", "an integer"),
    ({"enforce_eager": "yes"}, "enforce_eager", "true or false"),
    ({"enable_prefix_caching": 1}, "enable_prefix_caching", "true or false"),
    ({"gpu_memory_utilization": True}, "gpu_memory_utilization", "a number"),
]


@pytest.mark.parametrize(("changes", "field", "allowed"), BAD)
def test_bad_values_name_field_value_and_rule(changes: dict[str, Any], field: str, allowed: str | None) -> None:
    kwargs = {"model_path": MODEL, **changes}
    if allowed is None:
        VllmConfig(**kwargs)
        return
    with pytest.raises(ConfigError) as err:
        VllmConfig(**kwargs)
    assert err.value.field == field
    assert allowed in str(err.value)
    assert isinstance(err.value, DSV4LabError)


SPEC_BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"prompt_lookup_max": 4}, "speculative.method", "prompt_lookup_max needs a method"),
    ({"method": "eagel3", "num_speculative_tokens": 2}, "speculative.method", "did you mean 'eagle3'?"),
    ({"method": "eagle3", "num_speculative_tokens": 0}, "speculative.num_speculative_tokens", ">= 1"),
    ({"method": "eagle3", "model": " "}, "speculative.model", "non-empty"),
    ({"method": "eagle", "prompt_lookup_max": 3}, "speculative.prompt_lookup_max", "only with method 'ngram'"),
    (
        {"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 3},
        "speculative.prompt_lookup_min",
        "at most prompt_lookup_max=3",
    ),
    ({"model": "d", "draft_tensor_parallel_size": 0}, "speculative.draft_tensor_parallel_size", ">= 1"),
]


@pytest.mark.parametrize(("kwargs", "field", "allowed"), SPEC_BAD)
def test_speculative_rules(kwargs: dict[str, Any], field: str, allowed: str) -> None:
    with pytest.raises(ConfigError) as err:
        VllmSpeculativeConfig(**kwargs)
    assert err.value.field == field
    assert allowed in str(err.value)


def test_speculative_is_on_with_a_method_a_model_or_a_token_count() -> None:
    assert not VllmSpeculativeConfig().enabled
    assert VllmSpeculativeConfig(method="ngram").enabled
    assert VllmSpeculativeConfig(model="org/eagle3-head").enabled
    assert VllmSpeculativeConfig(num_speculative_tokens=1).enabled  # the checkpoint's own MTP head
    # a plain table (what TOML hands over) is taken as the nested config
    table: Any = {"method": "mtp", "num_speculative_tokens": 1}
    assert VllmConfig(MODEL, speculative=table).speculative_enabled
    assert not VllmConfig(MODEL, speculative=VllmSpeculativeConfig()).speculative_enabled


def test_unknown_keys_and_missing_model_path_are_named() -> None:
    with pytest.raises(UnknownNameError) as err:
        VllmConfig.from_dict({"model_path": "m", "max_num_seq": 4})
    assert err.value.suggestion == "max_num_seqs"
    with pytest.raises(UnknownNameError) as err:
        VllmConfig.from_dict({"model_path": "m", "speculative": {"methd": "ngram"}})
    assert err.value.field == "speculative.methd"
    with pytest.raises(ConfigError, match="model_path"):
        VllmConfig.from_dict({"port": 8001})
    with pytest.raises(ConfigError, match="a table with method, model, num_speculative_tokens"):
        VllmConfig.from_dict({"model_path": "m", "speculative": "ngram"})


def test_frozen_hashable_and_an_engine_of_its_own() -> None:
    as_lists: Any = {"extra_args": ["--seed", "0"], "cudagraph_capture_sizes": [1, 2]}
    c = VllmConfig(MODEL, env={"A": "1"}, **as_lists)
    assert c == VllmConfig(MODEL, env={"A": "1"}, extra_args=("--seed", "0"), cudagraph_capture_sizes=(1, 2))
    assert hash(c) == hash(c.replace())
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.port = 1  # type: ignore[misc]
    assert VllmConfig.engine == c.engine == "vllm"
    assert ServerConfig.engine == ServerConfig("m").engine == "sglang"
    assert "engine" not in c.to_dict() and "engine" not in field_names()
    assert c.name == MODEL and c.replace(served_model_name="q").name == "q"


def test_every_field_has_help_and_names_are_dotted() -> None:
    names = field_names()
    assert names[0] == "model_path"
    assert "speculative.num_speculative_tokens" in names and "speculative" not in names
    for name in names:
        assert field_help(name)
    assert field_help("env.VLLM_CPU_KVCACHE_SPACE") == "environment variable VLLM_CPU_KVCACHE_SPACE"
    with pytest.raises(UnknownNameError, match="did you mean 'gpu_memory_utilization'"):
        field_help("gpu_mem_util")


def test_exported_where_serverconfig_is() -> None:
    assert config_pkg.VllmConfig is VllmConfig and dsv4lab.VllmConfig is VllmConfig
    assert dsv4lab.VllmSpeculativeConfig is VllmSpeculativeConfig
    assert "VllmConfig" in dsv4lab.__all__ and "VllmConfig" in config_pkg.__all__


# -- overrides ------------------------------------------------------------------------------------------


def test_overrides_are_typed_and_dotted() -> None:
    c = VllmConfig(MODEL).with_overrides(
        {
            "gpu_memory_utilization": "0.5",
            "max_num_seqs": "8",
            "enforce_eager": "yes",
            "enable_prefix_caching": "off",
            "env.VLLM_CPU_KVCACHE_SPACE": "1",
            "speculative.method": "ngram",
            "speculative.num_speculative_tokens": "3",
            "extra_args": "--seed,0",
        }
    )
    assert c.gpu_memory_utilization == 0.5 and c.max_num_seqs == 8
    assert c.enforce_eager is True and c.enable_prefix_caching is False
    assert c.env == {"VLLM_CPU_KVCACHE_SPACE": "1"}
    assert c.speculative == VllmSpeculativeConfig(method="ngram", num_speculative_tokens=3)
    assert c.extra_args == ("--seed", "0")
    back = c.with_overrides(
        {"enable_prefix_caching": "none", "env.VLLM_CPU_KVCACHE_SPACE": "none", "speculative.method": "none"}
    )
    assert back.enable_prefix_caching is None and dict(back.env) == {}
    assert back.speculative == VllmSpeculativeConfig(num_speculative_tokens=3)
    gone = back.with_overrides({"speculative.num_speculative_tokens": "none"})
    assert gone.speculative is None


def test_graph_sizes_from_text() -> None:
    c = VllmConfig(MODEL).with_overrides({"cudagraph_capture_sizes": "[1, 2, 4 8]", "max_cudagraph_capture_size": "8"})
    assert c.cudagraph_capture_sizes == (1, 2, 4, 8) and c.max_cudagraph_capture_size == 8


@pytest.mark.parametrize(
    ("overrides", "error", "text"),
    [
        ({"max_num_seq": "8"}, UnknownNameError, "did you mean 'max_num_seqs'"),
        ({"speculative.tokens": "3"}, UnknownNameError, "unknown config field 'speculative.tokens'"),
        ({"speculative": "x"}, UnknownNameError, "or env.NAME"),
        ({"engine": "sglang"}, UnknownNameError, "unknown config field 'engine'"),
        ({"port": "eighty"}, ConfigError, "an integer"),
        ({"enforce_eager": "maybe"}, ConfigError, "true or false"),
        ({"gpu_memory_utilization": "2"}, ConfigError, "(0, 1]"),
    ],
)
def test_bad_overrides_are_named(overrides: dict[str, str], error: type[Exception], text: str) -> None:
    with pytest.raises(error, match=None) as err:
        VllmConfig(MODEL).with_overrides(overrides)
    assert text in str(err.value)


def test_with_values_takes_python_values_and_text() -> None:
    c = VllmConfig(MODEL).with_values(
        {
            "max_num_seqs": 4,
            "cudagraph_capture_sizes": (1, 2),
            "speculative": VllmSpeculativeConfig(method="eagle3", model="org/head", num_speculative_tokens=2),
            "speculative__enforce_eager": True,
            "env__MY__VAR": "x",
            "block_size": "16",
        }
    )
    assert c.max_num_seqs == 4 and c.cudagraph_capture_sizes == (1, 2) and c.block_size == 16
    assert c.speculative is not None and c.speculative.enforce_eager is True and c.speculative.model == "org/head"
    assert c.env == {"MY__VAR": "x"}
    assert c.with_values({"max_num_seqs": None}).max_num_seqs is None
    with pytest.raises(ConfigError, match="environment values are text"):
        c.with_values({"env.X": 1})
    with pytest.raises(ConfigError) as err:
        c.with_values({"max_num_seqs": "4.5"})
    assert err.value.field == "max_num_seqs"


# -- round trips ----------------------------------------------------------------------------------------


def full_config() -> VllmConfig:
    """Every field set (valid for 0.32.0)."""
    return VllmConfig(
        model_path="/models/Qwen3 0.6B",
        served_model_name="qwen",
        host="0.0.0.0",
        port=8123,
        tensor_parallel_size=2,
        pipeline_parallel_size=2,
        gpu_memory_utilization=0.85,
        kv_cache_memory_bytes=2_000_000_000,
        max_model_len=8192,
        max_num_seqs=32,
        max_num_batched_tokens=4096,
        dtype="bfloat16",
        kv_cache_dtype="fp8_e4m3",
        enforce_eager=False,
        block_size=32,
        enable_prefix_caching=True,
        enable_chunked_prefill=False,
        cudagraph_capture_sizes=(1, 2, 4, 8, 16),
        max_cudagraph_capture_size=16,
        speculative=VllmSpeculativeConfig(
            method="eagle3",
            model="org/eagle3-head",
            num_speculative_tokens=3,
            draft_tensor_parallel_size=1,
            enforce_eager=True,
        ),
        env={"VLLM_CPU_KVCACHE_SPACE": "4", "HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz"},
        extra_args=("--seed", "0", "--disable-log-stats"),
    )


@pytest.mark.parametrize("config", [VllmConfig(MODEL), full_config()], ids=["defaults", "full"])
def test_round_trips_are_exact(config: VllmConfig) -> None:
    assert VllmConfig.from_dict(config.to_dict()) == config
    assert VllmConfig.from_toml(config.to_toml()) == config
    assert VllmConfig.from_json(config.to_json()) == config
    assert json.loads(config.to_json()) == config.to_dict()


def test_redaction_hides_the_token_but_keeps_the_shape() -> None:
    c = full_config()
    shown = c.to_dict(redact=True)
    assert shown["env"]["HF_TOKEN"] == REDACTED and "hf_abcdef" not in c.to_toml(redact=True)
    assert shown["env"]["VLLM_CPU_KVCACHE_SPACE"] == "4"
    html = c._repr_html_()
    assert "hf_abcdef" not in html and "vLLM config (qwen)" in html and "speculative.method" in html
    with pytest.raises(ConfigError, match="placeholder"):
        render_vllm_env(VllmConfig.from_dict(shown))


def test_bad_files_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="valid TOML"):
        VllmConfig.from_toml("model_path = ")
    with pytest.raises(ConfigError, match="valid JSON"):
        VllmConfig.from_json("{")
    with pytest.raises(ConfigError, match="a table/object"):
        VllmConfig.from_json("[1]")


# -- rendering by release -------------------------------------------------------------------------------


@pytest.mark.parametrize("version", RELEASES)
def test_defaults_render_serve_model_and_a_private_host(version: str) -> None:
    assert render_vllm_argv(VllmConfig(MODEL), version) == ["serve", MODEL, "--host", "127.0.0.1"]


def test_the_default_release_is_032() -> None:
    c = full_config()
    assert render_vllm_argv(c) == render_vllm_argv(c, "0.32.0") == render_vllm_argv(c, None)


def test_full_config_on_032() -> None:
    assert render_vllm_argv(full_config(), "0.32.0") == [
        "serve",
        "/models/Qwen3 0.6B",
        "--served-model-name",
        "qwen",
        "--host",
        "0.0.0.0",
        "--port",
        "8123",
        "--tensor-parallel-size",
        "2",
        "--pipeline-parallel-size",
        "2",
        "--gpu-memory-utilization",
        "0.85",
        "--kv-cache-memory-bytes",
        "2000000000",
        "--max-model-len",
        "8192",
        "--max-num-seqs",
        "32",
        "--max-num-batched-tokens",
        "4096",
        "--dtype",
        "bfloat16",
        "--kv-cache-dtype",
        "fp8_e4m3",
        "--block-size",
        "32",
        "--enable-prefix-caching",
        "--no-enable-chunked-prefill",
        "--cudagraph-capture-sizes",
        "1",
        "2",
        "4",
        "8",
        "16",
        "--max-cudagraph-capture-size",
        "16",
        "--speculative-config",
        '{"method":"eagle3","model":"org/eagle3-head","num_speculative_tokens":3,'
        '"draft_tensor_parallel_size":1,"enforce_eager":true}',
        "--seed",
        "0",
        "--disable-log-stats",
    ]


def _after(argv: list[str], flag: str) -> list[str]:
    i = argv.index(flag)
    return argv[i : i + 2]


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("0.8.5", ["--compilation-config", '{"cudagraph_capture_sizes":[1,2,4]}']),
        ("0.11.0", ["--compilation-config", '{"cudagraph_capture_sizes":[1,2,4]}']),
        ("0.32.0", ["--cudagraph-capture-sizes", "1", "2", "4"]),
    ],
)
def test_exact_graph_sizes_per_release(version: str, expected: list[str]) -> None:
    for largest in (None, 4):  # the largest is implied by the list where the release has no flag for both
        argv = render_vllm_argv(
            VllmConfig(MODEL, cudagraph_capture_sizes=(1, 2, 4), max_cudagraph_capture_size=largest), version
        )
        assert argv[4 : 4 + len(expected)] == expected
        assert ("--max-cudagraph-capture-size" in argv) == (version == "0.32.0" and largest is not None)
        assert "--cuda-graph-sizes" not in argv


def test_largest_graph_alone_per_release() -> None:
    c = VllmConfig(MODEL, max_cudagraph_capture_size=64)
    assert _after(render_vllm_argv(c, "0.32.0"), "--max-cudagraph-capture-size") == [
        "--max-cudagraph-capture-size",
        "64",
    ]
    assert _after(render_vllm_argv(c, "0.11.0"), "--cuda-graph-sizes") == ["--cuda-graph-sizes", "64"]
    with pytest.raises(UnsupportedFlagError, match=r"vLLM 0\.8\.5 has no launch flag for max_cudagraph_capture_size"):
        render_vllm_argv(c, "0.8.5")


def test_kv_cache_memory_bytes_is_new_in_0_10_2() -> None:
    c = VllmConfig(MODEL, kv_cache_memory_bytes=10**9)
    for version in ("0.11.0", "0.32.0"):
        assert _after(render_vllm_argv(c, version), "--kv-cache-memory-bytes") == [
            "--kv-cache-memory-bytes",
            "1000000000",
        ]
    with pytest.raises(UnsupportedFlagError) as err:
        render_vllm_argv(c, "0.8.5")
    assert err.value.field == "kv_cache_memory_bytes" and err.value.version == "0.8.5"
    assert "new in vLLM 0.10.2" in str(err.value) and str(err.value).startswith("vLLM 0.8.5")


def test_speculative_config_json_and_its_keys_per_release() -> None:
    spec = VllmSpeculativeConfig(method="ngram", num_speculative_tokens=4, prompt_lookup_min=2, prompt_lookup_max=5)
    for version in RELEASES:
        argv = render_vllm_argv(VllmConfig(MODEL, speculative=spec), version)
        _, blob = _after(argv, "--speculative-config")
        assert json.loads(blob) == {
            "method": "ngram",
            "num_speculative_tokens": 4,
            "prompt_lookup_min": 2,
            "prompt_lookup_max": 5,
        }
    eager = VllmConfig(MODEL, speculative=VllmSpeculativeConfig(method="eagle", model="org/head", enforce_eager=True))
    assert json.loads(_after(render_vllm_argv(eager, "0.11.0"), "--speculative-config")[1])["enforce_eager"] is True
    with pytest.raises(UnsupportedFlagError, match=r"speculative\.enforce_eager.*takes method, model"):
        render_vllm_argv(eager, "0.8.5")
    assert "--speculative-config" not in render_vllm_argv(VllmConfig(MODEL, speculative=VllmSpeculativeConfig()))


@pytest.mark.parametrize(
    ("method", "accepted_by"),
    [
        ("ngram", {"0.8.5", "0.11.0", "0.32.0"}),
        ("eagle3", {"0.8.5", "0.11.0", "0.32.0"}),
        ("deepseek_mtp", {"0.11.0", "0.32.0"}),
        ("mtp", {"0.11.0", "0.32.0"}),
        ("suffix", {"0.32.0"}),
        ("dflash", {"0.32.0"}),
    ],
)
def test_speculative_methods_per_release(method: str, accepted_by: set[str]) -> None:
    assert method in VLLM_SPECULATIVE_METHODS
    c = VllmConfig(MODEL, speculative=VllmSpeculativeConfig(method=method, num_speculative_tokens=2))
    for version in RELEASES:
        if version in accepted_by:
            render_vllm_argv(c, version)
        else:
            with pytest.raises(UnsupportedFlagError, match=f"it accepts .* not {method}"):
                render_vllm_argv(c, version)


@pytest.mark.parametrize(
    ("field", "value", "accepted_by"),
    [
        ("kv_cache_dtype", "fp8_e4m3", {"0.8.5", "0.11.0", "0.32.0"}),
        ("kv_cache_dtype", "bfloat16", {"0.11.0", "0.32.0"}),
        ("kv_cache_dtype", "fp8_inc", {"0.11.0", "0.32.0"}),
        ("kv_cache_dtype", "nvfp4", {"0.32.0"}),
        ("block_size", 16, {"0.8.5", "0.11.0", "0.32.0"}),
        ("block_size", 48, {"0.32.0"}),
        ("dtype", "half", {"0.8.5", "0.11.0", "0.32.0"}),
    ],
)
def test_choices_per_release(field: str, value: Any, accepted_by: set[str]) -> None:
    c = VllmConfig(MODEL, **{field: value})
    for version in RELEASES:
        if version in accepted_by:
            assert str(value) in render_vllm_argv(c, version)
        else:
            with pytest.raises(UnsupportedFlagError) as err:
                render_vllm_argv(c, version)
            assert err.value.field == field and f"not {value}" in str(err.value)


def test_every_kv_cache_dtype_is_some_releases() -> None:
    union = {d for r in VLLM_RELEASES for d in r.kv_cache_dtypes}
    assert union == set(VLLM_KV_CACHE_DTYPES)
    assert all("fp8_e4m3" in r.kv_cache_dtypes and "auto" in r.kv_cache_dtypes for r in VLLM_RELEASES)


@pytest.mark.parametrize("version", RELEASES)
def test_tri_state_booleans_and_eager(version: str) -> None:
    on = render_vllm_argv(VllmConfig(MODEL, enable_prefix_caching=True, enable_chunked_prefill=True), version)
    off = render_vllm_argv(VllmConfig(MODEL, enable_prefix_caching=False, enable_chunked_prefill=False), version)
    assert on[4:] == ["--enable-prefix-caching", "--enable-chunked-prefill"]
    assert off[4:] == ["--no-enable-prefix-caching", "--no-enable-chunked-prefill"]
    assert render_vllm_argv(VllmConfig(MODEL, enforce_eager=True), version)[4:] == ["--enforce-eager"]


def test_values_that_start_with_a_dash_are_glued() -> None:
    argv = render_vllm_argv(VllmConfig(MODEL, served_model_name="-odd"))
    assert "--served-model-name=-odd" in argv


def test_env_never_reaches_the_argv() -> None:
    c = VllmConfig(MODEL, env={"VLLM_CPU_KVCACHE_SPACE": "1", "HF_TOKEN": "hf_secretsecretsecret"})
    assert render_vllm_env(c) == {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_TOKEN": "hf_secretsecretsecret"}
    assert not any("VLLM_CPU" in w or "hf_secret" in w for w in render_vllm_argv(c))


def test_a_passed_flag_the_release_renders_from_a_field_is_refused() -> None:
    c = VllmConfig(MODEL, cudagraph_capture_sizes=(1, 2), extra_args=("--compilation-config", '{"mode":3}'))
    render_vllm_argv(c, "0.32.0")  # 0.32 renders the sizes with flags of their own
    with pytest.raises(ConfigError, match="--compilation-config is rendered from a field"):
        render_vllm_argv(c, "0.11.0")


def test_unknown_release_lists_the_known_ones() -> None:
    for bad in ("0.9.2", "0.32", "latest"):
        with pytest.raises(UnknownNameError) as err:
            render_vllm_argv(VllmConfig(MODEL), bad)
        assert "0.8.5, 0.11.0, 0.32.0" in str(err.value)
    assert resolve_vllm_release("0.8.5.post1").version == "0.8.5"
    assert resolve_vllm_release("0.32.0+cpu").version == "0.32.0"
    assert resolve_vllm_release("v0.11.0").version == "0.11.0"
    assert resolve_vllm_release(None).version == "0.32.0"


def test_server_command_and_owned_flags() -> None:
    assert vllm_server_command("0.8.5", python="/venv/bin/python") == [
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.cli.main",
    ]
    owned = flags_owned_by_vllm_fields()
    for release in VLLM_RELEASES:
        for flag in release.flags.values():
            assert flag in owned
    assert owned["--cuda-graph-sizes"].startswith("cudagraph_capture_sizes")
    assert owned["--kv-cache-memory-bytes"] == "kv_cache_memory_bytes"
