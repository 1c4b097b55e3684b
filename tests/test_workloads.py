"""``draftheads speed speed.workloads=true`` at toy size on a tiny target: the backend choice,
batches against batched greedy, the long set and sampling rows, written into a figures file."""

from __future__ import annotations

import json

import pytest

from draftheads.bench.figures import write_figures
from draftheads.conf.cli import main
from draftheads.decode import backend as backends
from draftheads.heads import EagleDrafter, fingerprint
from tests.conftest import get_target


@pytest.fixture(scope="module")
def eagle_dir(tmp_path_factory):
    model, tok = get_target("llama")
    d = tmp_path_factory.mktemp("eagle")
    EagleDrafter(fingerprint(model, tok), target_config=model.config.to_dict()).save_pretrained(d)
    return d


def tiny_argv(heads, figures) -> list[str]:
    """The workload bench at its smallest: 2 held-out prompts, batches of 1 and 2, one long
    prompt (of the two that fit the tiny target's 1024 positions), 4 new tokens, one temperature."""
    return [
        "speed",
        f"heads={heads}",
        "target=tiny-llama",
        "speed.workloads=true",
        "speed.batch_sizes=[1,2]",
        "speed.prompts=2",
        "speed.long_prompts=1",
        "speed.copy_per_category=1",
        "speed.temperatures=[0.7]",
        "speed.sampling_sets=[heldout]",
        "decode.max_new_tokens=4",
        f"speed.figures={figures}",
    ]


def test_workload_rows_keep_greedy_output_and_land_in_the_figures_file(eagle_dir, tmp_path, capsys):
    figures = tmp_path / "benchmarks.json"
    figures.write_text(
        json.dumps({"command": "draftheads bench", "settings": {"x": 1}, "drafters": {"d": 2}})
    )
    assert main(tiny_argv(eagle_dir, figures)) == 0
    captured = capsys.readouterr()
    assert "14 long prompts left out: longer than the target's 1024 positions" in captured.err
    record = json.loads(figures.read_text())
    assert record["settings"] == {"x": 1} and record["drafters"] == {"d": 2}  # the rest is kept
    rows = record["workloads"]
    assert rows["command"] == "draftheads speed speed.workloads=true"  # run from Python: no command line
    assert rows["settings"]["heads"] == str(eagle_dir) and rows["settings"]["target"] == "tiny-llama"
    assert (
        rows["settings"]["speed"]["batch_sizes"] == [1, 2]
        and rows["settings"]["decode"]["max_new_tokens"] == 4
    )
    # the backend auto chose for the target and the drafter, with every candidate's timing
    # (where oneDNN is absent one backend applies and nothing is timed)
    assert set(rows["backend"]) == ({"target", "drafter"} if backends.onednn_available() else set())
    for part, choice in rows["backend"].items():
        assert choice["part"] == part and choice["name"] in choice["seconds"] and not choice["asked"]
        assert all(s > 0 for s in choice["seconds"].values())
    assert [r["batch"] for r in rows["batches"]] == [1, 2]
    for r in rows["batches"]:
        assert r["identical"] is True and r["identical_to_stock"] is True
        assert r["spec_tok_s"] > 0 and r["baseline_tok_s"] > 0 and r["speedup"] > 0
        # both plain loops on the backend, the ratio against the faster
        assert r["baseline_tok_s"] == max(r["generate_tok_s"], r["retiring_tok_s"])
    long = rows["long"]
    assert long["num_prompts"] == 1 and long["greedy_identical"] == 1.0 and long["identical_to_stock"] == 1.0
    assert long["pld"]["tau"] >= 1.0 and "per_category" not in long
    # the copy set: the drafter and lookup alone on the same turns, prompt lookup beside them
    assert set(rows["copy"]) == {"heads", "lookup"}
    for r in rows["copy"].values():
        assert r["greedy_identical"] == 1.0 and r["pld"]["tau"] >= 1.0 and r["num_prompts"] >= 1
    assert "copy prompts, lookup: τ" in captured.out
    (sampled,) = rows["sampling"]["heldout"]
    assert sampled["temperature"] == 0.7 and sampled["num_prompts"] == 2 and sampled["tau"] >= 1.0
    assert sampled["tokens_per_s"] > 0 and sampled["baseline_tokens_per_s"] > 0
    assert "workload rows written to" in captured.out and "| temperature |" in captured.out


def test_the_bench_keeps_the_workload_rows_when_it_rewrites_the_figures(tmp_path):
    path = tmp_path / "benchmarks.json"
    runs = [{"command": "draftheads bench bench.teacher_tokens=40000", "ablations": {"dflash": {"tau": 1.8}}}]
    full = [{"name": "another machine", "command": "draftheads bench", "drafters": {"dflash": {}}}]
    earlier = {"command": "c", "settings": {}, "workloads": {"batches": [{"batch": 4}]}, "reduced_runs": runs}
    earlier["full_runs"] = full
    path.write_text(json.dumps(earlier))
    write_figures({"drafters": {}, "train": {"steps": 3}}, {"s": 1}, path)
    record = json.loads(path.read_text())
    assert record["workloads"] == {"batches": [{"batch": 4}]} and record["train"] == {"steps": 3}
    assert record["reduced_runs"] == runs and record["full_runs"] == full
    assert record["settings"] == {"s": 1}


@pytest.mark.parametrize(
    ("setting", "content", "message"),
    [
        ("figures.txt", None, "is not a .json file"),
        ("figures.json", "[1, 2]", "was not written by draftheads bench"),
        ("figures.json", '{"rows": 1}', "was not written by draftheads bench"),
    ],
)
def test_a_figures_file_the_bench_did_not_write_is_refused_unchanged(
    tmp_path, capsys, setting, content, message
):
    path = tmp_path / setting
    if content is not None:
        path.write_text(content)
    assert main(tiny_argv("none", path)) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: speed.figures=") and message in err and len(err.splitlines()) == 1
    if content is None:
        assert not path.exists()
    else:
        assert path.read_text() == content


def test_figures_without_the_workload_rows_is_refused(tmp_path, capsys):
    assert main(["speed", "heads=none", f"speed.figures={tmp_path / 'f.json'}"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "error: speed.figures is written by the workload rows; add speed.workloads=true"
    assert not (tmp_path / "f.json").exists()


def test_workload_settings_no_run_can_use_are_refused(capsys):
    assert main(["speed", "heads=none", "speed.workloads=true", "speed.temperatures=[0]"]) == 1
    assert "error: speed.temperatures has 0.0; use temperatures > 0" in capsys.readouterr().err
    assert main(["speed", "heads=none", "speed.workloads=true", "speed.sampling_sets=[nowhere]"]) == 1
    assert "speed.sampling_sets" in capsys.readouterr().err
