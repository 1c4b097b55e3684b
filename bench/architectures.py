"""The architecture matrix: every drafter kind on a tiny random target of every tested architecture.

For one architecture (``target.tiny=NAME``, :mod:`draftheads.conf.schema.tiny`) and one draft
config group (``conf/draft/*.yaml``), :func:`run_cell`:

1. trains the drafter 2 steps through the training recipe on synthetic rows;
2. loads it back and decodes greedily with a chain and with the kind's tree (dynamic trees (Li et
   al., 2024), DDTree for a block drafter, a static tree for heads that index one by depth), each
   compared token for token with the target's own ``generate``, on prompts that run past the tiny
   configs' 8-token windows;
3. exports it in every format (vLLM, SGLang, speculators): an export passes the engine's loader
   rules (:func:`~draftheads.heads.export.export_drafter` validates it), a speculators export is
   read back and must draft what the drafter drafts. A format the kind does not have is refused
   in one line, and recorded with that line.

``python -m draftheads.bench.architectures`` runs the whole matrix and writes
``docs/architectures.md`` from its results (``--arch`` for some rows only, ``--out`` elsewhere);
the tests run each architecture's row and check that the page says the same.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch

from draftheads.conf.errors import UserError
from draftheads.conf.schema.kinds import BUILTIN_KINDS

# one cell's outcome in the page: works, refused by design (a format the kind lacks), fails
OK, NOT_OFFERED, FAIL = "✔", "—", "✘"
FORMATS = ("vllm", "sglang", "speculators")
PROMPTS = ("Hello, my name is", "1 2 3 4 5 6 7 8 9 10 11")
NEW_TOKENS = 12
DOC = Path(__file__).resolve().parents[1] / "docs" / "architectures.md"
# per draft group: what keeps the tiny run small (the defaults are sized for real targets), from the kinds' records
SMALL = {group: list(o) for kind in BUILTIN_KINDS for group, o in kind.small.items()}


def draft_groups() -> list[str]:
    """The draft config groups the CLI offers (``draft=NAME``), in name order."""
    folder = Path(__file__).resolve().parents[1] / "conf" / "draft"
    return sorted(p.stem for p in folder.glob("*.yaml"))


def architectures() -> list[str]:
    """The tiny architectures, GPT-2 aside (a matrix row per decoder family the tests cover)."""
    from draftheads.conf.schema.tiny import TINY_CONFIGS

    return [name for name in TINY_CONFIGS if name != "gpt2"]


@dataclass
class Cell:
    """One architecture x draft group: what trained, decoded identically and exported."""

    arch: str
    draft: str
    train: str = FAIL
    chain: str = FAIL
    tree: str = FAIL
    formats: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def all_ok(self) -> bool:
        """Trained, greedy-identical both ways, and every format it offers exported."""
        ok = self.train == self.chain == self.tree == OK
        return ok and all(v in (OK, NOT_OFFERED) for v in self.formats.values())


def synthetic_rows(n: int = 12):
    """``n`` rows: a 4-token prompt, then a repeated 3-token pattern as the trained answer."""
    import datasets

    g = torch.Generator().manual_seed(0)
    ids, mask = [], []
    for i in range(n):
        prompt = torch.randint(0, 2000, (4,), generator=g).tolist()
        pattern = torch.randint(0, 2000, (3,), generator=g).tolist()
        answer = (pattern * 7)[: 16 + i % 5]
        ids.append(prompt + answer)
        mask.append([0] * 4 + [1] * len(answer))
    return datasets.Dataset.from_dict({"input_ids": ids, "loss_mask": mask})


def train_config(arch: str, draft: str, out: Path):
    """The training config of one cell: 2 steps of ``draft=draft`` on ``target.tiny=arch`` into
    ``out`` (composed once per draft config; the architecture is the tiny target's name)."""
    from draftheads.bench.stages import compose

    cfg = compose(
        [
            "target=tiny-llama",
            f"draft={draft}",
            *SMALL.get(draft, []),
            "train.max_steps=2",
            "train.warmup_steps=0",
            "train.eval_every=0",
            "train.save_every=0",
            "train.progress=false",
        ]
    )
    cfg.target.tiny, cfg.target.name_or_path = arch, f"tiny-{arch}"  # as target.tiny=arch names it
    cfg.train.output_dir = str(out)
    return cfg


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


# target -> prompt -> its greedy continuation (weakly held: a target that goes frees its entries)
_REFERENCES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def reference(target, tok, prompt: str) -> list[int]:
    """The target's own greedy continuation of ``prompt`` (transformers' ``generate``), once per target."""
    seen = _REFERENCES.setdefault(target, {})
    if prompt not in seen:
        ids = tok(prompt, return_tensors="pt").input_ids
        ref = target.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False
        )
        seen[prompt] = ref[0, ids.shape[1] :].tolist()
    return seen[prompt]


def greedy_identical(target, tok, drafter, tree: str) -> bool:
    """Whether the speculative decoder's greedy output with ``tree`` is the target's, per prompt:
    in one left-padded batch, or one call per prompt on a target decoded a row at a time
    (recurrent layers)."""
    from draftheads.conf.schema.decode import DecodeConfig
    from draftheads.decode import SpeculativeGenerator

    cfg = DecodeConfig(tree=tree, backend="eager", cost_aware=False, lookup=False)
    gen = SpeculativeGenerator(target, drafter, tok, cfg)
    batches = [list(PROMPTS)] if not gen.recurrent else [[p] for p in PROMPTS]
    for prompts in batches:
        enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left")
        out = gen.generate(enc.input_ids, enc.attention_mask, max_new_tokens=NEW_TOKENS)
        P = enc.input_ids.shape[1]
        for i, prompt in enumerate(prompts):
            want = reference(target, tok, prompt)
            if out[i, P : P + len(want)].tolist() != want:
                return False
    return True


def same_weights(a, b) -> bool:
    """Whether an export read back (``a``) is its source (``b``): the same tensors under the same
    names and, where the kind has them, the same layer sizes and rope."""
    sa, sb = a.state_dict(), b.state_dict()
    same = sa.keys() == sb.keys() and all(torch.equal(sa[k].to(sb[k].dtype), sb[k]) for k in sa)
    layers = getattr(a, "layer_config_dict", None)
    return same and (layers is None or layers() == b.layer_config_dict())


_TARGETS: dict[str, tuple] = {}


def tiny_target(arch: str, fresh: bool = False) -> tuple:
    """(model, tokenizer) of ``target.tiny=arch`` as the recipe loads it: shared within the process,
    or ``fresh``, a copy of its own (for a drafter that changes its target: an objective that puts LoRA
    adapters on it)."""
    from draftheads.conf.schema.heads import TargetConfig
    from draftheads.heads.target.load import load_target

    if fresh:
        return load_target(TargetConfig(name_or_path=f"tiny-{arch}", tiny=arch))
    if arch not in _TARGETS:
        _TARGETS[arch] = tiny_target(arch, fresh=True)
    return _TARGETS[arch]


def adapted(model: torch.nn.Module) -> bool:
    """Whether peft has put adapter layers into ``model`` (in place, as an objective that puts LoRA
    adapters on the target does). Read from the modules, not ``peft_config`` (what
    :func:`~draftheads.heads.checkpoint.attach_adapters` checks): an injection that peft refuses
    part-way (fused experts with LoRA dropout) leaves LoRA layers in the model and no
    ``peft_config``."""
    return any(type(m).__module__.startswith("peft.") for m in model.modules())


def run_cell(arch: str, draft: str, work: Path) -> Cell:
    """Train, decode and export one draft group on one tiny architecture (module docstring)."""
    from draftheads.heads import Drafter
    from draftheads.heads.checkpoint import read_config
    from draftheads.heads.export import export_drafter
    from draftheads.train.recipe import train

    cell = Cell(arch, draft)
    out = work / f"{arch}-{draft}"
    target, tok = tiny_target(arch)
    try:
        # trained on the shared target, as the recipe would load it (no second load per cell)
        train(train_config(arch, draft, out / "train"), synthetic_rows(), target=(target, tok))
        cell.train = OK
    except (UserError, RuntimeError, ValueError, TypeError, IndexError, AttributeError) as e:
        cell.notes["train"] = one_line(e)
        return cell
    finally:
        if adapted(target):  # its objective put adapters on the shared target: load it again next time
            _TARGETS.pop(arch, None)
    if read_config(out / "train").get("requires_adapters"):  # its adapters go onto a target of their own
        target, tok = tiny_target(arch, fresh=True)
    drafter = Drafter.from_pretrained(out / "train", target=target, tokenizer=tok)
    for name, tree in (("chain", "chain2"), ("tree", "auto")):
        try:
            setattr(cell, name, OK if greedy_identical(target, tok, drafter, tree) else FAIL)
        except UserError as e:  # refused in one line: the decoder does not serve this target
            setattr(cell, name, NOT_OFFERED)
            cell.notes[name] = str(e)
        except (RuntimeError, ValueError, TypeError, IndexError, AttributeError) as e:
            cell.notes[name] = one_line(e)
    for fmt in FORMATS:
        try:
            where = export_drafter(drafter, fmt, out / fmt)
            if fmt == "speculators":
                back = Drafter.from_pretrained(where, target=target, tokenizer=tok)
                if not same_weights(back, drafter):
                    raise ValueError("the speculators export reads back as another drafter")
            cell.formats[fmt] = OK
        except UserError as e:
            cell.formats[fmt] = NOT_OFFERED
            cell.notes[fmt] = str(e)
        except (RuntimeError, ValueError, TypeError, KeyError, AttributeError) as e:
            cell.formats[fmt] = FAIL
            cell.notes[fmt] = one_line(e)
    return cell


def row(arch: str, work: Path, drafts: list[str] | None = None) -> list[Cell]:
    return [run_cell(arch, d, work) for d in (drafts or draft_groups())]


def mark(cell: Cell) -> str:
    """A cell of the page: train / chain / tree, then the formats it exported."""
    steps = "".join(v for v in (cell.train, cell.chain, cell.tree))
    exported = [f for f in FORMATS if cell.formats.get(f) == OK]
    failed = [f for f in FORMATS if cell.formats.get(f) == FAIL]
    text = f"{steps} {'+'.join(exported) or 'no export'}"
    return text + (f" ✘{'+'.join(failed)}" if failed else "")


def page(cells: list[Cell], seconds: float) -> str:
    """``docs/architectures.md`` from the matrix's cells."""
    drafts = sorted({c.draft for c in cells})
    archs = list(dict.fromkeys(c.arch for c in cells))
    by = {(c.arch, c.draft): c for c in cells}
    lines = [
        "# Architectures",
        "",
        "Written by `python -m draftheads.bench.architectures` from its own run (do not edit by hand);",
        "`tests/test_architectures.py` runs each row again and checks it against this page.",
        "",
        "Each row is a tiny random target of that transformers architecture (`target.tiny=NAME`: 4 layers,",
        "width 64, sliding windows and chunks of 8 tokens, 4 experts; `conf/schema/tiny.py`). Each column is",
        "a draft config (`draft=NAME`). A cell reads: trained 2 steps, greedy-identical with a chain,",
        "greedy-identical with the kind's tree (✔, ✘, or — where the decoder refuses the target in one",
        "line), then the formats exported and passing the engine's loader rules (a speculators export is",
        "also read back as the same drafter). A format missing from a cell is one the kind does not",
        "offer; each refusal is listed below the table.",
        "",
        "| architecture | " + " | ".join(drafts) + " |",
        "|---|" + "---|" * len(drafts),
    ]
    for arch in archs:
        lines.append(
            f"| {arch} | " + " | ".join(mark(by[(arch, d)]) if (arch, d) in by else "" for d in drafts) + " |"
        )
    full = {d: sum(by[(a, d)].all_ok for a in archs if (a, d) in by) for d in drafts}
    lines += ["", "Architectures on which a draft config is ✔ throughout: "]
    lines[-1] += ", ".join(f"{d} {n}/{len(archs)}" for d, n in full.items()) + "."
    refusals: dict[str, str] = {}
    problems = []
    for c in cells:
        for step, note in c.notes.items():
            if step in FORMATS and c.formats.get(step) == NOT_OFFERED:
                refusals.setdefault(f"{c.draft} as {step}", note)
            elif step in ("chain", "tree") and getattr(c, step) == NOT_OFFERED:
                refusals.setdefault(f"decoding on {c.arch}", note)
            else:
                problems.append(f"- {c.arch}, {c.draft}, {step}: {note}")
    lines += ["", "## What is refused, in one line each", ""]
    lines += [f"- {k}: {v}" for k, v in sorted(refusals.items())]
    if problems:
        lines += ["", "## Failures", "", *problems]
    lines += [
        "",
        f"The whole matrix ran in {seconds / 60:.1f} minutes on this project's 2-core CPU machine.",
        "",
    ]
    return "\n".join(lines)


def cells_of(page_text: str) -> dict[tuple[str, str], str]:
    """The page's table as {(architecture, draft): cell text}: what the tests compare a row with."""
    rows = [line for line in page_text.splitlines() if line.startswith("| ") and not line.startswith("|---")]
    header = [h.strip() for h in rows[0].strip("|").split("|")]
    out: dict[tuple[str, str], str] = {}
    for line in rows[1:]:
        values = [v.strip() for v in line.strip("|").split("|")]
        out.update({(values[0], d): v for d, v in zip(header[1:], values[1:])})
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", nargs="*", help="rows to run (default: all)")
    parser.add_argument("--out", default=str(DOC), help="the page to write")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    cells: list[Cell] = []
    with tempfile.TemporaryDirectory(prefix="draftheads-arch-") as tmp:
        for arch in args.arch or architectures():
            cells += row(arch, Path(tmp))
            print(arch, " ".join(f"{c.draft}:{mark(c)}" for c in cells if c.arch == arch), flush=True)
    Path(args.out).write_text(page(cells, time.perf_counter() - t0))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
