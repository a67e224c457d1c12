from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dsv4lab.config.presets import config_a, config_b, config_b_fixed, preset
from dsv4lab.config.server_config import (
    ConfigDiff,
    EnvVars,
    ServerConfig,
    SpeculativeConfig,
    diff,
    field_help,
    field_names,
    load,
    save,
)
from dsv4lab.errors import ConfigError, DSV4LabError

# -- validation -----------------------------------------------------------------------------------------

BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"mem_fraction_static": 1.0}, "mem_fraction_static", "between 0 and 1"),
    ({"mem_fraction_static": 0.0}, "mem_fraction_static", "between 0 and 1"),
    ({"mem_fraction_static": float("nan")}, "mem_fraction_static", "between 0 and 1"),
    ({"tp": 0}, "tp", ">= 1"),
    ({"dp": -1}, "dp", ">= 1"),
    ({"port": 70000}, "port", "1 to 65535"),
    ({"host": "bad host"}, "host", "host name"),
    ({"cuda_graph_max_bs": 0}, "cuda_graph_max_bs", ">= 1"),
    ({"cuda_graph_bs": (4, 2)}, "cuda_graph_bs", "ascending"),
    ({"cuda_graph_bs": (1, 2, 32), "cuda_graph_max_bs": 16}, "cuda_graph_bs", "up to cuda_graph_max_bs=16"),
    ({"disable_cuda_graph": True, "cuda_graph_max_bs": 16}, "disable_cuda_graph", "cannot be both"),
    ({"chunked_prefill_size": 0}, "chunked_prefill_size", "-1"),
    ({"kv_cache_dtype": "fp16"}, "kv_cache_dtype", "fp8_e4m3"),
    ({"quantization": "FP8; rm"}, "quantization", "method name"),
    ({"nnodes": 2, "tp": 8}, "dist_init_addr", "required when nnodes > 1"),
    ({"nnodes": 2, "tp": 8, "node_rank": 2, "dist_init_addr": "n0:5000"}, "node_rank", "0 to nnodes-1"),
    ({"nnodes": 3, "tp": 8, "dist_init_addr": "n0:5000"}, "tp", "multiple of nnodes"),
    ({"dist_init_addr": "n0"}, "dist_init_addr", "HOST:PORT"),
    ({"env": {"1BAD": "x"}}, "env", "variable names"),
    ({"model_path": "a\nb"}, "model_path", "single line"),
    ({"model_path": "  "}, "model_path", "non-empty"),
    ({"extra_args": ("value-first",)}, "extra_args", "starts with a --flag"),
    ({"extra_args": ("-x",)}, "extra_args", "long flags"),
    ({"extra_args": ("--attention-backend", "-x")}, "extra_args", "glued to its flag (--attention-backend=-x)"),
    ({"extra_args": ("--tp-size", "4")}, "extra_args", "set tp instead"),
    ({"extra_args": ("--cuda-graph-max-bs-decode=8",)}, "extra_args", "set cuda_graph_max_bs instead"),
    ({"tp": "8"}, "tp", "an integer"),
    ({"tp": True}, "tp", "an integer"),
    ({"trust_remote_code": "yes"}, "trust_remote_code", "true or false"),
    ({"env_files": "a.sh"}, "env_files", "a list of strings"),
]


@pytest.mark.parametrize(("changes", "field", "allowed"), BAD)
def test_bad_values_name_field_value_and_rule(changes: dict[str, Any], field: str, allowed: str) -> None:
    base = {"model_path": "m"}
    with pytest.raises(ConfigError) as err:
        ServerConfig(**{**base, **changes})
    assert err.value.field == field
    assert allowed in str(err.value)
    assert isinstance(err.value, DSV4LabError)


SPEC_BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"eagle_topk": 1}, "speculative.algorithm", "eagle_topk needs an algorithm"),
    ({"algorithm": "MEDUSA"}, "speculative.algorithm", "allowed: EAGLE"),
    (
        {"algorithm": "EAGLE", "num_steps": 1, "eagle_topk": 1, "num_draft_tokens": 3},
        "speculative.num_draft_tokens",
        "num_steps + 1 = 2",
    ),
    (
        {"algorithm": "EAGLE", "num_steps": 2, "eagle_topk": 2, "num_draft_tokens": 8},
        "speculative.num_draft_tokens",
        "at most",
    ),
    (
        {"algorithm": "EAGLE", "num_steps": 1},
        "speculative.num_steps/eagle_topk/num_draft_tokens",
        "all three",
    ),
    (
        {"algorithm": "EAGLE", "num_steps": 0, "eagle_topk": 1, "num_draft_tokens": 1},
        "speculative.num_steps",
        ">= 1",
    ),
]


@pytest.mark.parametrize(("kwargs", "field", "allowed"), SPEC_BAD)
def test_speculative_rules(kwargs: dict[str, Any], field: str, allowed: str) -> None:
    with pytest.raises(ConfigError) as err:
        SpeculativeConfig(**kwargs)
    assert err.value.field == field
    assert allowed in str(err.value)


def test_speculative_defaults_left_to_sglang() -> None:
    spec = SpeculativeConfig(algorithm="EAGLE")
    assert spec.enabled and spec.num_steps is None


def test_unknown_key_is_named() -> None:
    with pytest.raises(ConfigError) as err:
        ServerConfig.from_dict({"model_path": "m", "mem_fraction": 0.7})
    assert err.value.field == "mem_fraction"
    assert "mem_fraction_static" in str(err.value)


def test_missing_model_path() -> None:
    with pytest.raises(ConfigError, match="model_path"):
        ServerConfig.from_dict({"tp": 8})


def test_every_field_has_help() -> None:
    for name in field_names():
        assert len(field_help(name)) > 10, name
    with pytest.raises(ConfigError):
        field_help("nope")


def test_config_is_frozen_and_hashable() -> None:
    a = config_a()
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.tp = 4  # type: ignore[misc]
    assert hash(a) == hash(config_a())
    assert {a, config_a()} == {a}
    assert isinstance(a.env, EnvVars)
    assert a.env == {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}


# -- presets and diff -------------------------------------------------------------------------------------


def test_presets_match_the_story() -> None:
    a, b, fixed = config_a(), config_b(), config_b_fixed()
    assert a.model_path == "deepseek-ai/DeepSeek-V4-Flash"
    assert a.tp == 8 and a.mem_fraction_static == 0.70 and not a.disable_cuda_graph
    assert a.env["NCCL_PROTO"] == "LL" and a.env["NCCL_ALGO"] == "Ring"
    assert a.kernel_config_dir is not None
    assert b.speculative == SpeculativeConfig("EAGLE", 1, 1, 2, None)
    assert b.mem_fraction_static == 0.70
    assert fixed.mem_fraction_static == 0.60 and fixed.cuda_graph_max_bs == 16
    assert preset("config_b") == b
    with pytest.raises(ConfigError, match="config_a"):
        preset("config_c")


def test_diff_lists_what_changed() -> None:
    d = diff(config_b(), config_b_fixed())
    assert [c.field for c in d] == ["mem_fraction_static", "cuda_graph_max_bs"]
    assert str(d) == "mem_fraction_static: 0.7 -> 0.6\ncuda_graph_max_bs: (unset) -> 16"
    assert "<table" in d._repr_html_()
    assert d.as_dict()["cuda_graph_max_bs"] == {"before": None, "after": 16}
    assert not diff(config_a(), config_a())
    assert str(ConfigDiff(())) == "(no differences)"
    spec = diff(config_a(), config_b())
    assert "speculative.algorithm" in [c.field for c in spec]


def test_diff_env_keys() -> None:
    a = config_a()
    b = a.replace(env={"NCCL_PROTO": "Simple", "NCCL_DEBUG": "INFO"})
    fields = {c.field: (c.before, c.after) for c in diff(a, b)}
    assert fields == {
        "env.NCCL_PROTO": ("LL", "Simple"),
        "env.NCCL_ALGO": ("Ring", None),
        "env.NCCL_DEBUG": (None, "INFO"),
    }


# -- overrides --------------------------------------------------------------------------------------------


def test_overrides_are_typed() -> None:
    c = config_b().with_overrides(
        {
            "mem_fraction_static": "0.6",
            "cuda_graph_max_bs": "16",
            "trust_remote_code": "false",
            "cuda_graph_bs": "1,2,4,8,16",
            "env.NCCL_DEBUG": "WARN",
            "env.NCCL_ALGO": "none",
            "speculative.num_steps": "2",
            "speculative.num_draft_tokens": "3",
        }
    )
    assert c.mem_fraction_static == 0.6
    assert c.cuda_graph_bs == (1, 2, 4, 8, 16)
    assert not c.trust_remote_code
    assert dict(c.env) == {"NCCL_PROTO": "LL", "NCCL_DEBUG": "WARN"}
    assert c.speculative is not None and c.speculative.num_steps == 2


def test_override_unset_and_errors() -> None:
    assert config_b_fixed().with_overrides({"cuda_graph_max_bs": "none"}).cuda_graph_max_bs is None
    with pytest.raises(ConfigError, match="an integer"):
        config_a().with_overrides({"tp": "eight"})
    with pytest.raises(ConfigError, match=r"did you mean 'tp'.*allowed: model_path"):
        config_a().with_overrides({"tpp": "8"})
    with pytest.raises(ConfigError, match="allowed: model_path"):
        config_a().with_overrides({"speculative.depth": "8"})


# -- round trips ------------------------------------------------------------------------------------------

_line = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00\n\r"),
    min_size=1,
    max_size=30,
).filter(lambda s: s.strip() != "")
_any_text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30)
_env_name = st.from_regex(r"[A-Z_][A-Z0-9_]{0,12}", fullmatch=True)


@st.composite
def configs(draw: st.DrawFn) -> ServerConfig:
    spec = draw(
        st.one_of(
            st.none(),
            st.builds(SpeculativeConfig, algorithm=st.sampled_from(["EAGLE", "NEXTN", "EAGLE3"])),
            st.integers(1, 4).map(lambda n: SpeculativeConfig("EAGLE", n, 1, n + 1)),
        )
    )
    nnodes = draw(st.sampled_from([1, 2]))
    max_bs = draw(st.one_of(st.none(), st.integers(1, 512)))
    return ServerConfig(
        model_path=draw(_line),
        served_model_name=draw(st.one_of(st.none(), _line)),
        tp=8,
        dp=draw(st.integers(1, 4)),
        port=draw(st.integers(1, 65535)),
        mem_fraction_static=draw(st.one_of(st.none(), st.floats(0.01, 0.99, allow_nan=False, allow_infinity=False))),
        cuda_graph_max_bs=max_bs,
        cuda_graph_bs=draw(
            st.one_of(
                st.none(),
                st.sets(st.integers(1, max_bs or 512), min_size=1, max_size=6).map(lambda s: tuple(sorted(s))),
            )
        ),
        max_running_requests=draw(st.one_of(st.none(), st.integers(1, 4096))),
        chunked_prefill_size=draw(st.one_of(st.none(), st.just(-1), st.integers(1, 65536))),
        context_length=draw(st.one_of(st.none(), st.integers(1, 1 << 20))),
        kv_cache_dtype=draw(st.one_of(st.none(), st.sampled_from(["auto", "fp8_e4m3", "bf16"]))),
        trust_remote_code=draw(st.booleans()),
        enable_metrics=draw(st.booleans()),
        speculative=spec,
        nnodes=nnodes,
        node_rank=draw(st.integers(0, nnodes - 1)),
        dist_init_addr="node0:5000" if nnodes > 1 else None,
        env=draw(st.dictionaries(_env_name, _any_text, max_size=4)),
        env_files=tuple(draw(st.lists(_line, max_size=3))),
        kernel_config_dir=draw(st.one_of(st.none(), _line)),
        extra_args=tuple(draw(st.sampled_from([[], ["--attention-backend", "triton"], ["--log-level=debug"]]))),
    )


@settings(max_examples=150, deadline=None)
@given(configs())
def test_toml_and_json_round_trip_exactly(config: ServerConfig) -> None:
    assert ServerConfig.from_toml(config.to_toml()) == config
    assert ServerConfig.from_json(config.to_json()) == config
    assert ServerConfig.from_dict(config.to_dict()) == config


def test_save_and_load_files(tmp_path: Path) -> None:
    for name in ("c.toml", "c.json"):
        path = save(config_b_fixed(), tmp_path / name)
        assert load(path) == config_b_fixed()
    with pytest.raises(ConfigError, match=r"\.toml or \.json"):
        save(config_a(), tmp_path / "c.yaml")
    with pytest.raises(ConfigError, match="readable"):
        load(tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_text("tp = [", encoding="utf-8")
    with pytest.raises(ConfigError, match="valid TOML"):
        load(tmp_path / "bad.toml")


def test_html_repr_lists_fields_with_help() -> None:
    html = config_b()._repr_html_()
    assert "speculative.num_draft_tokens" in html and "mem_fraction_static" in html
    assert "share of free GPU memory" in html


def _as_text(value: Any) -> str:
    """A value as a user types it after ``--set field=``."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return repr(value) if isinstance(value, float) else str(value)


def _typed_back_exactly(value: Any) -> bool:
    """Text that ``none`` or list splitting would read differently (documented: ``none`` unsets, lists split
    at commas and spaces) is left out; everything else must come back as it was."""
    if isinstance(value, str):
        return value.strip().lower() not in ("none", "null", "unset", "") and value == value.strip()
    if isinstance(value, list):
        return all(not isinstance(v, str) or not re.search(r"[,\s\[\]]", v) for v in value) and bool(value)
    return True


def test_only_the_first_double_underscore_is_the_dot() -> None:
    base = ServerConfig(model_path="m")
    assert base.with_values({"env__MY__VAR": "1"}).env == {"MY__VAR": "1"}
    assert base.with_values({"env.__": "x"}).env == {"__": "x"}
    assert base.with_values({"speculative__algorithm": "EAGLE"}).speculative is not None


@settings(max_examples=60, deadline=None)
@given(configs(), configs())
def test_a_diff_typed_as_overrides_turns_one_config_into_the_other(a: ServerConfig, b: ServerConfig) -> None:
    changes = diff(a, b)
    assume(all(_typed_back_exactly(c.after) for c in changes))
    assert a.with_overrides({c.field: _as_text(c.after) for c in changes}) == b
    assert a.with_values({c.field: c.after for c in changes}) == b
    assert a.with_values({c.field.replace(".", "__"): c.after for c in changes}) == b
