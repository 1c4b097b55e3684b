"""Distillation through a serving engine: an OpenAI-compatible server answers the prompts.

``data.distill.endpoint=http://HOST:PORT/v1`` sends each conversation to the server's
``/chat/completions`` (vLLM, SGLang, TGI, ``transformers serve``) instead of generating
in-process; :func:`draftheads.data.distill.run.distill` writes the answers into the same resumable
shards. Only the standard library speaks HTTP here.

**Same prompt tokens.** A request carries the conversation's messages, the very messages that
in-process distillation renders with the target's chat template
(:func:`~draftheads.data.chat.generation_prompt`). A server renders them with the served
model's own template and the generation prompt, and tokenizes the text without adding special
tokens, which is the in-process prompt token for token. ``/completions`` with the rendered text
would not be: servers tokenize a text prompt *with* special tokens by default, which puts a
second BOS before templates that write their own (Llama 3, Mistral). A server that returns the
prompt's ids (vLLM's ``return_token_ids``) has them compared with the target's at the probe.

**Token ids.** Where the server returns the answer's ids (``return_token_ids``), a row keeps
them (cut before the first end-of-sequence id, as in-process); elsewhere the answer text is
re-tokenized, and the row's ``gen.answer_ids`` says which (``server`` or ``text``).

**Sampling.** ``temperature`` and ``top_p`` go in the request, with a seed per row and turn;
no top-k cut, as in-process, where the server takes a field for it (:func:`dialects`).

**The served model** is checked before anything is written: ``data.distill.model`` must be
among ``/models`` (left unset, the server's only model, or the one named like the target), and a
short greedy answer to :data:`PROBE` must equal the in-process target's token for token.

**Failures.** A request that cannot reach the server, times out or gets a 408/429/5xx is tried
``retries`` more times with doubling pauses, then the run stops with one line
(:class:`EndpointError`); any other refusal (4xx) stops it at once. Completed shards stay.
"""

from __future__ import annotations

import http.client
import json
import re
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from draftheads.conf.errors import UserError
from draftheads.conf.schema.data import DistillConfig
from draftheads.data.chat import generation_prompt
from draftheads.data.prompts import PromptRow

PROBE = "Name three colours of the rainbow."
PROBE_TOKENS = 8
GREEDY = {"temperature": 0.0}
RETRY_STATUS = (408, 429, 500, 502, 503, 504)
BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
# (prompt ids, new tokens) -> the in-process target's greedy answer ids
GreedyFn = Callable[[list[int], int], list[int]]


class Sampling(Protocol):
    """The generation settings a request carries (:class:`draftheads.data.distill.generate.GenParams`)."""

    max_new_tokens: int
    temperature: float
    top_p: float


class EndpointError(Exception):
    """A request that failed for good: ``code`` is the HTTP status, or None when nothing answered."""

    def __init__(self, url: str, reason: str, code: int | None = None, tries: int = 1) -> None:
        self.url, self.reason, self.code, self.tries = url, reason, code, tries
        answered = f"answered HTTP {code}: {reason}" if code is not None else f"did not answer ({reason})"
        again = f" after {tries} tries" if tries > 1 else ""
        super().__init__(" ".join(f"the server at {url} {answered}{again}".split()))


class Unanswered(Exception):
    """One try that may succeed when repeated: no connection, a timeout, a busy or failing server."""


@dataclass(frozen=True)
class Reply:
    """One chat completion: the answer text, why it ended, and what the server says it generated."""

    text: str
    finish: str
    ids: list[int] | None  # the answer's token ids, where the server returns them
    prompt_ids: list[int] | None  # the prompt's token ids, where the server returns them
    tokens: int | None  # ``usage.completion_tokens``


def why(error: BaseException) -> str:
    """A short reason for a failed connection: ``connection refused``, ``timed out``..."""
    reason = getattr(error, "reason", error)
    text = getattr(reason, "strerror", None) or str(reason) or type(reason).__name__
    return " ".join(text.lower().split())[:160]


def server_detail(error: urllib.error.HTTPError) -> str:
    """The server's own words for an HTTP error (its JSON ``detail``/``message``, else the body)."""
    try:
        body = error.read().decode("utf-8", "replace")
    except OSError:
        return error.reason or ""
    try:
        data = json.loads(body)
        err = data.get("error") if isinstance(data.get("error"), dict) else data
        body = str(err.get("detail") or err.get("message") or body)
    except (json.JSONDecodeError, AttributeError):
        pass
    return excerpt(body)


def excerpt(body: str, most: int = 120) -> str:
    """A short excerpt of a response body for an error line: an HTML page (a proxy's or a web
    UI's) by its title, or its text without tags; anything else cut to ``most`` characters."""
    if re.search(r"<(!doctype|html|head|body)\b", body[:500], re.I):
        title = re.search(r"<title[^>]*>(.*?)</title>", body, re.I | re.S)
        text = (
            title.group(1)
            if title
            else re.sub(r"<(script|style)\b.*?</\1>|<[^>]+>", " ", body, flags=re.I | re.S)
        )
        words = " ".join(text.split())
        return f"an HTML page {words[:most] + ('...' if len(words) > most else '')!r}"
    words = " ".join(body.split())
    return words[:most] + ("..." if len(words) > most else "")


@dataclass
class Endpoint:
    """An OpenAI-compatible server at ``url`` (ending in ``/v1``)."""

    url: str
    timeout_s: float = 600.0
    retries: int = 3

    def once(self, path: str, body: dict | None) -> dict:
        """One request; :class:`Unanswered` when a retry may help, :class:`EndpointError` when not."""
        data = None if body is None else json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json"} if data is not None else {}
        request = urllib.request.Request(self.url + path, data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as e:
            if e.code in RETRY_STATUS:
                raise Unanswered(f"HTTP {e.code}: {server_detail(e)}") from None
            raise EndpointError(self.url, f"{server_detail(e)} (at {path})", e.code) from None
        except TimeoutError:
            raise Unanswered(f"no answer within data.distill.timeout_s={self.timeout_s:g}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            raise Unanswered(why(e)) from None
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            got = excerpt(raw[:100_000].decode("utf-8", "replace"))
            raise EndpointError(
                self.url, f"not JSON at {path} ({got}); is it an OpenAI-compatible /v1 URL?", 200
            ) from None

    def call(self, path: str, body: dict | None = None, retries: int | None = None) -> dict:
        """A request tried ``retries`` more times, pausing 0.5 s, 1 s, 2 s... between tries."""
        tries = 1 + (self.retries if retries is None else retries)
        for attempt in range(tries):
            try:
                return self.once(path, body)
            except Unanswered as e:
                last = str(e)
                if attempt + 1 < tries:
                    time.sleep(min(BACKOFF_S * 2**attempt, MAX_BACKOFF_S))
        raise EndpointError(self.url, last, tries=tries)

    def models(self) -> list[str]:
        """The served model names (``GET /models``), asked once."""
        data = self.call("/models", retries=0).get("data")
        if not isinstance(data, list) or not all(isinstance(m, dict) and "id" in m for m in data):
            raise EndpointError(
                self.url, "no model list at /models; is it an OpenAI-compatible /v1 URL?", 200
            )
        return [str(m["id"]) for m in data]

    def chat(self, model: str, messages: list[dict], max_tokens: int, sampling: dict, extras: dict) -> Reply:
        """One chat completion of ``messages``; ``extras`` are the server's own fields (:func:`dialects`)."""
        body = {"model": model, "messages": messages, "max_tokens": max_tokens, **sampling, **extras}
        return parse_reply(self.url, self.call("/chat/completions", body))


def parse_reply(url: str, out: dict) -> Reply:
    """The first choice of a chat completion; a reply without one is an :class:`EndpointError`."""
    try:
        choice = out["choices"][0]
        text = choice["message"].get("content") or ""
    except (KeyError, IndexError, TypeError, AttributeError):
        raise EndpointError(
            url, f"a chat completion without choices[0].message: {str(out)[:120]}", 200
        ) from None
    usage = out.get("usage") if isinstance(out.get("usage"), dict) else {}
    ids, prompt_ids = choice.get("token_ids"), out.get("prompt_token_ids")
    return Reply(
        text=text,
        finish=str(choice.get("finish_reason") or ""),
        ids=list(ids) if isinstance(ids, list) else None,
        prompt_ids=list(prompt_ids) if isinstance(prompt_ids, list) else None,
        tokens=usage.get("completion_tokens") if isinstance(usage.get("completion_tokens"), int) else None,
    )


def turn_end(finish: str, tokens: int, max_new_tokens: int) -> str:
    """How a served answer ended, in ``finish``'s words: ``stop`` (end of turn), ``length``
    (``max_new_tokens`` reached), or ``server-<reason>``: cut off by the server before that,
    e.g. ``server-length`` when it reached its own context limit (not a finished turn)."""
    if finish == "stop":
        return "stop"
    if finish == "length" and tokens >= max_new_tokens:
        return "length"
    return f"server-{finish or 'none'}"


def until_stop(ids: list[int], stops: list[int]) -> list[int]:
    """``ids`` up to (without) the first end-of-sequence id, as in-process rows are cut."""
    cut = next((j for j, t in enumerate(ids) if t in stops), None)
    return ids if cut is None else ids[:cut]


def pick_model(url: str, asked: str | None, served: list[str], target: str) -> str:
    """The served model to ask: ``asked`` when served; unset, the only one or the target's name."""
    names = ", ".join(served[:5]) + (", ..." if len(served) > 5 else "")
    if not served:
        raise UserError(f"{url} serves no model; start the server with the target model")
    if asked is not None and asked not in served:
        raise UserError(
            f"data.distill.model={asked} is not served at {url} (it serves {names}); use one of those"
        )
    if asked is not None:
        return asked
    if len(served) == 1:
        return served[0]
    if target in served:
        return target
    raise UserError(
        f"{url} serves {len(served)} models ({names}); name the target's with data.distill.model=NAME"
    )


def dialects(sampling: bool) -> list[dict]:
    """Request fields beyond the OpenAI API, tried in this order at the probe (the first a
    server accepts is used): vLLM's and SGLang's (the answer's token ids; no top-k cut when
    sampling, as in-process), ``transformers serve``'s (which refuses unknown fields, and samples
    only when a generation config says so, whatever the temperature), then none."""
    served = {"return_token_ids": True, **({"top_k": -1} if sampling else {})}
    hf = [{"generation_config": json.dumps({"do_sample": True, "top_k": 0})}] if sampling else []
    return [served, *hf, {}]


@dataclass(frozen=True)
class Served:
    """A checked server: the model to ask, the extra fields it takes, whether it returns ids."""

    endpoint: Endpoint
    model: str
    extras: dict
    token_ids: bool

    def meta(self) -> dict:
        """What each row's ``gen`` adds: where its answers came from."""
        return {
            "endpoint": self.endpoint.url,
            "served_model": self.model,
            "answer_ids": "server" if self.token_ids else "text",
        }


def probe(endpoint: Endpoint, model: str, messages: list[dict], sampling: bool) -> tuple[Reply, dict]:
    """A greedy :data:`PROBE_TOKENS`-token answer, and the first of :func:`dialects` the server
    takes: one it refuses with a 4xx (``transformers serve`` answers 422) is dropped for the next."""
    *fancy, plain = dialects(sampling)
    for extras in fancy:
        try:
            return endpoint.chat(model, messages, PROBE_TOKENS, GREEDY, extras), extras
        except EndpointError as e:
            if e.code is None or not 400 <= e.code < 500:
                raise
    return endpoint.chat(model, messages, PROBE_TOKENS, GREEDY, plain), plain


def connect(cfg: DistillConfig, tokenizer, greedy: GreedyFn, target: str, stops: list[int]) -> Served:
    """Check the server before anything is written: it answers, it serves ``cfg.model``, and
    its greedy answer to :data:`PROBE` is the target's (``greedy``: the in-process target)."""
    url = str(cfg.endpoint).strip().rstrip("/")
    endpoint = Endpoint(url, cfg.timeout_s, cfg.retries)
    try:
        model = pick_model(url, cfg.model, endpoint.models(), target)
        messages = [{"role": "user", "content": PROBE}]
        reply, extras = probe(endpoint, model, messages, cfg.temperature > 0)
    except EndpointError as e:
        if e.code is None:
            raise UserError(
                f"cannot reach data.distill.endpoint={url} ({e.reason}); start the server there or fix the "
                "URL (http://HOST:PORT/v1)"
            ) from None
        raise UserError(
            f"{e}; give data.distill.endpoint the server's OpenAI-compatible URL, ending in /v1"
        ) from None
    prompt = tokenizer(generation_prompt(tokenizer, messages), add_special_tokens=False)["input_ids"]
    if reply.prompt_ids is not None and reply.prompt_ids != prompt:
        raise UserError(
            f"the server at {url} renders the chat differently from target {target}'s template (a {len(reply.prompt_ids)}"
            f"-token prompt against {len(prompt)}); serve the model with its own chat template"
        )
    mine = until_stop(greedy(prompt, PROBE_TOKENS), stops)
    theirs = until_stop(reply.ids, stops) if reply.ids is not None else None
    if not same_answer(tokenizer, mine, theirs, reply.text):
        raise UserError(
            f"the model served at {url} as {model!r} is not target {target}: its greedy answer to a probe is "
            f"{reply.text[:60]!r}, the target's {tokenizer.decode(mine, skip_special_tokens=True)[:60]!r}; "
            "serve the target there, or set target= to the served model"
        )
    return Served(endpoint, model, extras, reply.ids is not None)


def same_answer(tokenizer, mine: list[int], ids: list[int] | None, text: str) -> bool:
    """Whether a served answer is the target's: the same ids, or without ids the same text."""
    if ids is not None:
        return ids == mine
    return text == tokenizer.decode(mine, skip_special_tokens=True)


def request_sampling(temperature: float, top_p: float, seed: int, row_id: str, turn: int) -> dict:
    """The request's sampling fields: ``temperature 0`` (greedy), or the temperature, top-p and
    a seed of the row and turn (the same on a rerun, whatever else was answered before)."""
    if temperature <= 0:
        return GREEDY
    return {
        "temperature": temperature,
        "top_p": top_p,
        "seed": zlib.crc32(f"{seed}/{row_id}/{turn}".encode()),
    }


@dataclass
class RowJob:
    """What answering one conversation through the server needs, shared by every row of a run."""

    served: Served
    tokenizer: object
    params: Sampling  # the run's max_new_tokens, temperature and top_p
    seed: int
    limit: int | None
    stops: list[int]
    lock: threading.Lock = field(default_factory=threading.Lock)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, one thread at a time (a fast tokenizer is not re-entrant)."""
        with self.lock:
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        with self.lock:
            return self.tokenizer.decode(ids, skip_special_tokens=True)

    def too_long(self, chat: list[dict]) -> bool:
        """Whether ``chat``'s prompt plus ``max_new_tokens`` passes the target's positions."""
        prompt = self.encode(generation_prompt(self.tokenizer, chat))
        return self.limit is not None and len(prompt) + self.params.max_new_tokens > self.limit

    def answer(self, row: PromptRow) -> tuple[dict, int]:
        """``row``'s user turns answered in order, as :func:`~draftheads.data.distill.answers.answer_batch`
        answers them: a turn past ``limit`` positions ends the chat ("context"), a cut-off answer
        is ``unfinished``, and an answer the server cut short (``server-*``) ends the chat too."""
        chat: list[dict] = []
        finish: list[str] = []
        answer_ids: list[list[int]] = []
        for t, user in enumerate(row.turns):
            turn = [*chat, {"role": "user", "content": user}]
            if self.limit is not None and self.too_long(turn):
                finish.append("context")
                break
            sampling = request_sampling(self.params.temperature, self.params.top_p, self.seed, row.id, t)
            reply = self.served.endpoint.chat(
                self.served.model, turn, self.params.max_new_tokens, sampling, self.served.extras
            )
            ids = until_stop(reply.ids, self.stops) if reply.ids is not None else self.encode(reply.text)
            text = self.decode(ids) if reply.ids is not None else reply.text
            end = turn_end(
                reply.finish,
                reply.tokens if reply.tokens is not None else len(ids),
                self.params.max_new_tokens,
            )
            chat = [*turn, {"role": "assistant", "content": text, "unfinished": end != "stop"}]
            finish.append(end)
            answer_ids.append(ids)
            if end.startswith("server-"):
                break
        row_out = {
            "id": row.id,
            "category": row.category,
            "messages": chat,
            "finish": finish,
            "answer_ids": answer_ids,
        }
        return row_out, sum(map(len, answer_ids))


def answered(
    job: RowJob, pending: list[tuple[int, list[PromptRow]]], concurrency: int
) -> Iterator[tuple[int, list[dict], int]]:
    """``(batch, rows, new tokens)`` for each pending batch, in order, with up to ``concurrency``
    requests in flight across batches; a failed row raises its :class:`EndpointError` when its
    batch comes up, and the requests not yet sent are dropped."""
    pool = ThreadPoolExecutor(concurrency, thread_name_prefix="distill-endpoint")
    try:
        futures = [(b, [pool.submit(job.answer, row) for row in rows]) for b, rows in pending]
        for b, batch in futures:
            done = [f.result() for f in batch]
            yield b, [row for row, _ in done], sum(n for _, n in done)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def report_cut_short(rows: list[dict], most: int = 5) -> int:
    """Say on stderr which answers the server cut off before ``max_new_tokens`` (a ``server-*``
    finish: kept, marked unfinished, their chats ended there); return how many there are."""
    cut = [(r["id"], f) for r in rows for f in r.get("finish", []) if str(f).startswith("server-")]
    if cut:
        named = ", ".join(f"{rid} ({f})" for rid, f in cut[:most]) + (", ..." if len(cut) > most else "")
        print(
            f"distill: {len(cut)} answers were cut off by the server before data.distill.max_new_tokens "
            f"(kept, marked unfinished, their chats end there): {named}; raise the server's context "
            "limit (vLLM --max-model-len) to answer them in full",
            file=sys.stderr,
        )
    return len(cut)
