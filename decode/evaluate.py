"""``draftheads eval``: acceptance (τ) and wall-clock speedup on a prompt set, with baselines.

Every prompt is chat-templated and every turn of a multi-turn prompt is decoded: the
conversation grows with the target's own answer to each turn. For each turn, in the same
run and back to back, we decode

* with the target's plain greedy ``generate`` (the baseline and the reference output),
* with the speculative generator (target + drafter),
* with each requested baseline: transformers' prompt lookup decoding (``pld``) and, when
  ``eval.assistant_model`` is given, assisted generation (``assisted``).

τ is the mean number of tokens a target forward produces (bonus token included); for the
transformers baselines it is counted the same way, with a forward hook on the target.
Outputs go to ``eval.output_dir``: ``report.json``, ``report.md`` and PNG plots.
"""

from __future__ import annotations

import json
import platform
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from draftheads.conf.errors import UserError
from draftheads.conf.schema import Config


@dataclass
class TurnResult:
    """One decoded turn: the speculative run's counters next to each baseline's."""

    prompt_id: str
    category: str
    new_tokens: int
    spec_time_s: float
    base_time_s: float
    target_forwards: int
    accepted_lengths: list[int]
    identical: bool
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    baselines: dict[str, dict[str, float]] = field(default_factory=dict)


class ForwardCounter:
    """Counts forward calls of a module (a forward hook), to measure τ of any decoding method."""

    def __init__(self, module: nn.Module) -> None:
        self.count = 0
        self._handle = module.register_forward_hook(self._hook)

    def _hook(self, *_: Any) -> None:
        self.count += 1

    def close(self) -> None:
        self._handle.remove()


def chat_ids(tokenizer, messages: list[dict[str, str]], device: torch.device) -> torch.Tensor:
    """The chat-templated prompt, ready for the assistant's answer: ``[1, T]``."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"].to(device)


def timed(fn, *args, **kwargs):
    """``(result, seconds)``; synchronises CUDA so that GPU time is counted."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def evaluate_prompts(
    target: nn.Module,
    tokenizer,
    generator,
    prompts: list,
    max_new_tokens: int,
    baselines: list[str],
    assistant: nn.Module | None = None,
    progress: bool = True,
) -> list[TurnResult]:
    """Decode every turn of every prompt with the drafter and with each baseline (greedy)."""
    from tqdm import tqdm

    device = next(target.parameters()).device
    eos = tokenizer.eos_token_id
    gen_kw = dict(
        max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id
    )
    results: list[TurnResult] = []
    n_turns = sum(len(p.turns) for p in prompts)
    bar = tqdm(total=n_turns, desc="eval", unit="turn", disable=not progress)
    accepted, forwards = 0, 0
    for p in prompts:
        messages: list[dict[str, str]] = []
        for turn in p.turns:
            messages.append({"role": "user", "content": turn})
            ids = chat_ids(tokenizer, messages, device)
            n_prompt = ids.shape[1]
            ref, base_s = timed(target.generate, ids, attention_mask=torch.ones_like(ids), **gen_kw)
            out, spec_s = timed(generator.generate, ids, max_new_tokens=max_new_tokens, eos_token_id=eos)
            stats = generator.last_stats
            ref_new, out_new = ref[0, n_prompt:], out[0, n_prompt:]
            ref_new, out_new = (
                _trim(ref_new, tokenizer.pad_token_id, eos),
                _trim(out_new, tokenizer.pad_token_id, eos),
            )
            extra = {}
            for name in baselines:
                extra[name] = _run_baseline(name, target, ids, gen_kw, assistant)
            results.append(
                TurnResult(
                    prompt_id=str(p.id),
                    category=p.category or "all",
                    new_tokens=len(out_new),
                    spec_time_s=spec_s,
                    base_time_s=base_s,
                    target_forwards=stats.target_forwards,
                    accepted_lengths=list(stats.accepted_lengths),
                    identical=torch.equal(ref_new, out_new),
                    draft_time_s=stats.draft_time_s,
                    verify_time_s=stats.verify_time_s,
                    baselines=extra,
                )
            )
            accepted += sum(stats.accepted_lengths)
            forwards += len(stats.accepted_lengths)
            bar.set_postfix(tau=f"{accepted / max(forwards, 1):.2f}")
            bar.update(1)
            messages.append(
                {"role": "assistant", "content": tokenizer.decode(ref_new, skip_special_tokens=True)}
            )
    bar.close()
    return results


def _trim(tokens: torch.Tensor, pad: int | None, eos: int | None) -> torch.Tensor:
    """Cut a row at its first EOS (inclusive) and drop trailing padding."""
    t = tokens.tolist()
    if eos is not None and eos in t:
        t = t[: t.index(eos) + 1]
    elif pad is not None:
        while t and t[-1] == pad:
            t.pop()
    return torch.tensor(t, dtype=torch.long)


def _run_baseline(
    name: str, target: nn.Module, ids: torch.Tensor, gen_kw: dict, assistant
) -> dict[str, float]:
    """Time one transformers baseline and count its target forwards (τ = new tokens / decode forwards)."""
    kw = dict(gen_kw)
    if name == "pld":
        kw["prompt_lookup_num_tokens"] = 10
    elif name == "assisted":
        if assistant is None:
            raise UserError("eval baseline 'assisted' needs eval.assistant_model=PATH_OR_ID")
        kw["assistant_model"] = assistant
    else:
        raise UserError(f"unknown eval baseline {name!r}; use pld or assisted")
    counter = ForwardCounter(target)
    try:
        out, secs = timed(target.generate, ids, attention_mask=torch.ones_like(ids), **kw)
    finally:
        counter.close()
    new = out.shape[1] - ids.shape[1]
    return {"time_s": secs, "new_tokens": new, "target_forwards": counter.count}


def summarize(results: list[TurnResult], baselines: list[str]) -> dict[str, Any]:
    """Aggregate turns into the report's numbers (overall and per category)."""

    def agg(rs: list[TurnResult]) -> dict[str, Any]:
        steps = [a for r in rs for a in r.accepted_lengths]
        new = sum(r.new_tokens for r in rs)
        spec_s, base_s = sum(r.spec_time_s for r in rs), sum(r.base_time_s for r in rs)
        depth = max(steps, default=1)
        # per_position_acceptance[i]: fraction of decoding steps that accepted more than i+1
        # tokens, i.e. whose (i+1)-th drafted token was accepted.
        ppa = [sum(a > i + 1 for a in steps) / max(len(steps), 1) for i in range(depth - 1)]
        out = {
            "tau": sum(steps) / max(len(steps), 1),
            "per_position_acceptance": ppa,
            "tokens_per_s": new / spec_s if spec_s else 0.0,
            "baseline_tokens_per_s": new / base_s if base_s else 0.0,
            "speedup": base_s / spec_s if spec_s else 0.0,
            "greedy_identical": sum(r.identical for r in rs) / max(len(rs), 1),
            "num_turns": len(rs),
            "num_prompts": len({r.prompt_id for r in rs}),
            "num_new_tokens": new,
            "target_forwards": sum(r.target_forwards for r in rs),
            "accepted_length_histogram": {str(k): steps.count(k) for k in sorted(set(steps))},
            # where a decoding step's time goes: the drafter's proposal, and the target's verify
            # forward; against the baseline's ms per token they give the break-even τ
            "draft_ms_per_step": 1e3 * sum(r.draft_time_s for r in rs) / max(len(steps), 1),
            "verify_ms_per_step": 1e3 * sum(r.verify_time_s for r in rs) / max(len(steps), 1),
            "baseline_ms_per_token": 1e3 * base_s / new if new else 0.0,
        }
        for b in baselines:
            b_new = sum(r.baselines[b]["new_tokens"] for r in rs)
            b_s = sum(r.baselines[b]["time_s"] for r in rs)
            b_fw = sum(r.baselines[b]["target_forwards"] for r in rs)
            # the first forward of a generate call is the prefill, not a decoding step
            b_steps = b_fw - len(rs)
            out[b] = {
                "tau": b_new / max(b_steps, 1),
                "tokens_per_s": b_new / b_s if b_s else 0.0,
                "speedup": base_s / b_s if b_s else 0.0,
            }
        return out

    report = agg(results)
    cats = defaultdict(list)
    for r in results:
        cats[r.category].append(r)
    if len(cats) > 1:
        report["per_category"] = {c: agg(rs) for c, rs in sorted(cats.items())}
    return report


def environment(target: nn.Module, cfg: Config) -> dict[str, Any]:
    """Hardware, library versions and decode settings, recorded with every report."""
    import transformers

    from draftheads.conf import __version__

    device = next(target.parameters()).device
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import os

    return {
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "dtype": str(next(target.parameters()).dtype).replace("torch.", ""),
        "versions": {
            "draftheads": __version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "decode": {k: v for k, v in vars(cfg.decode).items()},
    }


def write_markdown(report: dict[str, Any], baselines: list[str], path: Path) -> None:
    """A Markdown table: overall row, then one row per category."""
    cols = ["τ", "tok/s", "baseline tok/s", "speedup", "greedy identical", "turns", "new tokens"]
    cols += ["draft ms/step", "verify ms/step", "baseline ms/token"]
    cols += [f"{b} τ" for b in baselines] + [f"{b} speedup" for b in baselines]
    lines = ["| set | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 1)]

    def row(name: str, r: dict[str, Any]) -> str:
        vals = [
            f"{r['tau']:.2f}",
            f"{r['tokens_per_s']:.1f}",
            f"{r['baseline_tokens_per_s']:.1f}",
            f"{r['speedup']:.2f}×",
            f"{r['greedy_identical']:.2f}",
            str(r["num_turns"]),
            str(r["num_new_tokens"]),
            f"{r['draft_ms_per_step']:.1f}",
            f"{r['verify_ms_per_step']:.1f}",
            f"{r['baseline_ms_per_token']:.1f}",
        ]
        vals += [f"{r[b]['tau']:.2f}" for b in baselines] + [f"{r[b]['speedup']:.2f}×" for b in baselines]
        return f"| {name} | " + " | ".join(vals) + " |"

    lines.append(row("**all**", report))
    for cat, r in report.get("per_category", {}).items():
        lines.append(row(cat, r))
    path.write_text("\n".join(lines) + "\n")


def write_plots(report: dict[str, Any], out: Path) -> list[Path]:
    """Accepted-length histogram, per-position acceptance, and τ/speedup per category (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    hist = report["accepted_length_histogram"]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.bar([int(k) for k in hist], list(hist.values()), color="#4472c4")
    ax.set(
        xlabel="tokens accepted per target forward",
        ylabel="steps",
        title=f"accepted length (τ = {report['tau']:.2f})",
    )
    fig.tight_layout()
    paths.append(out / "accepted_length_hist.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    ppa = report["per_position_acceptance"]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(range(1, len(ppa) + 1), ppa, marker="o")
    ax.set(xlabel="draft position", ylabel="acceptance rate", ylim=(0, 1), title="per-position acceptance")
    fig.tight_layout()
    paths.append(out / "per_position_acceptance.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    cats = report.get("per_category") or {"all": report}
    fig, ax = plt.subplots(figsize=(max(5, 0.7 * len(cats) + 2), 3.4))
    x = range(len(cats))
    ax.bar([i - 0.2 for i in x], [c["tau"] for c in cats.values()], width=0.4, label="τ")
    ax.bar([i + 0.2 for i in x], [c["speedup"] for c in cats.values()], width=0.4, label="speedup")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(list(x), list(cats), rotation=45, ha="right")
    ax.legend()
    ax.set_title("τ and speedup per category")
    fig.tight_layout()
    paths.append(out / "per_category.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def run_eval(
    cfg: Config, target=None, tokenizer=None, drafter=None, prompts: list | None = None
) -> dict[str, Any]:
    """Load what is not given, decode the prompt set, and write report.json/report.md/plots."""
    from draftheads.data.prompts import load_prompts
    from draftheads.decode import SpeculativeGenerator
    from draftheads.heads import Drafter, load_target

    if drafter is None and not cfg.heads:
        raise UserError("draftheads eval needs heads=DIR (a checkpoint directory or a hub id)")
    if target is None:
        target, tokenizer = load_target(cfg.target)
    if drafter is None:
        drafter = Drafter.from_pretrained(
            cfg.heads, target=target, tokenizer=tokenizer, revision=cfg.revision
        )
    drafter.to(next(target.parameters()).device).eval()
    if prompts is None:
        prompts = load_prompts(cfg.eval.prompts, max_prompts=cfg.eval.max_prompts, tokenizer=tokenizer)
    if not prompts:
        raise UserError(f"eval.prompts={cfg.eval.prompts} gave no prompts; check the path or name")
    baselines = list(cfg.eval.baselines or [])
    assistant = None
    if cfg.eval.assistant_model:
        from transformers import AutoModelForCausalLM

        assistant = AutoModelForCausalLM.from_pretrained(cfg.eval.assistant_model).to(
            next(target.parameters()).device
        )
        baselines.append("assisted") if "assisted" not in baselines else None
    generator = SpeculativeGenerator(target, drafter, tokenizer=tokenizer, config=cfg.decode)
    for _ in range(cfg.eval.warmup):  # first calls pay one-off allocation costs
        ids = chat_ids(tokenizer, [{"role": "user", "content": "Hello"}], next(target.parameters()).device)
        target.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=8,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
        generator.generate(ids, max_new_tokens=8)
    with torch.inference_mode():
        results = evaluate_prompts(
            target, tokenizer, generator, prompts, cfg.decode.max_new_tokens, baselines, assistant
        )
    report = summarize(results, baselines)
    report.update(
        prompts=cfg.eval.prompts,
        heads=str(cfg.heads or ""),
        drafter=drafter.kind,
        environment=environment(target, cfg),
    )
    out = Path(cfg.eval.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "turns.jsonl").write_text("".join(json.dumps(vars(r)) + "\n" for r in results))
    write_markdown(report, baselines, out / "report.md")
    write_plots(report, out)
    return report


def main(cfg: Config) -> None:
    report = run_eval(cfg)
    line = (
        f"τ {report['tau']:.2f}  speedup {report['speedup']:.2f}×  "
        f"({report['tokens_per_s']:.1f} vs {report['baseline_tokens_per_s']:.1f} tok/s)  "
        f"greedy identical {report['greedy_identical']:.2f}  on {report['num_turns']} turns"
    )
    for b in cfg.eval.baselines or []:
        line += f"  | {b}: τ {report[b]['tau']:.2f} speedup {report[b]['speedup']:.2f}×"
    print(line)
    print(f"report: {Path(cfg.eval.output_dir) / 'report.json'}")
