"""``make demo``: the story, as far as the project can take it today.

It replays the campaign on the SGLang twin (:mod:`dsv4lab.story`: preflight, launch, watch, diagnose,
profile, A/B) and, next to it, writes for each config the files dsv4lab would run on a real host: the
validated config, the env file and the launch script for real SGLang, with what changed between steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from dsv4lab.config import ServerConfig, diff, save
from dsv4lab.presets import config_a, config_b, config_b_fixed
from dsv4lab.render import render_env_file, render_launch_script
from dsv4lab.story import StorySettings, run_story

__all__ = ["STEPS", "DemoStep", "run_demo", "write_scripts"]

#: The release the demo renders for: the newest dsv4lab knows.
DEMO_SGLANG_VERSION = "0.5.23"


@dataclass(frozen=True)
class DemoStep:
    slug: str
    title: str
    config: ServerConfig
    story: str


STEPS: tuple[DemoStep, ...] = (
    DemoStep(
        "1-config-a",
        "Config A: baseline with the cheap levers",
        config_a(),
        "Tuned FP8 block-GEMM configs, NCCL LL/Ring, CUDA graphs, mem-fraction-static 0.70.",
    ),
    DemoStep(
        "2-config-b",
        "Config B: A + MTP speculative decoding",
        config_b(),
        "EAGLE 1/1/2 with the NextN head from the base checkpoint, same 0.70: in the story it died in "
        "CUDA graph capture on GPU 1.",
    ),
    DemoStep(
        "5-config-b-fixed",
        "Config B-fixed: more slack for graphs, smaller captured batch",
        config_b_fixed(),
        "mem-fraction-static 0.60 and cuda-graph-max-bs 16: the MTP server started.",
    ),
)


def run_demo(out_root: Path, settings: StorySettings | None = None, *, campaign: bool = True) -> Path:
    """Run the campaign on the twin and write the real-host scripts; return the new report folder."""
    out = out_root / time.strftime("demo-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=False)
    write_scripts(out / "real-host")
    if campaign:
        run_story(out, settings or StorySettings())
    return out


def write_scripts(out: Path) -> Path:
    """The configs, env files and launch scripts of each step, rendered for a real SGLang host."""
    out.mkdir(parents=True, exist_ok=True)
    summary = [
        "# dsv4lab demo: the DeepSeek-V4-Flash campaign",
        "",
        f"Rendered for SGLang {DEMO_SGLANG_VERSION}. Each folder holds config.toml, env.sh and launch.sh.",
        "",
    ]
    previous: ServerConfig | None = None
    for step in STEPS:
        d = out / step.slug
        d.mkdir()
        save(step.config, d / "config.toml")
        run_dir = f"~/dsv4lab-runs/{step.slug}"
        (d / "env.sh").write_text(render_env_file(step.config), encoding="utf-8")
        script = render_launch_script(step.config, run_dir=run_dir, sglang_version=DEMO_SGLANG_VERSION)
        (d / "launch.sh").write_text(script, encoding="utf-8")
        summary += [f"## {step.title}", "", step.story, ""]
        if previous is not None:
            summary += [
                "Changes from the previous step:",
                "",
                "```",
                str(diff(previous, step.config)),
                "```",
                "",
            ]
        previous = step.config
    (out / "README.md").write_text("\n".join(summary), encoding="utf-8")
    return out
