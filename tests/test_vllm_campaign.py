"""The real-engine campaign, end to end, against a REAL vLLM (the CPU build serving the tiny random Llama).

``dsv4lab campaign dsv4lab/campaigns/vllm-cpu.toml`` as a user runs it: the baseline launched, watched to
READY and benchmarked; a context too long for the KV space predicted to fail, launched anyway and seen to
fail where and with the figures predicted (vLLM's own words in the server's log, on the memory node the
preflight read), diagnosed live, the fix that keeps the context chosen from candidates each predicted
again; the fix relaunched as arm A of an A/B of ``max_num_seqs`` with confidence intervals; a report per
step and an index that open offline. Nothing of any server is left running (the autouse check of
``conftest`` looks for processes started under the test's folder).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from dsv4lab.notebook.experiment import read_results
from dsv4lab.resources import CAMPAIGNS
from tests.vllmserver import VENV, cli

pytestmark = [pytest.mark.slow, pytest.mark.campaign]

PYTHON = str(VENV / "bin" / "python")
#: Four vLLM starts and one that fails at its KV check, three kernels: about 4-5 minutes on two idle cores.
CAMPAIGN_TIMEOUT_S = 1500


@pytest.mark.timeout(CAMPAIGN_TIMEOUT_S + 120)
def test_the_vllm_campaign_on_a_real_server(vllm_model: Path, cli_env: dict[str, str], tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    run = cli(
        "campaign", str(CAMPAIGNS / "vllm-cpu.toml"), "-p", "python", PYTHON, "-p", "model_path", str(vllm_model),
        "--reports", str(reports), env=cli_env, timeout_s=CAMPAIGN_TIMEOUT_S,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    index = Path(run.stdout.strip().splitlines()[-1])
    state = json.loads((index.parent / "campaign.json").read_text())
    steps: dict[str, Any] = state["steps"]
    assert [steps[s]["status"] for s in ("baseline", "failure", "fixed")] == ["ok", "ok", "ok"], steps
    figures = {s: read_results(steps[s]["run_dir"])["figures"] for s in steps}

    baseline = figures["baseline"]
    assert baseline["verdict"] == "READY" and baseline["predicted"] == "fits", baseline
    assert baseline["output_throughput_c1"] > 0 and baseline["output_throughput_c4"] > 0

    # Predicted, then seen: the same step, with vLLM's own figures.
    failure = figures["failure"]
    assert failure["predicted"].startswith("fails in kv_cache_alloc, short by"), failure
    assert (failure["verdict"], failure["outcome"], failure["phase"]) == ("CRASHED", "oom", "kv_cache_alloc"), failure
    assert failure["as_predicted"] is True and "max seq len (600000)" in failure["cause"], failure
    assert failure["detected_after_s"] is not None and failure["detected_after_s"] < 2.0, failure
    server = Path(failure["server_dir"])
    log = (server / "server.log").read_text(errors="replace")
    assert "To serve at least one request with the model's max seq len (600000), (1.14 GiB KV cache" in log
    assert "available KV cache memory (1.0 GiB)" in log and "estimated maximum model length is 524160" in log
    predicted = json.loads((server / "server.json").read_text())["preflight"]
    node = re.search(r"Explicitly set \(1\.0/([\d.]+)\) GiB for KV cache on node (\d+)", log)
    assert node is not None, log[-3000:]
    assert float(node.group(1)) == pytest.approx(predicted["host_memory"]["total_gib"], abs=0.01)
    assert int(node.group(2)) == predicted["host_memory"]["node"]
    # dsv4lab watch reads the same verdict from the run dir later, with vLLM's own fix first among others.
    watched = json.loads(cli("watch", str(server), "--json", "--timeout", "10", env=cli_env).stdout)
    assert watched["verdict"] == "CRASHED" and watched["diagnosis"]["phase"] == "kv_cache_alloc", watched
    assert any("--max-model-len" in f["change"] for f in watched["diagnosis"]["fixes"]), watched["diagnosis"]
    # Of vLLM's two ways out, the one that keeps the asked context, each predicted again.
    assert failure["chosen_fix"] == "env.VLLM_CPU_KVCACHE_SPACE=2" and failure["chosen_fix_keeps_max_model_len"]
    assert failure["chosen_fix_headroom_gib"] > 1.0

    # The fix relaunched (arm A) against one lever: max_num_seqs=1 serves four requests one at a time.
    fixed = figures["fixed"]
    assert fixed["fixed_verdict"] == "READY" and fixed["fixed_predicted"] == "fits", fixed
    assert fixed["fix"] == "env.VLLM_CPU_KVCACHE_SPACE=2" and fixed["lever"] == "max_num_seqs=1"
    at4 = fixed["lever_gain_c4"]
    # One request at a time is slower at concurrency 4; on this noisy CPU server five repeats do not always
    # exclude zero (seen: -49%, CI -108% to +10%), so the verdict must follow its own interval.
    assert at4["repeats"] == [5, 5] and at4["rel"] < 0, at4
    assert at4["verdict"] == ("worse" if at4["ci"][1] < 0 else "no detectable difference"), at4
    assert fixed["lever_gain_c1"]["repeats"] == [5, 5]

    # The pages: one report per step and the index, offline, every chart inline SVG.
    page = index.read_text()
    assert "max_num_seqs=1 against the fixed config, concurrency 4" in page
    assert "{failure." not in page and "env.VLLM_CPU_KVCACHE_SPACE=2" in page
    for step in steps.values():
        report = Path(step["report"]).read_text()
        assert 'src="data:image/svg+xml' in report, step["report"]  # each chart an SVG inside the page
        assert not re.search(r"""(src|href)=["']https?://""", report), step["report"]
    for chart in ("memory-baseline", "memory-long-context", "ab-lever"):
        svg = next(reports.rglob(f"charts/{chart}.svg")).read_text()
        assert "GPU memory" not in svg, chart  # a CPU host: the charts say host memory
