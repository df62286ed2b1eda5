"""--gpu-mem: a board whose memory differs from the catalog's (a DGX Station's GB300, 252 GiB where the catalog's
GB300 has 268) is planned at its own capacity: the fit, the headroom and the safety margin follow it."""

import json

import pytest

from overdrive.env import gpu_by_key

from plan_cli import refused, run  # noqa: F401 (a fixture)

FLAGS = ["--model", "llama3-70b", "--gpu", "gb300", "--gpus", "1", "--seq", "4096", "--micro-batch", "1",
         "--precision", "bf16", "--sharding", "none", "--checkpointing", "full", "--lora-rank", "16", "--json"]


def test_the_catalog_entry_takes_the_boards_memory():
    g, station = gpu_by_key("gb300"), gpu_by_key("gb300", mem_gib=252)
    assert station.mem_gib == pytest.approx(252) and g.mem_gib == pytest.approx(268)
    assert (station.key, station.bf16_tflops, station.hbm_tbs) == (g.key, g.bf16_tflops, g.hbm_tbs)
    assert "--gpu-mem" in station.note
    for bad in (0, -5, 5000, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="--gpu-mem .*give the GPU's memory in GiB, 1 to 4096"):
            gpu_by_key("gb300", mem_gib=bad)


def test_a_plan_fits_the_catalogs_card_and_not_the_smaller_board(run):
    catalog = json.loads(run(*FLAGS).stdout)
    need = catalog["candidates"][0]["memory_gib"]
    assert catalog["capacity_gib"] == pytest.approx(268)
    small = round(need - 4, 1)   # between the plan's need and the catalog's capacity: fits there, not here
    assert small < 268 - 30
    cp = run(*FLAGS, "--gpu-mem", f"{small:.1f}")
    assert cp.returncode == 0, cp.stderr
    board = json.loads(cp.stdout)
    assert board["capacity_gib"] == pytest.approx(small, abs=0.01)
    assert catalog["candidates"][0]["fits"] and not board["candidates"][0]["fits"]
    assert board["candidates"][0]["memory_gib"] == pytest.approx(need)   # the need is the model's, not the card's
    assert board["min_headroom_gib"] < catalog["min_headroom_gib"]      # 10% of the board's memory


def test_explain_plans_the_boards_memory_and_bad_values_are_one_line(run):
    cp = run(*FLAGS[:-1], "--gpu-mem", "252", "--explain")
    assert cp.returncode == 0, cp.stderr
    refused(run(*FLAGS, "--gpu-mem", "0"), "--gpu-mem 0.0: give the GPU's memory in GiB, 1 to 4096")
    refused(run(*FLAGS, "--gpu-mem", "nan"), "--gpu-mem nan: give the GPU's memory in GiB")
    refused(run(*FLAGS, "--gpu-mem", "lots"), "--gpu-mem: invalid float value")
